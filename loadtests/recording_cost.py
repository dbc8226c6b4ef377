"""Recording's CPU cost per request, in process: the request's share and the flushes' share.

    python loadtests/recording_cost.py [--requests 20000] [--stream | --no-stream] [--reads 1,100]
        [--warmup 1000] [--prompt-bytes 4096] [--config config/default.yaml]
        [--json PATH] [--report PATH]

Two routers, the real ASGI app (``create_app``) of the same config, recording off and on (its file in a
temporary directory), live in one process and one event loop, in front of the same fake replica (an
``Upstream`` that answers at once from prebuilt bytes: a chat completion as JSON, or as SSE with its usage
in ``--reads`` reads). No sockets and no server: each request is one call of the app with the ASGI
messages uvicorn would pass, so the only work measured is the router's. Per variant (JSON; streams of each
``--reads``), a fresh pair of routers:

- warm-up: ``--warmup`` requests to each, then a full collection and ``gc.freeze()``: both routers meet the
  measured requests with the same heap, and the cyclic GC stays on for both;
- loop: ``--requests`` pairs, one request to each router per pair, the order swapped every pair; each
  request's CPU is the event-loop thread's ``time.thread_time`` around the app call. Between requests the
  loop runs once (``asyncio.sleep(0)``), so the pool's scrapes and health checks go on, outside the
  measured calls. Per router the median; on − off as the median and p90 of the paired differences;
- flush: the recorder's flushes run on the same loop between requests (its task, every
  ``flush_interval_ms``), outside the timed app calls; each times itself with ``time.thread_time`` (the
  formatting and the ``write``), and ``Recorder.flush_cpu_s`` over the measured requests, per line, is
  their share;
- total: loop difference + flush per line, against the target (at most ``TARGET_US``).

Every line the recording router wrote is read back and checked (one per request, warm-up included, with
the request's stream flag, usage counts and endpoint), and the router without recording must write none;
an error response or a bad line is an error (exit 1). A table on stdout, markdown with ``--report``, JSON
with ``--json``.
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
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive

from burstsched.config import EndpointConfig, RouterConfig, parse_config_text
from burstsched.dispatch.upstream import Timeouts, UpstreamResponse
from burstsched.front.app import create_app
from burstsched.recording import Recorder, parse_chain
from burstsched.replay.asgi_io import lifespan

REPO = Path(__file__).resolve().parents[1]
MODEL = "kv-demo"
ENDPOINT = "r1"
ENDPOINT_URL = "http://r1:8000"
TARGET_US = 10.0
"""Recording's budget per request: loop difference + flush per line, in µs."""
COMPLETION_TOKENS = 16
DRAIN_TIMEOUT_S = 30.0
_METRICS = (
    f'# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{model_name="{MODEL}"}} 0\n'
    f'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name="{MODEL}"}} 0\n'
    f'# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{model_name="{MODEL}"}} 0.1\n'
).encode()
_MODELS = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()


# --- the fake replica ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """What the replica answers: JSON, or SSE in ``reads`` reads."""

    stream: bool
    reads: int = 1

    @property
    def name(self) -> str:
        if not self.stream:
            return "json"
        return f"stream, {self.reads} read{'s' if self.reads > 1 else ''}"


