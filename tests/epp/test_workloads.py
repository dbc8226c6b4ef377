"""The seed experiment and bursts through a real Envoy (full duplex) with ``burstsched epp`` as its picker,
both child processes, in front of simulated replicas: what ``burstsched demo --via envoy`` and
``loadtests/epp_burst.py`` run, at a small size."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from burstsched.cli import build_parser
from burstsched.workloads.burst import BurstSpec
from burstsched.workloads.demo import run_demo
from burstsched.workloads.gateway import gateway_process
from burstsched.workloads.pools import open_pool
from burstsched.workloads.seed import summarize
from loadtests.epp_burst import run_bursts

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(150)]


async def test_demo_via_envoy_returns_every_follow_up_and_spreads_first_requests(envoy_path: Path) -> None:
    """``burstsched demo --via envoy`` with the recommended config: every follow-up goes back to the replica
    that computed its context, and the new contexts are spread over both replicas (none hot-spotted)."""
    argv = ["demo", "--via", "envoy", "--rounds", "1", "--pairs", "4", "--time-scale", "0.02"]
    argv += ["--policies", "default", "--config-dir", str(REPO / "config"), "--context-tokens", "3000"]
    args = build_parser("demo").parse_args(argv)
    with anyio.fail_after(120):
        records = await run_demo(args)
    summary = summarize("default", records["default"])
    assert summary.returned == summary.pairs == 4
    assert summary.hit_rate > 0.9
    assert sorted(summary.first_requests_per_replica.values()) == [2, 2], summary.first_requests_per_replica


async def test_bursts_of_8_through_envoy_compute_their_prefix_once(envoy_path: Path) -> None:
    """Three bursts of 8 sharing a new 3000-token prefix each, through Envoy + the picker on 4 replicas: each
    burst lands on one replica, which computes its prefix once (≤ 1.25× the prefix's tokens)."""
    spec = BurstSpec(k=8, prefix_tokens=3000, max_tokens=4)
    with anyio.fail_after(120):
        async with (
            open_pool("sim", 4, time_scale=0.02) as pool,
            httpx.AsyncClient(timeout=60) as client,
            gateway_process(
                REPO / "config" / "burst.yaml", pool.endpoints, extra_args=pool.router_args
            ) as url,
        ):
            rows = await run_bursts(client, url, pool, spec, 3, "test")
    assert [row["failed"] for row in rows] == [0, 0, 0]
    assert [row["replicas_per_burst"] for row in rows] == [[1], [1], [1]], rows
    assert all(1.0 <= row["compute_ratio"] <= 1.25 for row in rows), [r["compute_ratio"] for r in rows]
