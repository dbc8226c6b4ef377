"""Mixed multi-tenant chat through burstsched, client-side random routing and the peer routers.

    python loadtests/tenants.py [--backend sim|vllm] [--replicas N] [--kv-blocks B | --cache-fraction F]
        [--rate R | --rates R1,R2 | --load L[,L2]] [--duration S] [--max-requests N] [--seed S]
        [--targets burstsched:config/default.yaml,burstsched:config/cost.yaml,random,sglang:cache_aware,
                   vllm-router:cache_aware] [--build-peers]
        [--tenants 10] [--tenant-zipf 1.0] [--system-tokens 1000-4000] [--turns 2-6] [--think-gaps 20]
        [--burst-users 8] [--burst-gaps 60] [--max-tokens 16] [--time-scale 0.3] [--out PREFIX]
        [--repeats N]

T tenants, each with a long system prompt; their users hold multi-turn chats (each turn's prompt is the
whole conversation so far plus a new question; the earlier answers are deterministic stand-ins of
``--max-tokens`` words, and the replicas generate exactly ``--max-tokens`` tokens, ``ignore_eos``); a
user's next turn waits for the previous one to end. Poisson arrivals at the rate, K-user bursts of one
tenant on top every ``--burst-gaps`` mean gaps. The sequence is fixed by ``--seed``, so every target gets
the identical requests at the identical times (burstsched/workloads/tenants.py). Between targets the
replicas' prefix caches are reset. ``--repeats N`` runs N passes over the targets at each rate, every
other pass in reverse order (as in ``loadtests/docqa.py``).

Sizing. System prompts are sized with the serving tokenizer (a one-replica simulator with it, before the
pool starts); every prompt of the sequence is tokenized the same way, which gives the working set (its
distinct full blocks) and the ideal hit rate. Unless ``--kv-blocks`` is given, all KV caches together hold
``--cache-fraction`` (default 1.0) of the working set: perfect tenant affinity fits, copies of every
tenant on every replica do not.

Rates. ``--load L`` is relative to the pool's measured cold capacity (burstsched/workloads/capacity.py:
distinct never-cached prompts of the mean system-prompt length, one at a time per replica); the bursts
come on top of it (the setup says how much).

Output: a progress line on stderr, the markdown table on stdout, and ``PREFIX.json`` (setup, summaries,
every request's record), ``PREFIX.md`` and PNG plots ``PREFIX-*.png`` (default prefix
loadtests/reports/tenants-<backend>-<N>r). Peer routers whose venv is not built are skipped with the
reason (``--build-peers`` builds them). Real vLLM replicas take one core each.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import math
import random
import signal
import time
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import anyio
import httpx

from burstsched.workloads.capacity import Capacity, measure_cold_capacity
from burstsched.workloads.contexts import context_text
from burstsched.workloads.replica_state import CacheConfig, read_cache_config
from burstsched.workloads.run_summary import TargetRun
from burstsched.workloads.targets import Target, parse_targets
from burstsched.workloads.tenants import (
    ChatTurn,
    Tenants,
    TenantsSpec,
    build_sequence,
    build_tenants,
    distinct_blocks,
)
from burstsched.workloads.tenants_report import markdown_table, report_markdown
from burstsched.workloads.tenants_run import TurnRecord, run_target
from loadtests.replica_pool import (
    VLLM_BLOCK_SIZE,
    Pool,
    TokenizeMessages,
    add_pool_arguments,
    kv_blocks_for,
    messages_tokenizer_of,
    open_pool,
    replicas_setup,
    sizing_replica,
    tokenizer_of,
)
from loadtests.run_report import write_run_report
from loadtests.run_targets import (
    add_run_arguments,
    build_targets,
    passes_note,
    progress_line,
    run_passes,
    run_with_retries,
)

DEFAULT_TARGETS = (
    "burstsched:config/default.yaml,burstsched:config/cost.yaml,random,sglang:cache_aware,"
    "vllm-router:cache_aware"
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_pool_arguments(parser)
    add_run_arguments(parser, DEFAULT_TARGETS)
    parser.set_defaults(cache_fraction=1.0, time_scale=0.3)
    parser.add_argument("--build-peers", action="store_true", help="build a missing peer venv (pip)")
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--tenant-zipf", type=float, default=1.0, help="Zipf exponent of tenant popularity")
    parser.add_argument("--system-tokens", default="1000-4000", help="system prompt length range, tokens")
    parser.add_argument("--turns", default="2-6", help="turns per conversation, range")
    parser.add_argument("--think-gaps", type=float, default=20.0, help="mean think time, in mean gaps")
    parser.add_argument("--burst-users", type=int, default=8, help="K: new users of one tenant at once")
    parser.add_argument("--burst-gaps", type=float, default=60.0, help="mean gaps between bursts (0: none)")
    parser.add_argument("--max-tokens", type=int, default=16)
    rates = parser.add_mutually_exclusive_group()
    rates.add_argument("--rate", type=float, default=None, help="requests/s")
    rates.add_argument("--rates", default=None, help="comma-separated requests/s")
    rates.add_argument("--load", default=None, help="comma-separated multiples of the cold capacity")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals per target")
    parser.add_argument("--max-requests", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calibration", type=int, default=3, help="cold requests per replica for --load")
    parser.add_argument("--out", type=Path, default=None, help="report path prefix (no extension)")
    args = parser.parse_args(argv)
    args.system_min, args.system_max = _range(parser, "--system-tokens", args.system_tokens)
    args.turns_min, args.turns_max = _range(parser, "--turns", args.turns)
    if args.replicas < 1:
        parser.error("--replicas must be >= 1")
    if args.out is None:
        args.out = Path("loadtests/reports") / f"tenants-{args.backend}-{args.replicas}r"
    return args


def _range(parser: argparse.ArgumentParser, flag: str, text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    try:
        return int(low), int(high or low)
    except ValueError:
        parser.error(f"{flag} takes N or N-M, got {text!r}")


def spec_of(args: argparse.Namespace, rate: float) -> TenantsSpec:
    return TenantsSpec(
        tenants=args.tenants,
        tenant_zipf=args.tenant_zipf,
        system_tokens_min=args.system_min,
        system_tokens_max=args.system_max,
        turns_min=args.turns_min,
        turns_max=args.turns_max,
        think_gaps=args.think_gaps,
        burst_users=args.burst_users,
        burst_gaps=args.burst_gaps,
        max_tokens=args.max_tokens,
        rate=rate,
        duration_s=args.duration,
        max_requests=args.max_requests,
        seed=args.seed,
    )


async def tokenize_prompts(
    tokenize: TokenizeMessages, tenants: Tenants, requests: Sequence[ChatTurn]
) -> list[list[int]]:
    """Every request's prompt as the replicas tokenize it (chat template with the generation prompt)."""
    return [await tokenize(tenants.messages(r)) for r in requests]