def _usage(prompt_tokens: int) -> dict[str, Any]:
    """``usage`` in vLLM's field order (``prompt_tokens_details``: ``--enable-prompt-tokens-details``)."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + COMPLETION_TOKENS,
        "completion_tokens": COMPLETION_TOKENS,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def answer_reads(variant: Variant, prompt_tokens: int) -> list[bytes]:
    """The completion's body as the replica hands it over: one read of JSON, or ``reads`` SSE reads (one
    content event each, the last one followed by the usage event and ``[DONE]``)."""
    head = {"id": "chatcmpl-bench", "created": 0, "model": MODEL}
    if not variant.stream:
        message = {"role": "assistant", "content": "ok " * COMPLETION_TOKENS}
        choice = {"index": 0, "message": message, "finish_reason": "length"}
        body = {**head, "object": "chat.completion", "choices": [choice], "usage": _usage(prompt_tokens)}
        return [json.dumps(body, separators=(",", ":")).encode()]
    chunk = {**head, "object": "chat.completion.chunk"}
    reads = [
        _event({**chunk, "choices": [{"index": 0, "delta": {"content": f" t{i}"}}], "usage": None})
        for i in range(variant.reads)
    ]
    reads[-1] += _event({**chunk, "choices": [], "usage": _usage(prompt_tokens)}) + b"data: [DONE]\n\n"
    return reads


class _Response:
    def __init__(self, status: int, content_type: bytes, reads: list[bytes]) -> None:
        self.status = status
        self.headers = [(b"content-type", content_type)]
        self._reads = reads

    async def iter_body(self) -> AsyncIterator[bytes]:
        for read in self._reads:
            yield read

    async def aclose(self) -> None:
        return None


class FakeReplica:
    """An :class:`~burstsched.dispatch.upstream.Upstream` answering at once from prebuilt bytes: health,
    ``/metrics``, ``/v1/models``, and every completion with the variant's answer."""

    def __init__(self, variant: Variant, prompt_tokens: int) -> None:
        self._answer = answer_reads(variant, prompt_tokens)
        self._content_type = b"text/event-stream" if variant.stream else b"application/json"

    async def request(
        self, method: str, url: str, headers: list[tuple[bytes, bytes]], body: bytes, timeouts: Timeouts
    ) -> UpstreamResponse:
        if url.endswith("/completions"):
            return _Response(200, self._content_type, self._answer)
        if url.endswith("/metrics"):
            return _Response(200, b"text/plain", [_METRICS])
        if url.endswith("/v1/models"):
            return _Response(200, b"application/json", [_MODELS])
        return _Response(200, b"text/plain", [b""])  # /health and anything else


# --- one request through an app -----------------------------------------------------------------------------


class InProcessClient:
    """Calls one router app as uvicorn would for one request at a time; keeps the last status."""

    def __init__(self, app: ASGIApp, body: bytes) -> None:
        self._app = app
        self._message: Message = {"type": "http.request", "body": body, "more_body": False}
        self._headers = [
            (b"host", b"router"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        self.status = 0
        self.bad = 0

    def _scope(self) -> dict[str, Any]:
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/v1/chat/completions",
            "raw_path": b"/v1/chat/completions",
            "query_string": b"",
            "root_path": "",
            "headers": list(self._headers),
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000),
            "state": {},
        }

    def _receive(self) -> Receive:
        message: Message | None = self._message

        async def receive() -> Message:
            nonlocal message
            if message is not None:
                sent, message = message, None
                return sent
            await asyncio.get_running_loop().create_future()  # no disconnect: the router cancels its watcher
            return {"type": "http.disconnect"}

        return receive

    async def _send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]

    async def timed(self) -> int:
        """One request; the event-loop thread's CPU ns for the app call."""
        scope, receive = self._scope(), self._receive()
        self.status = 0
        start = time.thread_time_ns()
        await self._app(scope, receive, self._send)
        spent = time.thread_time_ns() - start
        if self.status != 200:
            self.bad += 1
        return spent


