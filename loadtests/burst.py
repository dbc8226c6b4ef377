"""Bursts through burstsched with burst admission, plain prefix-aware routing and random routing.

    python loadtests/burst.py [--backend sim|vllm] [--replicas N] [--k 4,8,16,32] [--bursts 1]
                              [--mode identical|system] [--background RATE] [--json PATH]
    python loadtests/burst.py --sequence 20 [--gaps 0,0.1,2] [--spread-ms 0] [--no-side-traffic]
                              [--background RATE] [--configs default,burst,precise,precise-cost] ...

Per configuration and K it prints the computations of the shared prefix (Σ prefill-computed tokens ÷
prefix tokens), the replicas that computed it, the burst's TTFT p50/p95/max, the time until its last
response and the background traffic's TTFT p95 while the burst ran (workloads.md §2).

``--sequence N`` sends N bursts of K through one router per configuration and gap instead
(:mod:`burstsched.workloads.burst_sequence`): between bursts a client sizes the next context with the first
replica's ``/tokenize`` and reads every replica's ``/metrics``, and during each burst it keeps calling the
first replica directly (``--no-side-traffic``: none); ``--gaps`` the pauses between bursts (0: back to
back), ``--spread-ms`` how long a burst's requests take to leave, ``--background`` Poisson traffic through
the router meanwhile. Per configuration and timing: bursts kept on one replica, the median and the
largest prefix computations, and each burst's split.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import anyio
import httpx

from burstsched.workloads.burst import BurstOutcome, BurstSpec, background_load, build_prompts, fire_burst
from burstsched.workloads.burst_sequence import SequenceSpec, run_sequence
from burstsched.workloads.pools import PoolHandle, open_pool
from burstsched.workloads.router_process import router_process
from burstsched.workloads.stream_client import StreamResult

CONFIGS = ("burst", "prefix-aware", "random")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sim", "vllm"), default="sim")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--k", default="8", help="comma-separated burst sizes")
    parser.add_argument("--bursts", type=int, default=1, help="distinct prefixes sent at the same moment")
    parser.add_argument("--mode", choices=("identical", "system"), default="identical")
    parser.add_argument("--prefix-tokens", type=int, default=4000)
    parser.add_argument("--background", type=float, default=0.0, help="background requests/s (0: idle pool)")
    parser.add_argument("--background-tokens", type=int, default=1000)
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of background before the burst")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--config-dir", type=Path, default=Path("config"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--sequence", type=int, default=0, help="bursts per config and gap (0: single bursts)"
    )
    parser.add_argument("--gaps", default="0,0.1,2", help="seconds between bursts of a sequence")
    parser.add_argument(
        "--spread-ms", type=float, default=0.0, help="how long a burst's requests take to leave"
    )
    parser.add_argument("--no-side-traffic", action="store_true", help="no direct calls to the replicas")
    parser.add_argument("--replica-cpu-quota", type=float, default=None, help="real vLLM: cores per replica")
    return parser.parse_args(argv)


async def run_one(
    client: httpx.AsyncClient, pool: PoolHandle, config: Path, spec: BurstSpec, args: argparse.Namespace
) -> BurstOutcome:
    prompts, prefix_tokens = await build_prompts(client, pool.replicas[0].url, pool.model, spec, config.stem)
    await pool.reset_prefix_caches(client)
    async with router_process(config, pool.endpoints, extra_args=pool.router_args) as url:
        background: list[tuple[float, StreamResult]] = []
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            if args.background > 0:
                rng = random.Random(args.seed)
                tg.start_soon(
                    background_load,
                    client,
                    url,
                    pool.model,
                    args.background,
                    args.background_tokens,
                    stop,
                    background,
                    rng,
                )
                await anyio.sleep(args.warmup)
            burst_start = time.perf_counter()
            results, makespan = await fire_burst(client, url, pool.model, prompts, spec.max_tokens)
            burst_end = burst_start + makespan
            stop.set()
    during = [r for started, r in background if burst_start <= started <= burst_end]
    return BurstOutcome(spec, prefix_tokens, results, makespan, during)


def print_rows(rows: list[dict[str, Any]]) -> None:
    header = (
        f"{'config':<13} {'K':>3} {'ratio':>6} {'replicas':>8} {'per burst':>10} {'p50 ms':>8} {'p95 ms':>8} "
        f"{'max ms':>8} {'makespan':>9} {'bg p95':>8} {'bg n':>5} {'fail':>4}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row['config']:<13} {row['k']:>3} {row['compute_ratio']:>6.2f} {row['replicas_used']:>8} "
            f"{'/'.join(map(str, row['replicas_per_burst'])):>10} {row['ttft_p50_ms']:>8.0f} "
            f"{row['ttft_p95_ms']:>8.0f} {row['ttft_max_ms']:>8.0f} {row['makespan_ms']:>9.0f} "
            f"{row['background_ttft_p95_ms']:>8.0f} {row['background_requests']:>5} {row['failed']:>4}"
        )


def print_sequence_rows(rows: list[dict[str, Any]]) -> None:
    header = f"{'config':<13} {'timing':<44} {'together':>8} {'median':>7} {'max':>6} {'fail':>4}  splits"
    print(header)
    print("-" * len(header))
    for row in rows:
        together = f"{row['together']}/{row['bursts']}"
        print(
            f"{row['config']:<13} {row['timing']:<44} {together:>8} {row['ratio_median']:>7.2f} "
            f"{row['ratio_max']:>6.2f} {row['failed']:>4}  {' '.join(row['splits'])}"
        )


async def sequences(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--sequence N``: N bursts per configuration and gap, each through a router of its own."""
    rows: list[dict[str, Any]] = []
    k = int(args.k.split(",")[0])
    gaps = [float(g) for g in args.gaps.split(",")]
    async with open_pool(
        args.backend, args.replicas, time_scale=args.time_scale, cpu_quota=args.replica_cpu_quota
    ) as pool:
        urls = [r.url for r in pool.replicas]
        async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client:
            for gap in gaps:
                for name in args.configs.split(","):
                    spec = SequenceSpec(
                        bursts=args.sequence,
                        k=k,
                        prefix_tokens=args.prefix_tokens,
                        gap_s=gap,
                        spread_ms=args.spread_ms,
                        side_traffic=not args.no_side_traffic,
                        background_rate=args.background,
                        background_tokens=args.background_tokens,
                    )
                    config = args.config_dir / f"{name}.yaml"
                    async with router_process(config, pool.endpoints, extra_args=pool.router_args) as url:
                        rng = random.Random(args.seed)
                        outcome = await run_sequence(client, url, urls, pool.model, spec, rng=rng, tag=name)
                    rows.append({"config": name, **outcome.summary()})
                    print_sequence_rows(rows[-1:])
    return rows


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.sequence > 0:
        return await sequences(args)
    rows: list[dict[str, Any]] = []
    ks = [int(k) for k in args.k.split(",")]
    async with open_pool(
        args.backend, args.replicas, time_scale=args.time_scale, cpu_quota=args.replica_cpu_quota
    ) as pool:
        async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client:
            for k in ks:
                spec = BurstSpec(k=k, bursts=args.bursts, mode=args.mode, prefix_tokens=args.prefix_tokens)
                for name in args.configs.split(","):
                    outcome = await run_one(client, pool, args.config_dir / f"{name}.yaml", spec, args)
                    rows.append({"config": name, **outcome.summary()})
                    print_rows(rows[-1:])
    return rows


if __name__ == "__main__":
    arguments = parse_args()
    measured = anyio.run(main, arguments)
    print()
    if arguments.sequence > 0:
        print_sequence_rows(measured)
    else:
        print_rows(measured)
    if arguments.json is not None:
        arguments.json.write_text(json.dumps(measured, indent=2) + "\n")
