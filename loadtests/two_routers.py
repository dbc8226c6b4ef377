"""Bursts sharing a new prefix sent half through router A and half through router B, over the same replicas.

    python loadtests/two_routers.py [--backend sim|vllm] [--replicas 4] [--k 8] [--bursts 12]
        [--configs default,rendezvous] [--routers 1,2] [--prefix-tokens 4000] [--time-scale 0.25]
        [--json PATH] [--markdown PATH]

For each config and router count, N independent ``burstsched serve`` processes are started over the same
replicas (prefix caches reset first, so every run starts cold), and ``--bursts`` bursts are sent one after
the other: each is K requests sharing a new prefix, request i through router i mod N, all at the same
instant (with N = 2 and K = 8: 4 through A and 4 through B). Every config gets the same prompts.

Per burst, the prefix computations are Σ over its requests of the prompt tokens the replica computed
(``prompt_tokens − cached_tokens`` from each response's usage) ÷ the shared prefix's tokens: about 1.05
when one replica computed the prefix once (block rounding and the questions), about 2 when two replicas
each computed it. The replicas that computed it are those whose requests computed at least half of it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import shlex
import statistics
import time
import uuid
from collections.abc import Sequence
from typing import Any

import anyio
import httpx

from burstsched.workloads.burst import BurstSpec, build_prompts
from burstsched.workloads.pools import PoolHandle, open_pool
from burstsched.workloads.router_fleet import router_fleet
from burstsched.workloads.stats import percentile
from burstsched.workloads.stream_client import StreamResult, chat_body, stream_chat


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", choices=("sim", "vllm"), default="sim")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--k", type=int, default=8, help="requests per burst")
    parser.add_argument("--bursts", type=int, default=12, help="bursts per config and router count")
    parser.add_argument("--configs", default="default,rendezvous", help="config names from --config-dir")
    parser.add_argument("--routers", default="1,2", help="comma-separated router counts")
    parser.add_argument("--prefix-tokens", type=int, default=4000)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--time-scale", type=float, default=0.25, help="simulator only")
    parser.add_argument("--config-dir", type=Path, default=Path("config"))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    return parser.parse_args(argv)


def computed_tokens(result: StreamResult) -> int:
    usage = result.usage or {}
    return int(usage.get("prompt_tokens", 0)) - (result.cached_tokens or 0)


def burst_row(results: Sequence[StreamResult], prefix_tokens: int, routers: Sequence[str]) -> dict[str, Any]:
    """One burst: its prefix computations, the replicas that computed it, where each router's half went."""
    computed = [computed_tokens(r) for r in results]
    computing = sorted(
        {r.endpoint or "?" for r, c in zip(results, computed, strict=True) if c >= prefix_tokens / 2}
    )
    by_router: dict[str, list[str]] = {}
    for i, result in enumerate(results):
        by_router.setdefault(routers[i % len(routers)], []).append(result.endpoint or "?")
    return {
        "computations": sum(computed) / prefix_tokens,
        "replicas_computing": len(computing),
        "endpoints": sorted({r.endpoint or "?" for r in results}),
        "endpoints_by_router": {name: sorted(set(eps)) for name, eps in by_router.items()},
        "ttfts_ms": [None if r.ttft_s is None else r.ttft_s * 1000 for r in results],
        "request_endpoints": [r.endpoint for r in results],
        "prefix_blocks": [r.headers.get("x-burstsched-prefix-blocks") for r in results],
        "failed": sum(1 for r in results if r.status != 200 or r.error is not None or r.ttft_s is None),
    }


async def fire_split(
    client: httpx.AsyncClient, urls: Sequence[str], model: str, prompts: Sequence[str], max_tokens: int
) -> list[StreamResult]:
    """Send every prompt at the same moment, prompt i through router i mod len(urls)."""
    results: list[StreamResult | None] = [None] * len(prompts)

    async def one(i: int, prompt: str) -> None:
        body = chat_body(model, prompt, max_tokens)
        url = urls[i % len(urls)]
        results[i] = await stream_chat(client, url, body, f"two-routers-{i}-{uuid.uuid4().hex[:8]}")

    async with anyio.create_task_group() as tg:
        for i, prompt in enumerate(prompts):
            tg.start_soon(one, i, prompt)  # all start in the same turn of the event loop
    return [r for r in results if r is not None]