def request_body(prompt_bytes: int, stream: bool) -> bytes:
    """A chat request whose prompt is ``prompt_bytes`` of a document (the same for every request)."""
    words = " ".join(f"line {i} of the shared document." for i in range(prompt_bytes // 20 + 1))
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": words[:prompt_bytes]}],
        "max_tokens": COMPLETION_TOKENS,
        "temperature": 0,
    }
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return json.dumps(body).encode()


async def alternate(off: InProcessClient, on: InProcessClient, pairs: int) -> tuple[list[int], list[int]]:
    """``pairs`` requests to each, taking turns (the order swapped every pair): CPU ns off, on."""
    offs: list[int] = []
    ons: list[int] = []
    for i in range(pairs):
        first, second = (on, off) if i % 2 else (off, on)
        spent_first = await first.timed()
        await asyncio.sleep(0)
        spent_second = await second.timed()
        await asyncio.sleep(0)
        on_ns, off_ns = (spent_first, spent_second) if i % 2 else (spent_second, spent_first)
        offs.append(off_ns)
        ons.append(on_ns)
    return offs, ons


# --- the flushes --------------------------------------------------------------------------------------------


async def flushed(recorder: Recorder, lines: int) -> None:
    """Until the recorder has written ``lines`` lines in all (bounded)."""
    async with asyncio.timeout(DRAIN_TIMEOUT_S):
        while recorder.written < lines:  # noqa: ASYNC110 - the recorder's flush task counts them
            await asyncio.sleep(0.005)


# --- one variant --------------------------------------------------------------------------------------------


@dataclass
class VariantResult:
    variant: str
    stream: bool
    reads: int | None
    requests: int
    warmup: int
    loop_off_us: float
    loop_on_us: float
    diff_median_us: float
    diff_p90_us: float
    flush_per_line_us: float
    total_us: float
    target_us: float
    passed: bool
    lines_on: int
    lines_valid: int
    lines_off: int
    bad_responses: int


def router_config(base: RouterConfig, trace: Path, recording: bool) -> RouterConfig:
    endpoints = [EndpointConfig(name=ENDPOINT, url=ENDPOINT_URL)]
    settings = base.recording.model_copy(update={"enabled": recording, "path": str(trace)})
    return base.model_copy(update={"endpoints": endpoints, "recording": settings})


def count_lines(trace: Path) -> int:
    return len(trace.read_bytes().splitlines()) if trace.exists() else 0


def valid_lines(trace: Path, variant: Variant, prompt_tokens: int) -> int:
    """Lines that hold what the request was: its stream flag, the replica's usage, the endpoint."""
    valid = 0
    for raw in trace.read_bytes().splitlines() if trace.exists() else []:
        line = json.loads(raw)
        valid += (
            line["stream"] is variant.stream
            and line["outcome"] == "ok"
            and line["endpoint"] == ENDPOINT
            and line["output_tokens"] == COMPLETION_TOKENS
            and line["input_tokens"] == prompt_tokens
            and len(parse_chain(line["blocks"])) == line["prompt_tokens"] // line["block_tokens"] > 0
        )
    return valid


def _us(ns: float) -> float:
    return round(ns / 1000.0, 2)


async def measure(
    variant: Variant, base: RouterConfig, args: argparse.Namespace, workdir: Path
) -> VariantResult:
    """A fresh pair of routers for ``variant``: warm-up, the measured pairs, the flushes' CPU per line."""
    key = "json" if not variant.stream else f"stream{variant.reads}"
    on_trace, off_trace = workdir / f"{key}-on.jsonl", workdir / f"{key}-off.jsonl"
    body = request_body(args.prompt_bytes, variant.stream)
    prompt_tokens = args.prompt_bytes // 4  # what the replica's usage says (any fixed count)
    replica = FakeReplica(variant, prompt_tokens)
    off_app = create_app(router_config(base, off_trace, False), upstream=replica)
    on_app = create_app(router_config(base, on_trace, True), upstream=replica)
    off, on = InProcessClient(off_app, body), InProcessClient(on_app, body)
    async with lifespan(off_app), lifespan(on_app):
        recorder: Recorder = on_app.state.router.recorder
        await alternate(off, on, args.warmup)
        await flushed(recorder, args.warmup)
        gc.collect()
        gc.freeze()
        try:
            flush_start = recorder.flush_cpu_s
            offs, ons = await alternate(off, on, args.requests)
            await flushed(recorder, args.warmup + args.requests)
            flush_ns = (recorder.flush_cpu_s - flush_start) * 1e9
        finally:
            gc.unfreeze()
    diffs = [b - a for a, b in zip(offs, ons, strict=True)]
    diff_median = statistics.median(diffs)
    flush_per_line = flush_ns / args.requests
    total_us = _us(diff_median + flush_per_line)
    return VariantResult(
        variant=variant.name,
        stream=variant.stream,
        reads=variant.reads if variant.stream else None,
        requests=args.requests,
        warmup=args.warmup,
        loop_off_us=_us(statistics.median(offs)),
        loop_on_us=_us(statistics.median(ons)),
        diff_median_us=_us(diff_median),
        diff_p90_us=_us(statistics.quantiles(diffs, n=10, method="inclusive")[-1]),
        flush_per_line_us=_us(flush_per_line),
        total_us=total_us,
        target_us=TARGET_US,
        passed=total_us <= TARGET_US,
        lines_on=count_lines(on_trace),
        lines_valid=valid_lines(on_trace, variant, prompt_tokens),
        lines_off=count_lines(off_trace),
        bad_responses=off.bad + on.bad,
    )


# --- output -------------------------------------------------------------------------------------------------

_HEAD = (
    "| variant | loop off µs | loop on µs | on − off median µs | on − off p90 µs | flush µs/line "
    "| total µs | target | |"
)


def table(results: list[VariantResult]) -> str:
    rows = [_HEAD, "|" + "---|" * 9]
    for r in results:
        verdict = "pass" if r.passed else "FAIL"
        rows.append(
            f"| {r.variant} | {r.loop_off_us:.1f} | {r.loop_on_us:.1f} | {r.diff_median_us:+.2f} "
            f"| {r.diff_p90_us:+.2f} | {r.flush_per_line_us:.2f} | {r.total_us:.2f} | ≤ {r.target_us:g} "
            f"| {verdict} |"
        )
    return "\n".join(rows)


def problems(results: list[VariantResult]) -> list[str]:
    """What makes the run invalid (not its timings): error responses, missing or wrong lines."""
    found = []
    for r in results:
        expected = r.warmup + r.requests
        if r.bad_responses:
            found.append(f"{r.variant}: {r.bad_responses} responses were not 200")
        if r.lines_on != expected or r.lines_valid != expected:
            found.append(f"{r.variant}: {r.lines_on} lines ({r.lines_valid} valid), expected {expected}")
        if r.lines_off:
            found.append(f"{r.variant}: the router without recording wrote {r.lines_off} lines")
    return found


def variants(args: argparse.Namespace) -> list[Variant]:
    chosen: list[Variant] = []
    if args.stream is not True:
        chosen.append(Variant(stream=False))
    if args.stream is not False:
        chosen += [Variant(stream=True, reads=k) for k in args.reads]
    return chosen


def _reads(text: str) -> list[int]:
    reads = [int(part) for part in text.split(",") if part.strip()]
    if not reads or min(reads) < 1:
        raise argparse.ArgumentTypeError("reads: positive integers, comma-separated")
    return reads


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--requests", type=int, default=20000, help="measured requests per router and variant"
    )
    parser.add_argument("--warmup", type=int, default=1000, help="warm-up requests per router and variant")
    stream = parser.add_mutually_exclusive_group()
    stream.add_argument("--stream", dest="stream", action="store_true", default=None, help="streams only")
    stream.add_argument("--no-stream", dest="stream", action="store_false", help="JSON responses only")
    parser.add_argument("--reads", type=_reads, default=[1, 100], help="SSE reads per stream (default 1,100)")
    parser.add_argument("--prompt-bytes", type=int, default=4096, help="the prompt's size")
    parser.add_argument("--config", type=Path, default=Path("config") / "default.yaml")
    parser.add_argument("--json", type=Path, default=None, help="write the results as JSON")
    parser.add_argument("--report", type=Path, default=None, help="write a markdown report")
    args = parser.parse_args(argv)
    if args.requests < 2 or args.warmup < 0:
        parser.error("--requests must be at least 2, --warmup at least 0")
    return args


