"""Tracing's CPU cost per request, in process: the request's share and the export's encoding.

    python loadtests/tracing_cost.py [--requests 10000] [--warmup 1000] [--stream | --no-stream]
        [--prompt-bytes 4096] [--config config/default.yaml] [--json PATH] [--report PATH]

Two routers, the real ASGI app (``create_app``) of the same config, tracing off and on (every request
sampled), live in one process and one event loop, in front of the same fake replica as
``loadtests/recording_cost.py`` (an ``Upstream`` answering at once from prebuilt bytes). The traced router
exports over OTLP/HTTP to ``python -m burstsched.telemetry.receiver`` in a process of its own, so decoding
the spans costs this process nothing. Per variant (JSON, and a stream of one read), a fresh pair of routers:

- warm-up: ``--warmup`` requests to each, then a full collection and ``gc.freeze()``;
- loop: ``--requests`` pairs, one request to each router per pair, the order swapped every pair; each
  request's CPU is the event-loop thread's ``time.thread_time`` around the app call (span records, their
  attributes, the ``traceparent``). Per router the median; on − off as the median and p90 of the paired
  differences;
- export: the batcher's encoding on the same loop between requests (``SpanBatcher.encode_cpu_s``), per
  request. The POST itself (one per ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` spans, 512 by default) is not timed;
- total: loop difference + encoding per request.

The receiver decodes in Python, slower than this bench makes spans, so the span queue is raised to hold
the whole run (``OTEL_BSP_MAX_QUEUE_SIZE``, unless set): no span is dropped while the receiver catches up.
Every request must make its SERVER and CLIENT spans (the first request of the prefix also waits in a
window, which adds an admission span), the receiver must get every span the routers exported, and no
request may fail; otherwise the run is an error (exit 1). A table on stdout,
markdown with ``--report``, JSON with ``--json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import gc
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass

from burstsched.config import EndpointConfig, RouterConfig, TracingConfig, parse_config_text
from burstsched.front.app import create_app
from burstsched.replay.asgi_io import lifespan
from burstsched.telemetry import Tracing
from loadtests.recording_cost import (
    ENDPOINT,
    ENDPOINT_URL,
    FakeReplica,
    InProcessClient,
    Variant,
    _us,
    alternate,
    request_body,
)

REPO = Path(__file__).resolve().parents[1]
SPANS_PER_REQUEST = 2
RECEIVER_START_TIMEOUT_S = 30.0
EXPORT_TIMEOUT_S = 60.0


@dataclass
class VariantResult:
    variant: str
    requests: int
    warmup: int
    loop_off_us: float
    loop_on_us: float
    diff_median_us: float
    diff_p90_us: float
    encode_per_request_us: float
    total_us: float
    spans_exported: int
    spans_dropped: int
    bad_responses: int


def router_config(base: RouterConfig, traces_url: str | None) -> RouterConfig:
    tracing = TracingConfig(enabled=traces_url is not None, endpoint=traces_url, sample_ratio=1.0)
    endpoints = [EndpointConfig(name=ENDPOINT, url=ENDPOINT_URL)]
    return base.model_copy(update={"endpoints": endpoints, "tracing": tracing})


async def _exported(tracing: Tracing, spans: int) -> None:
    """Until at least ``spans`` spans were sent or dropped and none waits (bounded)."""
    batcher = tracing.batcher
    async with asyncio.timeout(EXPORT_TIMEOUT_S):
        while batcher.exported + batcher.dropped < spans or batcher.queued:
            if batcher.queued:
                await batcher.export_batch()
            else:
                await asyncio.sleep(0.005)  # noqa: ASYNC110 - spans of requests still ending


async def measure(
    variant: Variant, base: RouterConfig, args: argparse.Namespace, traces_url: str
) -> VariantResult:
    body = request_body(args.prompt_bytes, variant.stream)
    replica = FakeReplica(variant, args.prompt_bytes // 4)
    off_app = create_app(router_config(base, None), upstream=replica)
    on_app = create_app(router_config(base, traces_url), upstream=replica)
    off, on = InProcessClient(off_app, body), InProcessClient(on_app, body)
    async with lifespan(off_app), lifespan(on_app):
        tracing: Tracing = on_app.state.router.tracing
        await alternate(off, on, args.warmup)
        await _exported(tracing, args.warmup * SPANS_PER_REQUEST)
        gc.collect()
        gc.freeze()
        try:
            encode_start = tracing.batcher.encode_cpu_s
            offs, ons = await alternate(off, on, args.requests)
            await _exported(tracing, (args.warmup + args.requests) * SPANS_PER_REQUEST)
            encode_ns = (tracing.batcher.encode_cpu_s - encode_start) * 1e9
        finally:
            gc.unfreeze()
        exported, dropped = tracing.batcher.exported, tracing.batcher.dropped
    diffs = [b - a for a, b in zip(offs, ons, strict=True)]
    diff_median = statistics.median(diffs)
    encode_per_request = encode_ns / args.requests
    return VariantResult(
        variant=variant.name,
        requests=args.requests,
        warmup=args.warmup,
        loop_off_us=_us(statistics.median(offs)),
        loop_on_us=_us(statistics.median(ons)),
        diff_median_us=_us(diff_median),
        diff_p90_us=_us(statistics.quantiles(diffs, n=10, method="inclusive")[-1]),
        encode_per_request_us=_us(encode_per_request),
        total_us=_us(diff_median + encode_per_request),
        spans_exported=exported,
        spans_dropped=dropped,
        bad_responses=off.bad + on.bad,
    )


# --- the receiver -------------------------------------------------------------------------------------------


class ReceiverProcess:
    """``python -m burstsched.telemetry.receiver`` on a free 127.0.0.1 port; :meth:`stop` reads its count."""

    def __init__(self) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "burstsched.telemetry.receiver", "--port", str(self.port)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    @property
    def traces_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def wait_ready(self) -> None:
        deadline = time.monotonic() + RECEIVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("the trace receiver exited at start")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError("the trace receiver did not start")

    def stop(self) -> int:
        """Stop it (SIGTERM, by PID) and return how many spans it received."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            out, _ = self.process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, _ = self.process.communicate()
        found = re.search(r"received (\d+) spans", out or "")
        return int(found.group(1)) if found else -1