# -- the run -------------------------------------------------------------------------------------------
async def main(args: argparse.Namespace) -> int:
    started = time.monotonic()
    block = VLLM_BLOCK_SIZE if args.backend == "vllm" else args.block_size
    base_rate = args.rate or (float(args.rates.split(",")[0]) if args.rates else 1.0)
    spec = spec_of(args, base_rate)
    # The longest sequence any rate runs: the same conversations at every rate, cut by --max-requests.
    longest = build_sequence(replace(spec, duration_s=math.inf), random.Random(args.seed))
    timeout = httpx.Timeout(args.drain_timeout + args.duration + 60, connect=10.0)
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
        print("sizing system prompts and tokenizing the sequence…", file=sys.stderr)
        async with sizing_replica(args.backend) as sizer:
            text_tokens = tokenizer_of(client, sizer.endpoints[0][1], sizer.model)

            async def count(text: str) -> int:
                return len(await text_tokens(text))

            tenants = await build_tenants(spec, count, random.Random(f"tenants-lengths:{args.seed}"))
            prompts = await tokenize_prompts(
                messages_tokenizer_of(client, sizer.endpoints[0][1], sizer.model), tenants, longest
            )
        working_set = distinct_blocks(prompts, block)
        max_model_len = 1024 * math.ceil((max(map(len, prompts)) + args.max_tokens + 64) / 1024)
        kv_blocks = kv_blocks_for(args, working_set, max_model_len, block)
        print(
            f"starting {args.replicas} {args.backend} replicas, {kv_blocks} KV blocks each…", file=sys.stderr
        )
        async with open_pool(args, kv_blocks, max_model_len) as pool:
            cache = await read_cache_config(client, pool.endpoints[0][1])
            if args.backend != "sim":  # the replicas' own tokenizer has the last word
                tokenize = messages_tokenizer_of(client, pool.endpoints[0][1], pool.model)
                prompts = await tokenize_prompts(tokenize, tenants, longest)
            capacity: Capacity | None = None
            if args.load is not None:
                capacity = await calibrate(client, pool, tenants, args)
                rates = [float(x) * capacity.requests_per_s for x in args.load.split(",")]
            elif args.rates is not None:
                rates = [float(x) for x in args.rates.split(",")]
            else:
                rates = [base_rate]
            targets, skipped = build_targets(
                parse_targets(args.targets), args.seed, pool.router_args, build_peer_venvs=args.build_peers
            )
            runs: list[tuple[float, TargetRun[TurnRecord]]] = []
            attempts: list[list[float]] = []
            sequences: dict[float, list[ChatTurn]] = {}
            for rate in rates:
                requests = build_sequence(spec_of(args, rate), random.Random(args.seed))
                sequences[rate] = requests
                run_at_rate = partial(
                    run_one,
                    client,
                    pool=pool,
                    tenants=tenants,
                    requests=requests,
                    prompts=prompts,
                    rate=rate,
                    cache=cache,
                    args=args,
                )
                for run, lags in await run_passes(targets, args.repeats, skipped, run_at_rate):
                    runs.append((rate, run))
                    attempts.append(lags)
    setup = describe(args, tenants, sequences, prompts, working_set, cache, capacity)
    setup["wall time"] = f"{time.monotonic() - started:.0f} s (sizing, replica start-up, calibration, runs)"
    write_outputs(args, setup, runs, attempts, skipped, capacity)
    return 0