def environment() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def markdown(results: list[VariantResult], command: str, env: dict[str, Any]) -> str:
    return (
        "# Recording's CPU cost per request (in process)\n\n"
        f"`{command}`\n\nPython {env['python']}, {env['cpus']} CPUs, load average {env['load_average']} "
        "at the start.\n\n"
        f"{table(results)}\n\nloop: the event-loop thread's CPU per request (medians); on − off: the paired "
        "differences; flush: the recorder's flushes' CPU (formatting and writing, on the loop) per line; "
        f"total = on − off median + flush per line, target ≤ {TARGET_US:g} µs.\n"
    )


async def run(args: argparse.Namespace) -> list[VariantResult]:
    config_path = args.config if args.config.is_absolute() else REPO / args.config
    base = parse_config_text(config_path.read_text())
    results = []
    with tempfile.TemporaryDirectory(prefix="recording-cost-") as workdir:
        for variant in variants(args):
            results.append(await measure(variant, base, args, Path(workdir)))
            print(f"{variant.name}: done", file=sys.stderr, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python loadtests/recording_cost.py " + " ".join(sys.argv[1:] if argv is None else argv)
    env = environment()
    results = asyncio.run(run(args))
    print(table(results))
    if args.json is not None:
        document = {"command": command, "environment": env, "variants": [asdict(r) for r in results]}
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    if args.report is not None:
        args.report.write_text(markdown(results, command.strip(), env))
    found = problems(results)
    for problem in found:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