# --- output -------------------------------------------------------------------------------------------------

_HEAD = (
    "| variant | loop off µs | loop on µs | on − off median µs | on − off p90 µs | encode µs/request "
    "| total µs |"
)


def table(results: list[VariantResult]) -> str:
    rows = [_HEAD, "|" + "---|" * 7]
    for r in results:
        rows.append(
            f"| {r.variant} | {r.loop_off_us:.1f} | {r.loop_on_us:.1f} | {r.diff_median_us:+.1f} "
            f"| {r.diff_p90_us:+.1f} | {r.encode_per_request_us:.1f} | {r.total_us:.1f} |"
        )
    return "\n".join(rows)


def problems(results: list[VariantResult], received: int) -> list[str]:
    """What makes the run invalid (not its timings): failed requests, spans lost or missing."""
    found = []
    for r in results:
        least = (r.warmup + r.requests) * SPANS_PER_REQUEST
        if r.bad_responses:
            found.append(f"{r.variant}: {r.bad_responses} responses were not 200")
        if r.spans_dropped:
            found.append(f"{r.variant}: {r.spans_dropped} spans dropped")
        if r.spans_exported < least:
            found.append(f"{r.variant}: {r.spans_exported} spans exported, fewer than {least}")
    exported = sum(r.spans_exported for r in results)
    if received != exported:
        found.append(f"the receiver got {received} spans, the routers exported {exported}")
    return found


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it is inside it (reports carry no machine's paths)."""
    resolved = path.resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=10000, help="measured pairs per variant")
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--stream", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--prompt-bytes", type=int, default=4096)
    parser.add_argument("--config", type=Path, default=REPO / "config" / "default.yaml")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--report", type=Path)
    args = parser.parse_args(argv)
    if args.requests < 10 or args.warmup < 0:
        parser.error("--requests ≥ 10 and --warmup ≥ 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = parse_config_text(args.config.read_text())
    spans = (args.warmup + args.requests) * SPANS_PER_REQUEST
    os.environ.setdefault("OTEL_BSP_MAX_QUEUE_SIZE", str(spans))  # read by the traced router's lifespan
    chosen = [Variant(stream=s) for s in (False, True) if args.stream in (None, s)]
    receiver = ReceiverProcess()
    results: list[VariantResult] = []
    try:
        receiver.wait_ready()
        for variant in chosen:
            results.append(asyncio.run(measure(variant, base, args, receiver.traces_url)))
            print(f"{variant.name}: done", file=sys.stderr, flush=True)
    finally:
        received = receiver.stop()
    text = table(results)
    print(text)
    found = problems(results, received)
    for problem in found:
        print(f"error: {problem}", file=sys.stderr)
    setup = {
        "config": _shown(args.config),
        "requests": args.requests,
        "warmup": args.warmup,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "spans_received": received,
    }
    if args.json is not None:
        payload = {"setup": setup, "results": [asdict(r) for r in results], "problems": found}
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    if args.report is not None:
        args.report.write_text(
            "# Tracing's cost per request, in process\n\n"
            f"`python loadtests/tracing_cost.py --requests {args.requests} --warmup {args.warmup}` "
            f"(config `{args.config.name}`, Python {setup['python']}, {setup['cpus']} CPUs; "
            f"{received} spans received).\n\n{text}\n"
        )
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
