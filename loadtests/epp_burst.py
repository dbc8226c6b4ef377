"""Bursts of K requests sharing a new prefix through a real Envoy with ``burstsched epp`` as its picker.

    python loadtests/epp_burst.py [--backend sim|vllm] [--replicas 4] [--k 8] [--bursts 10]
                                  [--via envoy,serve] [--configs burst] [--replica-cpu-quota C] [--json PATH]

Per router (``envoy``: Envoy in full-duplex ext_proc mode in front of ``burstsched epp``; ``serve``:
``burstsched serve``, for comparison) and config, one router for all bursts: ``--bursts`` bursts one after
the other, each of K requests sharing a fresh prefix (workloads.md §2), sent at the same moment. Per burst
the prefix computations (Σ prompt tokens computed ÷ prefix tokens, from each response's usage) and the
replicas that served it; per router the largest and median ratio, the bursts kept on one replica, failures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx

from burstsched.workloads.burst import BurstOutcome, BurstSpec, build_prompts, fire_burst
from burstsched.workloads.gateway import gateway_process
from burstsched.workloads.pools import PoolHandle, open_pool
from burstsched.workloads.router_process import router_process


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sim", "vllm"), default="sim")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--k", type=int, default=8, help="requests per burst")
    parser.add_argument("--bursts", type=int, default=10, help="bursts per router, one after the other")
    parser.add_argument("--prefix-tokens", type=int, default=4000)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--via", default="envoy", help="comma-separated: envoy, serve")
    parser.add_argument("--configs", default="burst")
    parser.add_argument("--config-dir", type=Path, default=Path("config"))
    parser.add_argument("--time-scale", type=float, default=1.0, help="simulator time scale")
    parser.add_argument("--replica-cpu-quota", type=float, default=None, help="real vLLM: cores per replica")
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args(argv)


async def run_bursts(
    client: httpx.AsyncClient, url: str, pool: PoolHandle, spec: BurstSpec, count: int, tag: str
) -> list[dict[str, Any]]:
    """``count`` bursts through the router at ``url``, one after the other; each burst's summary."""
    rows = []
    for index in range(count):
        prompts, prefix_tokens = await build_prompts(
            client, pool.replicas[0].url, pool.model, spec, f"{tag}-{index}"
        )
        results, makespan = await fire_burst(client, url, pool.model, prompts, spec.max_tokens)
        rows.append(BurstOutcome(spec, prefix_tokens, results, makespan).summary())
    return rows


def summarize(via: str, config: str, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ratios = [row["compute_ratio"] for row in rows]
    return {
        "via": via,
        "config": config,
        "bursts": len(rows),
        "k": rows[0]["k"] if rows else 0,
        "together": sum(1 for row in rows if row["replicas_per_burst"] == [1]),
        "ratio_median": statistics.median(ratios) if ratios else float("nan"),
        "ratio_max": max(ratios) if ratios else float("nan"),
        "failed": sum(row["failed"] for row in rows),
        "endpoints": [row["endpoints_per_burst"][0] for row in rows],
        "per_burst": list(rows),
    }


def print_rows(rows: Sequence[dict[str, Any]]) -> None:
    header = f"{'router':<7} {'config':<13} {'K':>3} {'together':>8} {'median':>7} {'max':>6} {'fail':>4}"
    header += "  endpoints"
    print(header)
    print("-" * len(header))
    for row in rows:
        together = f"{row['together']}/{row['bursts']}"
        spread = " ".join("+".join(e) for e in row["endpoints"])
        print(
            f"{row['via']:<7} {row['config']:<13} {row['k']:>3} {together:>8} {row['ratio_median']:>7.2f} "
            f"{row['ratio_max']:>6.2f} {row['failed']:>4}  {spread}"
        )


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    spec = BurstSpec(k=args.k, prefix_tokens=args.prefix_tokens, max_tokens=args.max_tokens)
    async with (
        open_pool(
            args.backend, args.replicas, time_scale=args.time_scale, cpu_quota=args.replica_cpu_quota
        ) as pool,
        httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client,
    ):
        for via in args.via.split(","):
            start = gateway_process if via == "envoy" else router_process
            for name in args.configs.split(","):
                await pool.reset_prefix_caches(client)
                started = time.perf_counter()
                config = args.config_dir / f"{name}.yaml"
                async with start(config, pool.endpoints, extra_args=pool.router_args) as url:
                    bursts = await run_bursts(client, url, pool, spec, args.bursts, f"{via}-{name}")
                rows.append(summarize(via, name, bursts))
                print_rows(rows[-1:])
                print(f"  ({time.perf_counter() - started:.1f} s)", flush=True)
    return rows


if __name__ == "__main__":
    arguments = parse_args()
    measured = anyio.run(main, arguments)
    print()
    print_rows(measured)
    if arguments.json is not None:
        arguments.json.write_text(json.dumps(measured, indent=2) + "\n")
