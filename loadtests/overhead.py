"""Router overhead: tiny requests through each router vs straight to a backend, all targets in one run.

    python loadtests/overhead.py [--duration 10] [--clients 1,32] [--backends 2]
        [--config config/default.yaml]
        [--peers sglang:cache_aware,vllm-router:round_robin] [--baseline-ref GIT_REF] [--no-trace]
        [--no-floor] [--api chat|completions] [--stream] [--stream-tokens 1] [--slice 1] [--warmup 1]
        [--envoy envoy,envoy+epp,envoy+epp-buffered]
        [--json PATH] [--report loadtests/reports/overhead.md]

Backends: ``--backends`` fake vLLM replicas (loadtests/fast_backend.py: uvloop, prebuilt answers, one process
each), far faster than any router, so a router's cost is not hidden behind a slow backend; the ``direct``
target (straight to backend 0) is their own rate through this load generator.

Targets, each its own process over all backends, stopped by PID at the end (also on Ctrl-C):
``burstsched`` (``burstsched serve --config``, tracing off); ``burstsched+trace`` (every request traced,
OTLP/HTTP to ``python -m burstsched.telemetry.receiver``); with ``--baseline-ref``, ``before`` and
``before+trace``, the same from a temporary ``git worktree`` of that ref (this venv's interpreter,
``PYTHONPATH`` = the worktree and its ``plugins/``); ``python-floor`` (unless ``--no-floor``), the same HTTP
stack as burstsched (uvicorn, aiohttp) with no router logic between (loadtests/python_floor.py), so the
rows show how much of burstsched's cost is its own; with ``--recording``, ``burstsched+rec`` records
traffic (``recording:`` on, lines to a temporary file), and so does ``before+rec`` when there is a
``--baseline-ref``; and the ``--peers`` from their cached venvs
(loadtests/peers; skipped with the reason when a venv is absent: ``python -m loadtests.peers`` builds them);
with ``--envoy``, Envoy (one worker thread) alone as a round-robin proxy (``envoy``), and Envoy in front of
``burstsched epp --config`` in full-duplex ext_proc mode (``envoy+epp``) or with a buffered request body and
no response body (``envoy+epp-buffered``): their CPU is Envoy's plus the picker's; with ``--baseline-ref``
the pickers of that ref too (``before:envoy+epp``...).
``--stream-tokens N``: each stream of the fast backends carries N token events (with ``--stream``).

Load: per concurrency level, closed-loop clients over keep-alive raw sockets (loadtests/http_load.py; fresh
connections each slice). After a warm-up per target, the targets take turns in slices of ``--slice`` seconds
(the order rotating each round) until each has had ``--duration`` seconds, so that noise from elsewhere on
the machine falls on all alike. Compare targets within one run, never absolute figures across runs.

Per target and level: requests/s (and as a share of direct), p50/p99 latency, added p50/p99 vs direct, the
router's CPU per request (user + system time of its whole process group from /proc, over its own slices; its
idle work, like scraping the backends, included), the cores it kept busy, and the backends' and this load
generator's CPU per request. A table on stdout, a markdown report (``--report``), JSON with ``--json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import asdict, dataclass, field
from typing import Any

from burstsched.workloads.proc_cpu import group_cpu_seconds, self_cpu_seconds
from loadtests.http_load import Connection, closed_loop, post_request
from loadtests.overhead_report import Row, Tally, format_table, markdown_report, summarize
from loadtests.overhead_targets import (
    ENVOY_TARGETS,
    REPO,
    Backend,
    Probe,
    Receiver,
    StartError,
    Target,
    burstsched_router,
    check_tree,
    envoy_target,
    fast_backends,
    git_worktree,
    host_port,
    peer,
    python_floor,
    received_spans,
    recording_config,
    trace_receiver,
    traced_env,
    tree_config,
    untraced_env,
)

MODEL = "kv-demo"
DEFAULT_PEERS = "sglang:cache_aware,vllm-router:round_robin"
DEFAULT_REPORT = Path("loadtests") / "reports" / "overhead.md"
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per target and level")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per target and level")
    parser.add_argument("--slice", type=float, default=1.0, help="targets take turns in slices this long (s)")
    parser.add_argument("--clients", default="1,32", help="comma-separated concurrency levels (default 1,32)")
    parser.add_argument(
        "--backends", type=int, default=2, help="fast backends behind the routers (default 2)"
    )
    parser.add_argument("--model", default=MODEL, help="the backends' model name")
    parser.add_argument(
        "--config", type=Path, default=Path("config") / "default.yaml", help="burstsched config"
    )
    parser.add_argument("--api", choices=tuple(PATHS), default="chat", help="the endpoint the clients call")
    parser.add_argument("--stream", action="store_true", help='requests say "stream": true (SSE answers)')
    parser.add_argument(
        "--stream-tokens", type=int, default=1, help="token events in each stream of the backends (default 1)"
    )
    parser.add_argument(
        "--envoy",
        default="none",
        help=f"Envoy targets, comma-separated, or none: {', '.join(ENVOY_TARGETS)} (default: none)",
    )
    parser.add_argument("--no-trace", dest="trace", action="store_false", help="skip the traced targets")
    parser.add_argument("--no-floor", dest="floor", action="store_false", help="skip the python-floor target")
    parser.add_argument(
        "--recording",
        action="store_true",
        help="also run burstsched with recording on (burstsched+rec; before+rec with --baseline-ref)",
    )
    parser.add_argument(
        "--peers",
        default=DEFAULT_PEERS,
        help=f"peer routers KIND:POLICY, comma-separated, or none ({DEFAULT_PEERS})",
    )
    parser.add_argument(
        "--baseline-ref",
        metavar="GIT_REF",
        help="also run burstsched from this git ref, as the 'before' target",
    )
    parser.add_argument("--request-timeout", type=float, default=10.0, help="seconds before a request fails")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument(
        "--report", type=Path, default=DEFAULT_REPORT, help="markdown report (default %(default)s)"
    )
    return parser.parse_args(argv)


def request_body(model: str, api: str, stream: bool, max_tokens: int = 1) -> bytes:
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


# --- measurement ---------------------------------------------------------------------------------------


@dataclass
class Run:
    """The live processes and what every slice needs."""

    targets: list[Target]
    backends: list[Backend]
    receiver: Receiver | None
    probe: Probe
    request_timeout_s: float
    sent: dict[str, int] = field(default_factory=dict)
    """Requests sent to each target, warm-ups included (spans are compared with the traced ones' sum)."""

    def pgids(self) -> list[int]:
        groups = [b.pgid for b in self.backends] + [g for t in self.targets for g in t.pgids]
        return groups + ([self.receiver.pgid] if self.receiver is not None else [])

    async def slice(
        self, target: Target, clients: int, seconds: float, tallies: dict[str, Tally] | None
    ) -> None:
        """Load ``target`` for ``seconds``; add what it measured to ``tallies`` (None: a warm-up). The other
        routers' CPU meanwhile is their idle cost (scraping the backends, health checks)."""
        host, port = host_port(target.url)
        request = post_request(host, port, self.probe.path, self.probe.body)
        connections = [Connection(host, port, request) for _ in range(clients)]
        try:
            # a connection that cannot open now retries in the loop, where its failures count as errors
            await asyncio.wait_for(
                asyncio.gather(*(c.open() for c in connections), return_exceptions=True), 10.0
            )
            pgids = self.pgids()
            before, client_before = group_cpu_seconds(pgids), self_cpu_seconds()
            result = await closed_loop(connections, seconds, request_timeout_s=self.request_timeout_s)
            after, client_after = group_cpu_seconds(pgids), self_cpu_seconds()
        finally:
            for connection in connections:
                connection.close()
        self.sent[target.name] = self.sent.get(target.name, 0) + len(result.latencies) + result.errors
        if tallies is None:
            return
        tally = tallies[target.name]
        tally.load.add(result)
        tally.router_cpu += sum(after[g] - before[g] for g in target.pgids)
        tally.backends_cpu += sum(after[b.pgid] - before[b.pgid] for b in self.backends)
        tally.client_cpu += client_after - client_before
        if self.receiver is not None:
            tally.receiver_cpu += after[self.receiver.pgid] - before[self.receiver.pgid]
        for other in self.targets:
            if other is not target and other.is_router:
                tallies[other.name].idle_cpu += sum(after[g] - before[g] for g in other.pgids)
                tallies[other.name].idle_seconds += result.seconds


async def measure(
    run: Run, levels: list[int], args: argparse.Namespace, progress: Callable[[str], None]
) -> list[Row]:
    rows: list[Row] = []
    slices = max(1, round(args.duration / args.slice))
    slice_s = args.duration / slices
    for clients in levels:
        tallies = {t.name: Tally() for t in run.targets}
        for target in run.targets:
            progress(f"{clients} conn: warm-up {target.name}")
            await run.slice(target, clients, args.warmup, None)
        for i in range(slices):
            k = i % len(run.targets)
            for target in run.targets[k:] + run.targets[:k]:
                progress(f"{clients} conn: slice {i + 1}/{slices} {target.name}")
                await run.slice(target, clients, slice_s, tallies)
        level_rows = summarize(clients, [(t, tallies[t.name]) for t in run.targets])
        progress("")
        print(format_table(level_rows, header=not rows), flush=True)
        rows += level_rows
    return rows


def _progress() -> Callable[[str], None]:
    if not sys.stderr.isatty():
        return lambda _: None
    started = time.monotonic()

    def show(text: str) -> None:
        line = f"[{time.monotonic() - started:5.0f} s] {text}" if text else ""
        sys.stderr.write(f"\r{line:<78}\r" if not text else f"\r{line:<78}")
        sys.stderr.flush()

    return show


# --- the run -------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    setup: dict[str, Any]
    rows: list[Row]
    skipped: list[tuple[str, str]]
    spans: int | None = None
    traced_requests: int = 0


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False, timeout=30
    )
    return done.stdout.strip()


