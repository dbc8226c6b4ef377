"""Document QA through burstsched, client-side random routing and the peer routers, on the same sequence.

    python loadtests/docqa.py [--backend sim|vllm] [--replicas N] [--kv-blocks B | --cache-fraction F]
        [--rate R | --rates R1,R2 | --load L[,L2]] [--duration S] [--max-requests N] [--seed S]
        [--targets burstsched:config/default.yaml,random,sglang:cache_aware,sglang:round_robin,
                   vllm-router:cache_aware]
        [--documents D] [--zipf 1.0] [--doc-tokens 2200-3600] [--max-tokens 16] [--time-scale 0.1]
        [--routers 1,2] [--repeats N]
        [--classes NAME:SHARE[:objective=O][:tenant=T],...] [--noisy-tenant NAME:FACTOR[:objective=O]]
        [--slo-ms 2000]

D documents (each longer than 2k tokens), Zipf popularity, a distinct short question per request, Poisson
arrivals; the sequence is fixed by ``--seed``, so every target gets the identical requests at the identical
times (burstsched/workloads/docqa.py). Between targets the replicas' prefix caches are reset.
``--routers 1,2`` runs each burstsched target once per router count: with N > 1, N independent
``burstsched serve`` processes over the same replicas, request i sent to router i mod N (label ``xN``).

``--repeats N`` runs N passes over the targets at each rate, every other pass in reverse order (A B, B A,
A B): on a shared machine a replica's speed drifts between runs by more than routers differ, and the same
sequence through the same router can land far apart; alternating spreads the drift over every target.

Classes (burstsched/workloads/docqa_classes.py). ``--classes`` splits the sequence's requests into
classes, each a share of them sending its headers: ``objective=`` as ``x-llm-d-inference-objective``,
``tenant=`` as ``x-llm-d-inference-fairness-id``; e.g.
``--classes urgent:0.3:objective=urgent,batch:0.2:objective=batch,rest:0.5``. The shares sum to 1;
which request is in which class is fixed by ``--seed`` (the same at every rate, for every target).
``--noisy-tenant NAME:FACTOR`` adds a tenant sending FACTOR times the others' rate (the mean rate of the
classes' tenants, the whole sequence's when none names one) on top of the base sequence, its own
requests fixed by the seed too: the base requests are the same with and without it, so two runs that
differ only in it compare the others' TTFT on the same requests (give the rate with ``--rate``/``--rates``
there: ``--load`` measures the capacity again each time). The caches are sized from the base requests
alone. The report then gains a row per class: sent, ok, 429s (and how many carried Retry-After), other
failures (timeouts among them), TTFT p50/p95/p99, and the goodput: completed with TTFT ≤ ``--slo-ms``.

Sizing. Documents are sized with the serving tokenizer (the simulator's built-in one, or the tiny model's
on real vLLM; a one-replica simulator with that tokenizer sizes them before the pool starts, then the real
replicas' ``/tokenize`` measures them). Unless ``--kv-blocks`` is given, each replica gets
``cache_fraction × (distinct document blocks of the run's working set) / replicas`` blocks, so all KV caches
together hold that fraction (default 0.5) of the documents the sequence asks about.

Rates. ``--rate``/``--rates`` are requests per second (wall clock). ``--load L`` is relative to the pool's
measured cold capacity (burstsched/workloads/capacity.py): each replica is sent ``--calibration``
distinct, never-cached documents straight, one at a time, all replicas at once; the capacity is the sum
of the replicas' completed requests per busy second, i.e. the rate the pool sustains when nothing hits the
cache. Prefix hits raise a policy's real capacity above it, so loads past 1.0 are meaningful.

Output: a progress line on stderr, the markdown table on stdout, and under ``--out-dir`` (default
loadtests/reports) ``<tag>.json`` (setup, summaries, every request's record), ``<tag>.md`` and PNG plots
(TTFT CDF per target for each rate; hit rate and TTFT p95 against offered load when several rates run).
Real vLLM replicas take one core each: run one real-vLLM workload at a time.
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
from burstsched.workloads.docqa import (
    Corpus,
    DocQARequest,
    DocQASpec,
    build_corpus,
    build_sequence,
    document_text,
    prompt_text,
    remeasure_corpus,
)
from burstsched.workloads.docqa_classes import ClassPlan, classed_sequence, plan_of, summarize_classes
from burstsched.workloads.docqa_report import ClassRow, class_table, markdown_table, report_markdown
from burstsched.workloads.docqa_run import RequestRecord, run_target
from burstsched.workloads.replica_state import CacheConfig, read_cache_config
from burstsched.workloads.run_summary import RunSummary, TargetRun
from burstsched.workloads.targets import Target, parse_targets
from loadtests.replica_pool import (
    VLLM_BLOCK_SIZE,
    Pool,
    add_pool_arguments,
    kv_blocks_for,
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
)
from loadtests.run_targets import run_with_retries as run_attempts

DEFAULT_TARGETS = (
    "burstsched:config/default.yaml,random,sglang:cache_aware,sglang:round_robin,vllm-router:cache_aware"
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_pool_arguments(parser)
    add_run_arguments(parser, DEFAULT_TARGETS)
    parser.add_argument(
        "--routers",
        default="1",
        help="comma-separated router counts per burstsched target (N > 1: N processes, clients round-robin)",
    )
    parser.add_argument("--documents", type=int, default=100)
    parser.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of document popularity")
    parser.add_argument("--doc-tokens", default="2200-3600", help="document length range, tokens")
    parser.add_argument("--max-tokens", type=int, default=16)
    rates = parser.add_mutually_exclusive_group()
    rates.add_argument("--rate", type=float, default=None, help="requests/s")
    rates.add_argument("--rates", default=None, help="comma-separated requests/s")
    rates.add_argument("--load", default=None, help="comma-separated multiples of the cold capacity")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals per target")
    parser.add_argument("--max-requests", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--classes",
        default=None,
        help="request classes: name:share[:objective=NAME][:tenant=ID],... (shares sum to 1)",
    )
    parser.add_argument(
        "--noisy-tenant",
        default=None,
        help="NAME:FACTOR[:objective=NAME]: a tenant at FACTOR times the others' rate, on top",
    )
    parser.add_argument("--slo-ms", type=float, default=2000.0, help="TTFT objective of the goodput, ms")
    parser.add_argument("--calibration", type=int, default=3, help="cold requests per replica for --load")
    parser.add_argument("--tag", default=None, help="report file names (default docqa-<backend>-<N>r)")
    parser.add_argument("--out-dir", type=Path, default=Path("loadtests/reports"))
    args = parser.parse_args(argv)
    low, _, high = args.doc_tokens.partition("-")
    args.doc_tokens_min, args.doc_tokens_max = int(low), int(high or low)
    if args.replicas < 1:
        parser.error("--replicas must be >= 1")
    try:
        args.plan = plan_of(args.classes, args.noisy_tenant)
    except ValueError as exc:
        parser.error(str(exc))
    if args.slo_ms <= 0:
        parser.error("--slo-ms must be > 0")
    args.router_counts = [int(n) for n in args.routers.split(",")]
    if any(n < 1 for n in args.router_counts):
        parser.error("--routers must be >= 1")
    return args


# -- the run -------------------------------------------------------------------------------------------
async def main(args: argparse.Namespace) -> int:
    started = time.monotonic()
    block = VLLM_BLOCK_SIZE if args.backend == "vllm" else args.block_size
    base_rate = args.rate or (float(args.rates.split(",")[0]) if args.rates else 1.0)
    spec = DocQASpec(
        documents=args.documents,
        zipf_exponent=args.zipf,
        doc_tokens_min=args.doc_tokens_min,
        doc_tokens_max=args.doc_tokens_max,
        max_tokens=args.max_tokens,
        rate=base_rate,
        duration_s=args.duration,
        max_requests=args.max_requests,
        seed=args.seed,
    )
    max_model_len = 1024 * math.ceil((spec.doc_tokens_max + 256 + spec.max_tokens) / 1024)
    timeout = httpx.Timeout(args.drain_timeout + args.duration + 60, connect=10.0)
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
        print("sizing documents…", file=sys.stderr)
        async with sizing_replica(args.backend) as sizer:
            tokenize = tokenizer_of(client, sizer.endpoints[0][1], sizer.model)
            corpus = await build_corpus(spec, tokenize, random.Random(f"docqa-lengths:{args.seed}"))
        # The working set: documents the longest sequence asks about (the lowest rate's, at most).
        probe = build_sequence(replace(spec, rate=1e9, duration_s=math.inf), random.Random(args.seed))
        working_set = sorted({r.document for r in probe})
        kv_blocks = kv_blocks_for(args, corpus.blocks(working_set, block), max_model_len, block)
        print(
            f"starting {args.replicas} {args.backend} replicas, {kv_blocks} KV blocks each…", file=sys.stderr
        )
        async with open_pool(args, kv_blocks, max_model_len) as pool:
            cache = await read_cache_config(client, pool.endpoints[0][1])
            corpus = await remeasure_corpus(corpus, tokenizer_of(client, pool.endpoints[0][1], pool.model))
            capacity: Capacity | None = None
            if args.load is not None:
                capacity = await calibrate(client, pool, corpus, args)
                rates = [float(x) * capacity.requests_per_s for x in args.load.split(",")]
            elif args.rates is not None:
                rates = [float(x) for x in args.rates.split(",")]
            else:
                rates = [base_rate]
            targets, skipped = build_targets(
                parse_targets(args.targets), args.seed, pool.router_args, args.router_counts
            )
            runs: list[tuple[float, TargetRun[RequestRecord]]] = []
            attempts: list[list[float]] = []
            for rate in rates:
                requests = build_sequence(replace(spec, rate=rate), random.Random(args.seed))
                if args.plan is not None:
                    requests = classed_sequence(replace(spec, rate=rate), requests, args.plan)
                run_one = partial(
                    run_with_retries,
                    client,
                    pool=pool,
                    corpus=corpus,
                    requests=requests,
                    rate=rate,
                    cache=cache,
                    args=args,
                )
                for run, lags in await run_passes(targets, args.repeats, skipped, run_one):
                    runs.append((rate, run))
                    attempts.append(lags)
    setup = describe(args, spec, corpus, working_set, cache, rates, capacity)
    setup["wall time"] = f"{time.monotonic() - started:.0f} s (sizing, replica start-up, calibration, runs)"
    write_outputs(args, setup, runs, attempts, skipped, capacity)
    return 0


async def run_with_retries(
    client: httpx.AsyncClient,
    target: Target,
    pool: Pool,
    corpus: Corpus,
    requests: Sequence[DocQARequest],
    rate: float,
    cache: CacheConfig,
    args: argparse.Namespace,
) -> tuple[TargetRun[RequestRecord], list[float]]:
    """Run one target, again while the load generator itself was late (``loadtests/run_targets.py``)."""

    async def attempt() -> TargetRun[RequestRecord]:
        return await run_target(
            client,
            target,
            pool.endpoints,
            corpus,
            requests,
            pool.model,
            rate=rate,
            max_tokens=args.max_tokens,
            block_size=cache.block_size,
            partition=(args.replicas, cache.num_gpu_blocks - 1),  # vLLM keeps one block back
            drain_timeout_s=args.drain_timeout,
            progress=progress_line(target.label, rate),
            received=pool.received,
        )

    return await run_attempts(attempt, lambda s: markdown_table([s]).splitlines()[-1], target.label, args)


def describe(
    args: argparse.Namespace,
    spec: DocQASpec,
    corpus: Corpus,
    working_set: Sequence[int],
    cache: CacheConfig,
    rates: Sequence[float],
    capacity: Capacity | None,
) -> dict[str, str]:
    """The report's setup section."""
    distinct = corpus.blocks(working_set, cache.block_size)
    cache_blocks = args.replicas * (cache.num_gpu_blocks - 1)
    setup = {
        "backend": args.backend,
        "replicas": replicas_setup(args),
        "KV cache per replica": f"{cache.num_gpu_blocks} blocks of {cache.block_size} tokens",
        "documents": f"{spec.documents}, Zipf exponent {spec.zipf_exponent}, "
        f"{min(corpus.shared_tokens)}-{max(corpus.shared_tokens)} shared tokens each",
        "working set": f"{len(working_set)} documents asked about, {distinct} distinct blocks; all KV caches "
        f"together {cache_blocks} blocks ({cache_blocks / max(1, distinct):.2f}x the working set)",
        "requests": f"max_tokens {spec.max_tokens}, temperature 0, streamed with usage; up to "
        f"{spec.max_requests} requests or {spec.duration_s:.0f} s of arrivals; seed {spec.seed}",
        "rates (requests/s)": ", ".join(f"{r:.2f}" for r in rates),
        "cold capacity": "not measured",
    }
    plan: ClassPlan | None = args.plan
    if plan is not None:
        setup["classes"] = "; ".join(f"at {rate:.2f} requests/s: {plan.describe(rate)}" for rate in rates)
        setup["goodput objective"] = f"TTFT ≤ {args.slo_ms:g} ms"
    if args.router_counts != [1]:
        setup["routers"] = (
            f"each burstsched target with {', '.join(map(str, args.router_counts))} router(s); N > 1: N "
            "independent burstsched serve processes over the same replicas, request i sent to router i mod N"
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


async def calibrate(
    client: httpx.AsyncClient, pool: Pool, corpus: Corpus, args: argparse.Namespace
) -> Capacity:
    count = (args.calibration + 1) * len(pool.endpoints)  # one uncounted warm-up request per replica
    prompts = [
        prompt_text(
            document_text(args.seed + 7919, i, corpus.texts[i % len(corpus.texts)].count("\n")),
            "Question 0: What happened?",
        )
        for i in range(count)
    ]
    print(f"measuring cold capacity ({count} requests)…", file=sys.stderr)
    capacity = await measure_cold_capacity(client, pool.endpoints, pool.model, prompts, args.max_tokens)
    print(f"cold capacity {capacity.requests_per_s:.2f} requests/s", file=sys.stderr)
    return capacity


def write_outputs(
    args: argparse.Namespace,
    setup: dict[str, Any],
    runs: Sequence[tuple[float, TargetRun[RequestRecord]]],
    attempts: Sequence[list[float]],
    skipped: dict[str, str],
    capacity: Capacity | None,
) -> None:
    rows = class_rows(args.plan, runs, args.slo_ms)

    def table(summaries: Sequence[RunSummary]) -> str:
        return markdown_table(summaries) + (f"\n\n{class_table(rows)}" if rows else "")

    write_run_report(
        args.out_dir,
        args.tag or f"docqa-{args.backend}-{args.replicas}r",
        f"Document QA: {args.backend}, {args.replicas} replicas",
        f"{args.backend}, {args.replicas} replicas",
        setup,
        runs,
        attempts,
        skipped,
        capacity,
        table=table,
        page=partial(report_markdown, classes=rows, slo_ms=args.slo_ms),
        extra={} if not rows else {"slo_ms": args.slo_ms, "classes": classes_json(rows)},
    )


def class_rows(
    plan: ClassPlan | None, runs: Sequence[tuple[float, TargetRun[RequestRecord]]], slo_ms: float
) -> list[ClassRow]:
    """Each run's rows per class (none without classes)."""
    if plan is None:
        return []
    return [
        (run.summary, c)
        for _, run in runs
        for c in summarize_classes(plan, run.records, slo_ms, run.summary.makespan_s)
    ]


def classes_json(rows: Sequence[ClassRow]) -> list[dict[str, Any]]:
    """The rows per class for the report's JSON, each with its run's target, rate and pass."""
    return [{"target": s.target, "rate": s.rate, "repeat": s.repeat, **c.as_json()} for s, c in rows]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    # SIGTERM (and SIGINT, which a background job ignores) unwind like Ctrl-C, so routers started in their
    # own sessions and the replicas are stopped by the context managers that started them.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    sys.exit(anyio.run(main, parse_args()))