async def run_one(
    client: httpx.AsyncClient,
    target: Target,
    pool: Pool,
    tenants: Tenants,
    requests: Sequence[ChatTurn],
    prompts: Sequence[Sequence[int]],
    rate: float,
    cache: CacheConfig,
    args: argparse.Namespace,
) -> tuple[TargetRun[TurnRecord], list[float]]:
    async def attempt() -> TargetRun[TurnRecord]:
        return await run_target(
            client,
            target,
            pool.endpoints,
            tenants,
            requests,
            prompts,
            pool.model,
            rate=rate,
            max_tokens=args.max_tokens,
            block_size=cache.block_size,
            drain_timeout_s=args.drain_timeout,
            progress=progress_line(target.label, rate),
            received=pool.received,
        )

    return await run_with_retries(attempt, lambda s: markdown_table([s]).splitlines()[-1], target.label, args)


async def calibrate(
    client: httpx.AsyncClient, pool: Pool, tenants: Tenants, args: argparse.Namespace
) -> Capacity:
    """Cold capacity on prompts as long as a mean system prompt, none of them ever cached."""
    count = (args.calibration + 1) * len(pool.endpoints)  # one uncounted warm-up request per replica
    lines = round(sum(p.count("\n") for p in tenants.system_prompts) / len(tenants.system_prompts))
    prompts = [
        context_text(f"calibration-{i}-seed-{args.seed}", lines, args.seed) + "\n\nWhat happened?"
        for i in range(count)
    ]
    print(f"measuring cold capacity ({count} requests)…", file=sys.stderr)
    capacity = await measure_cold_capacity(client, pool.endpoints, pool.model, prompts, args.max_tokens)
    print(f"cold capacity {capacity.requests_per_s:.2f} requests/s", file=sys.stderr)
    return capacity