async def run_one(
    client: httpx.AsyncClient,
    pool: PoolHandle,
    config: Path,
    routers: int,
    prompts: Sequence[Sequence[str]],
    prefix_tokens: Sequence[int],
    max_tokens: int,
) -> dict[str, Any]:
    await pool.reset_prefix_caches(client)
    started = time.perf_counter()
    async with router_fleet(config, pool.endpoints, routers, extra_args=pool.router_args) as urls:
        names = [f"router-{chr(ord('A') + i)}" for i in range(len(urls))]
        bursts = []
        for burst, tokens in zip(prompts, prefix_tokens, strict=True):
            results = await fire_split(client, urls, pool.model, burst, max_tokens)
            bursts.append(burst_row(results, tokens, names))
    computations = [b["computations"] for b in bursts]
    computing = [b["replicas_computing"] for b in bursts]
    ttfts = [t for b in bursts for t in b["ttfts_ms"] if t is not None]
    return {
        "config": config.stem,
        "routers": routers,
        "bursts": len(bursts),
        "computations_mean": statistics.fmean(computations),
        "computations_max": max(computations),
        "replicas_computing_mean": statistics.fmean(computing),
        "replicas_computing_max": max(computing),
        "bursts_on_one_replica": sum(1 for b in bursts if len(b["endpoints"]) == 1),
        "first_replica_per_burst": [b["endpoints"][0] if len(b["endpoints"]) == 1 else None for b in bursts],
        "ttft_p50_ms": percentile(ttfts, 50),
        "ttft_p95_ms": percentile(ttfts, 95),
        "failed": sum(b["failed"] for b in bursts),
        "wall_s": time.perf_counter() - started,
        "per_burst": bursts,
    }


TABLE_HEADER = (
    "| config | routers | bursts | prefix computations per burst mean / max | replicas computing mean / max "
    "| bursts on one replica | TTFT p50 / p95 ms | failed |"
)


def table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [TABLE_HEADER, "|" + "---|" * 8]
    for r in rows:
        lines.append(
            f"| {r['config']} | {r['routers']} | {r['bursts']} | {r['computations_mean']:.2f} / "
            f"{r['computations_max']:.2f} | {r['replicas_computing_mean']:.2f} / "
            f"{r['replicas_computing_max']} "
            f"| {r['bursts_on_one_replica']}/{r['bursts']} | {r['ttft_p50_ms']:.0f} / {r['ttft_p95_ms']:.0f} "
            f"| {r['failed']} |"
        )
    return "\n".join(lines)


def spread_line(rows: Sequence[dict[str, Any]]) -> str:
    """Where whole bursts landed per run: distinct prefixes must still spread over the replicas."""
    parts = []
    for r in rows:
        counts: dict[str, int] = {}
        for name in r["first_replica_per_burst"]:
            if name is not None:
                counts[name] = counts.get(name, 0) + 1
        spread = "/".join(f"{n}:{c}" for n, c in sorted(counts.items()))
        parts.append(f"- {r['config']} x{r['routers']}: {spread or '-'}")
    return "\n".join(parts)


def markdown(command: str, args: argparse.Namespace, rows: Sequence[dict[str, Any]], wall_s: float) -> str:
    return (
        f"# Two routers, one pool: bursts sharing a new prefix ({args.backend})\n\n"
        f"```\n{command}\n```\n\n"
        "## Setup\n\n"
        f"- backend: {args.backend}, {args.replicas} replicas"
        + (f", time scale {args.time_scale}" if args.backend == "sim" else "")
        + "\n"
        f"- bursts: {args.bursts} per run, one after the other, each {args.k} requests sharing a new "
        f"~{args.prefix_tokens}-token prefix (a distinct question each), all sent at the same instant, "
        "request i through router i mod N; max_tokens "
        f"{args.max_tokens}\n"
        "- each run: replicas' prefix caches reset, N fresh `burstsched serve` processes; the same prompts "
        "for every run\n"
        "- prefix computations per burst: Σ (prompt_tokens − cached_tokens) over the burst ÷ prefix tokens "
        "(≈1.05: computed once; ≈2: by two replicas)\n"
        f"- wall time: {wall_s:.0f} s\n\n"
        "## Results\n\n" + table(rows) + "\n\n"
        "Bursts whose requests all landed on one replica, per replica:\n\n" + spread_line(rows) + "\n"
    )


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    configs = [args.config_dir / f"{name}.yaml" for name in args.configs.split(",")]
    counts = [int(n) for n in args.routers.split(",")]
    spec = BurstSpec(
        k=args.k, bursts=args.bursts, prefix_tokens=args.prefix_tokens, max_tokens=args.max_tokens
    )
    rows: list[dict[str, Any]] = []
    async with (
        open_pool(args.backend, args.replicas, time_scale=args.time_scale) as pool,
        httpx.AsyncClient(timeout=httpx.Timeout(300.0), limits=httpx.Limits(max_connections=256)) as client,
    ):
        prompts, prefix_tokens = await build_prompts(client, pool.replicas[0].url, pool.model, spec, "two")
        for config in configs:
            for count in counts:
                row = await run_one(client, pool, config, count, prompts, prefix_tokens, args.max_tokens)
                rows.append(row)
                print(table([row]).splitlines()[-1], flush=True)
    return rows


if __name__ == "__main__":
    arguments = parse_args()
    begun = time.perf_counter()
    measured = anyio.run(main, arguments)
    elapsed = time.perf_counter() - begun
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    print()
    print(table(measured))
    print()
    print(spread_line(measured))
    if arguments.json is not None:
        document = {"command": command, "wall_s": elapsed, "runs": measured}
        arguments.json.write_text(json.dumps(document, indent=1) + "\n")
    if arguments.markdown is not None:
        arguments.markdown.write_text(markdown(command, arguments, measured, elapsed))
