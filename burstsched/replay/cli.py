"""``burstsched replay TRACE --config A.yaml [--config B.yaml ...] [--sweep key=v1,v2 ...]``.

Rebuilds the trace's prompts (same sharing structure, synthetic text), replays them on a simulated pool
through each config in turn (or each point of the ``--sweep`` grid over the first config, within
``--budget-s``), prints the side-by-side table and writes ``replay.md``, ``replay.json`` and PNG plots under
``--out``. With a sweep it names the best config under ``--objective`` (default ``ttft_p95``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import anyio

from burstsched.config import ConfigError, RouterConfig, load_config
from burstsched.replay.calibrate import calibrate
from burstsched.replay.fidelity import HEADER as FIDELITY_HEADER
from burstsched.replay.rebuild import rebuild_prompts
from burstsched.replay.report import (
    OBJECTIVES,
    best,
    flow_line,
    placement_fidelity,
    recorded_row,
    row,
    text_table,
    write_report,
)
from burstsched.replay.runner import DEFAULT_BLOCK_SIZE, ReplayOptions, ReplayResult, replay_one
from burstsched.replay.sweep import SweepError, grid, parse_axis
from burstsched.replay.trace import (
    LONG_GAP_S,
    ReplicaGeometry,
    TracedRequest,
    longest_gap,
    read_replicas,
    read_trace,
    simulated_cache,
    summarize_trace,
)
from burstsched.replay.virtual_run import RecordedPlacement, replay_virtual_all
from burstsched.sim import CostModel


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "trace", nargs="+", type=Path, help="recorded JSONL file(s), rotated ones oldest first (.gz: gzip)"
    )
    parser.add_argument("--config", action="append", type=Path, default=[], help="a router config (repeat)")
    parser.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2", help="a grid axis")
    parser.add_argument("--replicas", type=int, default=2, help="simulated replicas (default 2)")
    parser.add_argument(
        "--kv-blocks",
        type=int,
        default=None,
        help="KV blocks per replica (of --block-size tokens each; default: as the trace recorded them, "
        "else the simulator's)",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=None,
        help=f"tokens per KV block (default: as the trace recorded them, else {DEFAULT_BLOCK_SIZE})",
    )
    parser.add_argument(
        "--max-batched-tokens",
        type=int,
        default=None,
        help="tokens one engine step computes at most, as on the recorded replicas (vLLM's "
        "max_num_batched_tokens; on CPU 2048; default: the simulator's)",
    )
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="sequences running at once, as on the recorded replicas",
    )
    parser.add_argument(
        "--no-calibrate",
        action="store_true",
        help="keep the simulator's default speed instead of fitting it to the trace's recorded TTFTs",
    )
    parser.add_argument(
        "--metrics-render-ms",
        type=float,
        default=0.0,
        help="what each /metrics GET costs a replica: it holds the API server's loop and the engine's core "
        "this long (vLLM on CPU: 6-12 ms). Default 0: scrapes are free. A trace recorded with a short "
        "scrape interval already carries the cost in its fitted step times",
    )
    parser.add_argument("--speed", type=float, default=1.0, help="arrival-rate multiplier (default 1)")
    parser.add_argument(
        "--text-seed",
        type=int,
        default=0,
        help="seed of the rebuilt prompts' synthetic words (same sharing structure, other token counts) "
        "and of the router's random choices: what moves with it is the replay's own noise",
    )
    parser.add_argument(
        "--realtime",
        action="store_true",
        help="replay in real time over sockets through a `burstsched serve` process (the router's own CPU "
        "counts) instead of in one process on virtual time (the default: as fast as the CPU allows)",
    )
    parser.add_argument(
        "--record-dir",
        type=Path,
        default=None,
        help="each replayed router records its requests, with its decisions, to DIR/<config label>.jsonl "
        "(virtual time only): set them beside a live recording made with recording.decisions",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="configs replayed at once on virtual time, one process each (default: the CPU count, at most 4)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=0.25,
        help="with --realtime: simulator time per real second (default 0.25: 4x)",
    )
    parser.add_argument("--budget-s", type=float, default=None, help="stop starting configs after this long")
    parser.add_argument(
        "--recorded-placement",
        action="store_true",
        help="also replay each request straight to the replica standing for its recorded endpoint (no "
        "router): a row that shows the simulator's own fidelity, apart from any config's decisions",
    )
    parser.add_argument("--objective", choices=sorted(OBJECTIVES), default="ttft_p95")
    parser.add_argument("--max-requests", type=int, default=None, help="replay only the first N requests")
    parser.add_argument("--out", type=Path, default=Path("replay-out"), help="report folder")


def _configs(args: argparse.Namespace) -> list[tuple[str, RouterConfig]]:
    named = [(path.stem, load_config(path)) for path in args.config]
    if not args.sweep:
        return named or [("default", RouterConfig())]
    base = named[0][1] if named else RouterConfig()
    return grid(base, [parse_axis(text) for text in args.sweep])


async def replay_all(
    configs: list[tuple[str, RouterConfig]],
    requests: list[TracedRequest],
    options: ReplayOptions,
    budget_s: float | None = None,
    progress: bool = True,
) -> tuple[list[ReplayResult], list[str], float]:
    """Replay through each config in turn in real time; configs whose turn comes once the budget cannot fit
    one more run (the longest so far) are skipped."""
    prompts = rebuild_prompts(requests, options.text_seed)
    started = time.perf_counter()
    results: list[ReplayResult] = []
    skipped: list[str] = []
    longest = 0.0
    for label, config in configs:
        elapsed = time.perf_counter() - started
        if budget_s is not None and results and elapsed + longest > budget_s:
            skipped.append(label)
            continue
        result = await replay_one(label, config, requests, prompts, options)
        longest = max(longest, result.wall_s)
        results.append(result)
        if progress:
            print(f"replayed {label}: {result.wall_s:.1f} s", file=sys.stderr, flush=True)
    return results, skipped, time.perf_counter() - started


def _replay(
    args: argparse.Namespace,
    configs: list[tuple[str, RouterConfig]],
    requests: list[TracedRequest],
    options: ReplayOptions,
) -> tuple[ReplayResult | None, list[ReplayResult], list[str], float]:
    """(the recorded-placement row when asked for, the configs' results, the skipped labels, seconds)."""
    if args.realtime:
        return None, *anyio.run(replay_all, configs, requests, options, args.budget_s)
    jobs = args.jobs if args.jobs is not None else min(4, os.cpu_count() or 1)
    runs: list[tuple[str, RouterConfig | RecordedPlacement]] = list(configs)
    if args.recorded_placement:  # first, in the same worker pool as the configs
        runs.insert(0, (RecordedPlacement.label, RecordedPlacement()))
    results, skipped, elapsed = replay_virtual_all(runs, requests, options, jobs=jobs, budget_s=args.budget_s)
    placement = results.pop(0) if args.recorded_placement else None
    return placement, results, skipped, elapsed


def simulated_kv_cache(args: argparse.Namespace, found: dict[str, ReplicaGeometry]) -> tuple[int | None, int]:
    """(KV blocks, block size) of the simulated replicas: the flags, else as the trace recorded them (the
    recorded tokens when only ``--block-size`` is given), else the defaults."""
    recorded = simulated_cache(found)
    if recorded is not None and (args.kv_blocks is None or args.block_size is None):
        listed = ", ".join(f"{n} {g.num_gpu_blocks}×{g.block_size}" for n, g in sorted(found.items()))
        differ = len(set(found.values())) > 1
        print(
            f"KV caches recorded: {listed}"
            + (
                f"; each simulated replica gets the smallest, {recorded.num_gpu_blocks}×{recorded.block_size}"
                if differ
                else ""
            )
        )
    block_size = int(args.block_size) if args.block_size is not None else None
    if recorded is None:
        return args.kv_blocks, block_size or DEFAULT_BLOCK_SIZE
    block_size = block_size or recorded.block_size
    kv_blocks: int = args.kv_blocks or recorded.num_gpu_blocks * recorded.block_size // block_size
    return kv_blocks, block_size


def _flag_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags by themselves, checked before the trace is read and fitted."""
    if args.jobs is not None and args.jobs < 1:
        return "--jobs must be at least 1"
    if args.metrics_render_ms < 0:
        return "--metrics-render-ms must be at least 0"
    if args.record_dir is not None and args.realtime:
        return "--record-dir replays on virtual time only"
    if args.recorded_placement and args.realtime:
        return "--recorded-placement replays on virtual time only"
    return None


def run(args: argparse.Namespace) -> int:
    error = _flag_error(args)
    if error is not None:
        print(f"burstsched replay: {error}", file=sys.stderr)
        return 2
    try:
        configs = _configs(args)
    except (ConfigError, SweepError) as exc:
        print(f"burstsched replay: {exc}", file=sys.stderr)
        return 2
    try:
        requests = read_trace(args.trace)
    except OSError as exc:
        print(f"burstsched replay: cannot read the trace: {exc}", file=sys.stderr)
        return 2
    except (ValueError, KeyError, TypeError) as exc:  # a line that is no trace line
        print(f"burstsched replay: not a trace: {exc!r}", file=sys.stderr)
        return 2
    if args.max_requests is not None:
        requests = requests[: args.max_requests]
    gap, after = longest_gap(requests)
    if gap >= LONG_GAP_S:
        print(
            f"note: the trace pauses {gap / 3600.0:.1f} h before request {after + 1} of {len(requests)}: "
            "recordings of different runs in one file (the recorder appends)? Each replays best apart"
        )
    kv_blocks, block_size = simulated_kv_cache(args, read_replicas(args.trace))
    if not requests:
        print("burstsched replay: the trace holds no request", file=sys.stderr)
        return 2
    calibration = None if args.no_calibrate else calibrate(requests)
    if calibration is not None:
        print(calibration.describe())
    elif not args.no_calibrate:
        print("too few recorded TTFTs to calibrate: the simulator keeps its default speed")
    cost = None if calibration is None else calibration.cost
    if args.metrics_render_ms > 0:
        cost = replace(cost or CostModel(), metrics_render_s=args.metrics_render_ms / 1000.0)
    elif len({config.pool.scrape_interval_ms for _, config in configs}) > 1:
        print(
            "note: the configs scrape /metrics at different intervals, and each scrape costs the simulated "
            "replicas nothing: set --metrics-render-ms (vLLM on CPU: 6-12 ms a scrape)"
        )
    if args.recorded_placement:
        endpoints = {r.endpoint for r in requests if r.endpoint is not None}
        if len(endpoints) > args.replicas:
            print(
                f"burstsched replay: --recorded-placement needs --replicas {len(endpoints)} or more "
                f"(the trace has {len(endpoints)} endpoints)",
                file=sys.stderr,
            )
            return 2
    options = ReplayOptions(
        replicas=args.replicas,
        kv_blocks=kv_blocks,
        speed=args.speed,
        time_scale=args.time_scale if args.realtime else 1.0,
        virtual_time=not args.realtime,
        text_seed=args.text_seed,
        block_size=block_size,
        max_num_batched_tokens=args.max_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        cost=cost,
        record_dir=args.record_dir,
    )
    placement, results, skipped, elapsed = _replay(args, configs, requests, options)
    summary = summarize_trace(requests)
    shown = [recorded_row(summary), *([] if placement is None else [row(placement)])]
    print(text_table([*shown, *(row(r) for r in results)]))
    for line in filter(None, map(flow_line, results)):
        print(f"flow control, {line}")
    if placement is not None:
        print("recorded placement against the recording, by kind of request:")
        print(text_table(placement_fidelity(requests, placement), FIDELITY_HEADER))
    winner = best(results, args.objective)
    if len(results) > 1 and winner is not None:
        print(f"best under {args.objective}: {winner.label}")
    if skipped:
        print(f"not run (time budget): {len(skipped)} configs")
    paths = write_report(
        args.out,
        args.trace[0].name,
        summary,
        results,
        options,
        args.objective,
        skipped,
        elapsed,
        placement,
        requests,
    )
    print(f"report: {paths['markdown']}")
    return 0