def describe(
    args: argparse.Namespace,
    tenants: Tenants,
    sequences: dict[float, list[ChatTurn]],
    prompts: Sequence[Sequence[int]],
    working_set: int,
    cache: CacheConfig,
    capacity: Capacity | None,
) -> dict[str, str]:
    """The report's setup section."""
    cache_blocks = args.replicas * (cache.num_gpu_blocks - 1)
    spec = spec_of(args, 1.0)
    setup = {
        "backend": args.backend,
        "replicas": replicas_setup(args),
        "KV cache per replica": f"{cache.num_gpu_blocks} blocks of {cache.block_size} tokens",
        "tenants": f"{spec.tenants}, Zipf exponent {spec.tenant_zipf} for new users; system prompts "
        f"{min(tenants.system_tokens)}-{max(tenants.system_tokens)} tokens",
        "conversations": f"{spec.turns_min}-{spec.turns_max} turns; mean think time {spec.think_gaps:g} "
        "mean gaps; a turn is sent once the user's previous turn ended; earlier answers in a prompt are "
        f"deterministic stand-ins of {spec.max_tokens} words (not the replica's answers)",
        "bursts": f"{spec.burst_users} new users of one tenant at once, every {spec.burst_gaps:g} mean gaps "
        "on average, on top of the Poisson rate"
        if spec.burst_gaps > 0
        else "none",
        "working set": f"{working_set} distinct blocks in the longest sequence's prompts; all KV caches "
        f"together {cache_blocks} blocks ({cache_blocks / max(1, working_set):.2f}x the working set)",
        "requests": f"max_tokens {spec.max_tokens} (ignore_eos), temperature 0, streamed with usage; up to "
        f"{spec.max_requests} requests or {spec.duration_s:.0f} s of arrivals; seed {spec.seed}",
        "cold capacity": "not measured",
    }
    for rate, requests in sequences.items():
        users = len({(r.tenant, r.user) for r in requests})
        bursts = len({r.burst for r in requests if r.burst is not None})
        in_bursts = sum(1 for r in requests if r.burst is not None and r.turn == 1)
        tokens = [len(prompts[r.index]) for r in requests]
        span = requests[-1].arrival_s if requests else math.nan
        setup[f"sequence at {rate:.2f} requests/s"] = (
            f"{len(requests)} requests over {span:.1f} s ({len(requests) / span:.2f}/s offered, bursts "
            f"included), {users} users, {bursts} bursts ({in_bursts} requests), prompts "
            f"{min(tokens)}-{max(tokens)} tokens (mean {sum(tokens) / len(tokens):.0f})"
        )
    if capacity is not None:
        setup["cold capacity"] = (
            f"{capacity.requests_per_s:.2f} requests/s (mean cold service "
            f"{capacity.mean_service_s * 1000:.0f} ms over {capacity.samples} requests)"
        )
    setup["repeats"] = (
        f"a run whose send lag p99 exceeded {args.max_send_lag_ms:.0f} ms (load generator starved of CPU) "
        f"was run again, at most {args.retries} time(s); the table shows the last attempt, the JSON every "
        "attempt's lag"
    )
    if args.repeats > 1:
        setup["passes"] = passes_note(args.repeats)
    if args.backend == "sim":
        setup["time scale"] = f"{args.time_scale} (latencies are wall-clock at this scale)"
    return setup


def write_outputs(
    args: argparse.Namespace,
    setup: dict[str, Any],
    runs: Sequence[tuple[float, TargetRun[TurnRecord]]],
    attempts: Sequence[list[float]],
    skipped: dict[str, str],
    capacity: Capacity | None,
) -> None:
    prefix: Path = args.out
    write_run_report(
        prefix.parent,
        prefix.name,
        f"Multi-tenant chat: {args.backend}, {args.replicas} replicas",
        f"tenants, {args.backend}, {args.replicas} replicas",
        setup,
        runs,
        attempts,
        skipped,
        capacity,
        table=markdown_table,
        page=report_markdown,
    )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    # SIGTERM (and SIGINT, which a background job ignores) unwind like Ctrl-C, so routers started in their
    # own sessions and the replicas are stopped by the context managers that started them.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    sys.exit(anyio.run(main, parse_args()))