async def _start(
    stack: AsyncExitStack,
    name: str,
    starting: AbstractAsyncContextManager[Target],
    targets: list[Target],
    skipped: list[tuple[str, str]],
) -> None:
    """Enter a target's context; on failure, note why and go on without it."""
    from loadtests.peers import PeerUnavailable

    try:
        targets.append(await stack.enter_async_context(starting))
    except (StartError, PeerUnavailable) as exc:
        skipped.append((name, str(exc)))
        print(f"skipping {name}: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)


async def benchmark(args: argparse.Namespace) -> Outcome:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    if task is not None:  # also when started with SIGINT ignored (a background job of a script)
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, task.cancel)
    levels = [int(c) for c in str(args.clients).split(",") if c.strip()]
    peers = [p.strip() for p in str(args.peers).split(",") if p.strip() and p.strip() != "none"]
    config = (args.config if args.config.is_absolute() else REPO / args.config).resolve()
    probe = Probe(PATHS[args.api], request_body(args.model, args.api, args.stream, args.stream_tokens))
    envoys = [e.strip() for e in str(args.envoy).split(",") if e.strip() and e.strip() != "none"]
    unknown = sorted(set(envoys) - set(ENVOY_TARGETS))
    if unknown:
        raise SystemExit(f"unknown --envoy targets: {', '.join(unknown)} (known: {', '.join(ENVOY_TARGETS)})")
    setup: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--", "burstsched", "plugins", "config")),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "loadavg_start": os.getloadavg(),
        "backends": args.backends,
        "config": str(args.config),
        "levels": levels,
        "duration_s": args.duration,
        "slice_s": args.slice,
        "warmup_s": args.warmup,
        "request": f"POST {probe.path} {probe.body.decode()}",
        "stream_tokens": args.stream_tokens,
    }
    skipped: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="burstsched-overhead-") as tmp:
        logdir = Path(tmp)
        receiver: Receiver | None = None
        async with AsyncExitStack() as stack:
            backends = await stack.enter_async_context(
                fast_backends(args.backends, args.model, logdir, stream_tokens=args.stream_tokens)
            )
            targets = [Target("direct", backends[0].url)]
            if args.trace:
                receiver = await stack.enter_async_context(trace_receiver(logdir))
            routers: list[tuple[str, Path, Path | None]] = [("burstsched", config, None)]
            baseline: tuple[Path, Path] | None = None
            if args.recording:
                routers.append(("burstsched+rec", recording_config(config, logdir), None))
            if args.baseline_ref:
                try:
                    tree, sha = stack.enter_context(git_worktree(args.baseline_ref))
                except StartError as exc:
                    skipped.append(("before", str(exc)))
                else:
                    setup["baseline"] = f"{args.baseline_ref} ({sha[:10]})"
                    problems = check_tree(tree, untraced_env())
                    if problems:
                        skipped.append(("before", "; ".join(problems)))
                    else:
                        before_config = tree_config(tree, args.config)
                        routers.append(("before", before_config, tree))
                        baseline = (tree, before_config)
                        if args.recording:
                            before_logs = logdir / "before"
                            before_logs.mkdir()
                            routers.append(("before+rec", recording_config(before_config, before_logs), tree))
            for name, router_config, tree_path in routers:
                variants = [(name, False)] + ([(f"{name}+trace", True)] if receiver is not None else [])
                for label, traced in variants:
                    env = traced_env(receiver, label) if traced and receiver is not None else untraced_env()
                    starting = burstsched_router(
                        label, router_config, backends, logdir, probe, env=env, tree=tree_path, traced=traced
                    )
                    await _start(stack, label, starting, targets, skipped)
            if args.floor:
                await _start(stack, "python-floor", python_floor(backends, logdir, probe), targets, skipped)
            for name in envoys:
                starting_envoy = envoy_target(name, config, backends, logdir, probe)
                await _start(stack, name, starting_envoy, targets, skipped)
                if baseline is not None and name != "envoy":  # the picker of the baseline ref too
                    before = f"before:{name}"
                    starting_before = envoy_target(
                        name, baseline[1], backends, logdir, probe, tree=baseline[0]
                    )
                    await _start(stack, before, starting_before, targets, skipped)
            for spec in peers:
                await _start(stack, spec, peer(spec, backends, probe), targets, skipped)
            run = Run(targets, backends, receiver, probe, args.request_timeout)
            print(
                f"targets: {', '.join(t.name for t in targets)}; about "
                f"{len(levels) * len(targets) * (args.duration + args.warmup):.0f} s of load",
                file=sys.stderr,
                flush=True,
            )
            rows = await measure(run, levels, args, _progress())
        # every process is stopped here; the receiver printed what it got
        setup["loadavg_end"] = os.getloadavg()
        spans = received_spans(receiver.log) if receiver is not None else None
        traced_requests = sum(run.sent.get(t.name, 0) for t in targets if t.traced)
    return Outcome(setup, rows, skipped, spans, traced_requests)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import uvloop

        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    print(
        f"router overhead: {args.backends} fast backend(s), config {args.config}, {args.duration:g} s per "
        f"target and level, {os.cpu_count()} CPUs",
        flush=True,
    )
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        try:
            outcome = runner.run(benchmark(args))
        except (KeyboardInterrupt, asyncio.CancelledError):
            print("\ninterrupted: every process it started is stopped", file=sys.stderr)
            return 130
    for name, reason in outcome.skipped:
        print(f"skipped {name}: {reason.splitlines()[0] if reason else ''}")
    if outcome.spans is not None:
        print(
            f"trace receiver: {outcome.spans} spans for {outcome.traced_requests} requests to traced targets"
        )
    report_path = args.report if args.report.is_absolute() else REPO / args.report
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(
        markdown_report(outcome.setup, outcome.rows, outcome.skipped, outcome.spans, outcome.traced_requests)
    )
    print(f"report: {report_path}")
    if args.json is not None:
        payload = {
            "setup": outcome.setup,
            "rows": [asdict(r) for r in outcome.rows],
            "skipped": [{"target": n, "reason": r} for n, r in outcome.skipped],
            "spans_received": outcome.spans,
            "traced_requests": outcome.traced_requests,
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 1 if any(r.errors for r in outcome.rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
