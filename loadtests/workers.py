"""``burstsched serve --workers N``: requests/s for 1, 2, 4 workers, and bursts split across workers.

    python loadtests/workers.py [--workers 1,2,4] [--clients 32,64] [--duration 6] [--backends 2]
        [--worker-sockets reuseport] [--bursts 10] [--k 8] [--configs default,rendezvous] [--replicas 4]
        [--skip-throughput] [--skip-bursts] [--json PATH]

Throughput: the overhead benchmark's machinery (loadtests/overhead.py): fast fake backends (zero delay), one
``burstsched serve --workers N`` target per N, closed-loop clients over keep-alive connections, targets
taking turns in slices. Router CPU per request is the CPU of the router's whole process group (the parent
and its workers) over its slices.

Bursts: ``burstsched serve --workers 2`` over simulated replicas (prefix caches reset first), per config;
``--bursts`` bursts one after the other, each ``--k`` requests sharing a new prefix, sent at the same instant
over ``--k`` new connections to the one port (so the kernel spreads them over the workers). Per burst, the
prefix computations are Σ (prompt_tokens − cached_tokens) ÷ the prefix's tokens, as in
loadtests/two_routers.py (≈1.05: one replica computed it; ≈2: two did), and the workers that answered it (the
``x-burstsched-worker`` header).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict
from typing import Any

import httpx

from burstsched.server.workers import WORKER_HEADER
from burstsched.testing.ports import free_port
from burstsched.workloads.burst import BurstSpec, build_prompts
from burstsched.workloads.pools import open_pool
from burstsched.workloads.stream_client import StreamResult, chat_body, stream_chat
from loadtests.overhead import MODEL, PATHS, Run, measure, request_body
from loadtests.overhead_report import Row
from loadtests.overhead_targets import (
    REPO,
    Probe,
    Target,
    burstsched_router,
    child_process,
    fast_backends,
    untraced_env,
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workers", default="1,2,4", help="worker counts (default 1,2,4)")
    parser.add_argument("--worker-sockets", default="reuseport", choices=("reuseport", "shared"))
    parser.add_argument("--clients", default="32,64", help="concurrency levels (default 32,64)")
    parser.add_argument("--duration", type=float, default=6.0, help="measured seconds per target and level")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--slice", type=float, default=1.0)
    parser.add_argument("--backends", type=int, default=2, help="fast backends (default 2)")
    parser.add_argument("--config", type=Path, default=Path("config") / "default.yaml")
    parser.add_argument("--request-timeout", type=float, default=10.0)
    parser.add_argument("--bursts", type=int, default=10)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--burst-workers", type=int, default=2)
    parser.add_argument("--configs", default="default,rendezvous", help="configs for the bursts")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--prefix-tokens", type=int, default=4000)
    parser.add_argument("--time-scale", type=float, default=0.25)
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-bursts", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args(argv)


# --- throughput ------------------------------------------------------------------------------------------


async def throughput(args: argparse.Namespace) -> list[Row]:
    counts = [int(n) for n in args.workers.split(",")]
    levels = [int(c) for c in args.clients.split(",")]
    config = (args.config if args.config.is_absolute() else REPO / args.config).resolve()
    probe = Probe(PATHS["chat"], request_body(MODEL, "chat", False))
    with tempfile.TemporaryDirectory(prefix="burstsched-workers-") as tmp:
        logdir = Path(tmp)
        async with AsyncExitStack() as stack:
            backends = await stack.enter_async_context(fast_backends(args.backends, MODEL, logdir))
            targets = [Target("direct", backends[0].url)]
            for n in counts:
                extra = ["--workers", str(n), "--worker-sockets", args.worker_sockets]
                starting = burstsched_router(
                    f"burstsched:workers={n}",
                    config,
                    backends,
                    logdir,
                    probe,
                    env=untraced_env(),
                    extra_args=extra,
                )
                targets.append(await stack.enter_async_context(starting))
            run = Run(targets, backends, None, probe, args.request_timeout)
            return await measure(run, levels, args, lambda _: None)


# --- bursts split across workers -------------------------------------------------------------------------


def computed_tokens(result: StreamResult) -> int:
    usage = result.usage or {}
    return int(usage.get("prompt_tokens", 0)) - (result.cached_tokens or 0)


async def fire_burst(url: str, model: str, prompts: Sequence[str], max_tokens: int) -> list[StreamResult]:
    """Every prompt at the same instant, each over its own new connection."""
    limits = httpx.Limits(max_connections=len(prompts), max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), limits=limits, trust_env=False) as client:
        bodies = [chat_body(model, p, max_tokens) for p in prompts]
        return list(
            await asyncio.gather(
                *(stream_chat(client, url, b, f"workers-{uuid.uuid4().hex[:10]}") for b in bodies)
            )
        )


async def bursts(args: argparse.Namespace) -> list[dict[str, Any]]:
    spec = BurstSpec(k=args.k, bursts=args.bursts, prefix_tokens=args.prefix_tokens, max_tokens=16)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="burstsched-workers-") as tmp:
        async with (
            open_pool("sim", args.replicas, time_scale=args.time_scale) as pool,
            httpx.AsyncClient(timeout=httpx.Timeout(300.0), trust_env=False) as client,
        ):
            prompts, prefix_tokens = await build_prompts(
                client, pool.replicas[0].url, pool.model, spec, "workers"
            )
            for name in args.configs.split(","):
                await pool.reset_prefix_caches(client)
                port = free_port()
                url = f"http://127.0.0.1:{port}"
                command = [sys.executable, "-m", "burstsched", "serve", "--config", f"config/{name}.yaml"]
                command += ["--port", str(port), "--workers", str(args.burst_workers)]
                command += ["--worker-sockets", args.worker_sockets, *pool.router_args]
                for endpoint, endpoint_url in pool.endpoints:
                    command += ["--endpoint", f"{endpoint}={endpoint_url}"]

                async def ready(url: str = url) -> bool:
                    try:
                        response = await client.get(f"{url}/ready")
                    except httpx.HTTPError:
                        return False
                    return response.status_code == 200

                log = Path(tmp) / f"{name}.log"
                per_burst: list[dict[str, Any]] = []
                async with child_process(command, log, ready, env=untraced_env(), cwd=REPO):
                    for burst, tokens in zip(prompts, prefix_tokens, strict=True):
                        results = await fire_burst(url, pool.model, burst, 16)
                        per_burst.append(
                            {
                                "computations": sum(computed_tokens(r) for r in results) / tokens,
                                "workers": sorted({r.headers.get(WORKER_HEADER, "?") for r in results}),
                                "per_worker": [r.headers.get(WORKER_HEADER, "?") for r in results],
                                "endpoints": sorted({r.endpoint or "?" for r in results}),
                                "failed": sum(1 for r in results if r.status != 200 or r.error is not None),
                            }
                        )
                computations = [b["computations"] for b in per_burst]
                row = {
                    "config": name,
                    "workers": args.burst_workers,
                    "bursts": len(per_burst),
                    "computations_mean": statistics.fmean(computations),
                    "computations_max": max(computations),
                    "bursts_over_2plus_workers": sum(1 for b in per_burst if len(b["workers"]) > 1),
                    "bursts_on_one_replica": sum(1 for b in per_burst if len(b["endpoints"]) == 1),
                    "failed": sum(b["failed"] for b in per_burst),
                    "per_burst": per_burst,
                }
                print(burst_line(row), flush=True)
                rows.append(row)
    return rows


def burst_line(r: dict[str, Any]) -> str:
    return (
        f"| {r['config']} | {r['workers']} | {r['bursts']} | {r['computations_mean']:.2f} / "
        f"{r['computations_max']:.2f} | {r['bursts_over_2plus_workers']}/{r['bursts']} "
        f"| {r['bursts_on_one_replica']}/{r['bursts']} | {r['failed']} |"
    )


BURST_HEADER = (
    "| config | workers | bursts | prefix computations per burst mean / max | bursts split over >1 worker "
    "| bursts on one replica | failed |\n|---|---|---|---|---|---|---|"
)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()}
    if not args.skip_throughput:
        rows = await throughput(args)
        result["throughput"] = [asdict(r) for r in rows]
    if not args.skip_bursts:
        print(BURST_HEADER, flush=True)
        result["bursts"] = await bursts(args)
    result["loadavg_end"] = os.getloadavg()
    return result


if __name__ == "__main__":
    arguments = parse_args()
    started = time.perf_counter()
    outcome = asyncio.run(main(arguments))
    outcome["wall_s"] = time.perf_counter() - started
    outcome["command"] = "python " + " ".join(sys.argv)
    if arguments.json is not None:
        arguments.json.write_text(json.dumps(outcome, indent=1, default=str) + "\n")
    print(f"wall time {outcome['wall_s']:.0f} s")
