"""Spans batched on the event loop and posted over OTLP/HTTP: batches by size and by delay, the queue's
bound, retries as OpenTelemetry's exporters do them, headers, compression and TLS, and the flush at exit.

The collector is an aiohttp server on 127.0.0.1 whose answers each test scripts."""

from __future__ import annotations

import gzip
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from burstsched.telemetry.export import OtlpSender, SpanBatcher
from burstsched.telemetry.otlp_encode import SpanEncoder
from burstsched.telemetry.settings import ExportSettings
from burstsched.telemetry.span_record import SpanRecorder

pytestmark = pytest.mark.anyio


@dataclass
class Collector:
    """Answers each POST with the next scripted (status, headers), then 200; keeps what arrived."""

    answers: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    requests: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    hold: anyio.Event | None = None
    """Set: each request waits for it before being answered."""
    arrived: anyio.Event = field(default_factory=anyio.Event)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append(({k.lower(): v for k, v in request.headers.items()}, await request.read()))
        self.arrived.set()
        if self.hold is not None:
            await self.hold.wait()
        status, headers = self.answers.pop(0) if self.answers else (200, {})
        return web.Response(status=status, headers=headers, body=b"")

    def span_names(self) -> list[str]:
        names = []
        for headers, body in self.requests:
            if headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            request = ExportTraceServiceRequest.FromString(body)
            names += [s.name for r in request.resource_spans for ss in r.scope_spans for s in ss.spans]
        return names

    async def wait_for(self, count: int) -> None:
        with anyio.fail_after(10):
            while len(self.requests) < count:
                self.arrived = anyio.Event()
                await self.arrived.wait()


@asynccontextmanager
async def collector(tls: ssl.SSLContext | None = None) -> AsyncIterator[Collector]:
    served = Collector()
    app = web.Application()
    app.router.add_post("/v1/traces", served.handle)
    runner = web.AppRunner(app, auto_decompress=False)  # bodies as they were sent
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    served.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}/v1/traces"
    try:
        yield served
    finally:
        if served.hold is not None:
            served.hold.set()
        await runner.cleanup()


@dataclass
class FakeTime:
    """The sender's clock and sleep: sleeping advances the clock at once and is recorded."""

    now: float = 0.0
    slept: list[float] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _batcher(
    url: str, settings: ExportSettings, time: FakeTime | None = None
) -> tuple[SpanBatcher, SpanRecorder]:
    time = time or FakeTime()
    resource = Resource.create({"service.name": "test"})
    sender = OtlpSender(url, settings, clock=time.clock, sleep=time.sleep)
    batcher = SpanBatcher(sender, SpanEncoder(resource, "test"))
    return batcher, SpanRecorder(batcher.add, ALWAYS_ON, resource)


def _end_spans(recorder: SpanRecorder, names: list[str]) -> None:
    for name in names:
        span = recorder.root(name, None)
        assert span is not None
        span.end()


async def test_a_full_batch_goes_at_once_and_a_partial_one_after_the_delay() -> None:
    async with collector() as served:
        full, full_provider = _batcher(
            served.url, ExportSettings(max_export_batch_size=3, schedule_delay_ms=600_000)
        )
        timed, timed_provider = _batcher(
            served.url, ExportSettings(max_export_batch_size=3, schedule_delay_ms=50)
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(full.run)
            tg.start_soon(timed.run)
            await anyio.lowlevel.checkpoint()  # both tasks are waiting
            _end_spans(
                full_provider, ["a", "b", "c", "d"]
            )  # the 3rd completes a batch: sent without the delay
            await served.wait_for(1)
            assert served.span_names() == ["a", "b", "c"] and full.queued == 1
            _end_spans(timed_provider, ["t"])  # alone, sent when the 50 ms delay is over
            await served.wait_for(2)
            assert served.span_names()[3:] == ["t"]
            tg.cancel_scope.cancel()
        await full.aclose()  # the span left waiting goes at exit
        await timed.aclose()
        assert served.span_names()[4:] == ["d"]
        assert (full.exported, timed.exported, full.dropped) == (4, 1, 0)


async def test_spans_beyond_the_queue_are_dropped_and_counted() -> None:
    async with collector() as served:
        batcher, provider = _batcher(served.url, ExportSettings(max_queue_size=3, max_export_batch_size=2))
        _end_spans(provider, ["a", "b", "c", "d", "e"])
        assert (batcher.queued, batcher.dropped) == (3, 2)
        await batcher.aclose()
        assert served.span_names() == ["a", "b", "c"]  # in two batches of at most 2
        assert len(served.requests) == 2
        _end_spans(provider, ["late"])  # after close: not taken
        assert batcher.queued == 0


async def test_retryable_answers_are_retried_after_backoff_or_retry_after() -> None:
    async with collector() as served:
        served.answers = [(503, {}), (429, {"Retry-After": "7"}), (200, {})]
        time = FakeTime()
        sender = OtlpSender(served.url, ExportSettings(timeout_s=30), clock=time.clock, sleep=time.sleep)
        assert await sender.send(b"")
        await sender.aclose()
    assert len(served.requests) == 3
    first, second = time.slept
    assert 0.8 <= first <= 1.2 and second == 7.0  # 2**0 with ±20% jitter, then the server's word


async def test_an_answer_that_cannot_pass_later_is_not_retried() -> None:
    async with collector() as served:
        served.answers = [(400, {})]
        time = FakeTime()
        sender = OtlpSender(served.url, ExportSettings(), clock=time.clock, sleep=time.sleep)
        assert not await sender.send(b"")
        await sender.aclose()
    assert (len(served.requests), time.slept) == (1, [])


async def test_retries_stop_when_the_next_wait_would_pass_the_deadline() -> None:
    async with collector() as served:
        served.answers = [(503, {})] * 10
        time = FakeTime()
        sender = OtlpSender(served.url, ExportSettings(timeout_s=5), clock=time.clock, sleep=time.sleep)
        assert not await sender.send(b"")
        await sender.aclose()
    assert len(time.slept) == 2 and len(served.requests) == 3  # ~1 s, ~2 s; then ~4 s would pass 5 s
    assert 1.6 <= time.slept[1] <= 2.4


async def test_a_refused_connection_is_retried_then_the_batch_dropped() -> None:
    async with collector() as served:
        url = served.url  # closed when the block ends: nothing listens there afterwards
    time = FakeTime()
    batcher, provider = _batcher(url, ExportSettings(timeout_s=2), time)
    _end_spans(provider, ["lost"])
    await batcher.aclose()
    assert (batcher.exported, batcher.dropped) == (0, 1)
    assert len(time.slept) == 1  # one wait of ~1 s; the next (~2 s) would pass the 2 s deadline


async def test_headers_and_gzip_reach_the_collector() -> None:
    settings = ExportSettings(headers=(("api-key", "s3cret"),), compression="gzip")
    async with collector() as served:
        batcher, provider = _batcher(served.url, settings)
        _end_spans(provider, ["zipped"])
        await batcher.aclose()
    ((headers, _),) = served.requests
    assert headers["api-key"] == "s3cret"
    assert headers["content-encoding"] == "gzip"
    assert headers["content-type"] == "application/x-protobuf"
    assert served.span_names() == ["zipped"]


async def test_tls_with_a_private_ca(self_signed: tuple[Path, Path]) -> None:
    cert, key = self_signed
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    async with collector(tls=server_tls) as served:
        trusting, provider = _batcher(served.url, ExportSettings(certificate=str(cert)))
        _end_spans(provider, ["over tls"])
        await trusting.aclose()
        assert served.span_names() == ["over tls"]
        # the system's CAs do not know it: a connection error, retried until the deadline, then dropped
        default, provider = _batcher(served.url, replace(ExportSettings(), timeout_s=0.5))
        _end_spans(provider, ["refused"])
        await default.aclose()
        assert (default.exported, default.dropped) == (0, 1)
    assert served.span_names() == ["over tls"]


async def test_a_batch_on_its_way_at_cancellation_is_finished_before_close() -> None:
    async with collector() as served:
        served.hold = anyio.Event()
        settings = ExportSettings(max_export_batch_size=2, schedule_delay_ms=600_000)
        batcher, provider = _batcher(served.url, settings)
        async with anyio.create_task_group() as tg:
            running = anyio.CancelScope()

            async def run() -> None:
                with running:
                    await batcher.run()

            tg.start_soon(run)
            await anyio.lowlevel.checkpoint()
            _end_spans(provider, ["a", "b", "c"])
            await served.wait_for(1)  # the batch a, b is on its way, its answer held back
            running.cancel()
            tg.start_soon(batcher.aclose)  # waits for that batch, then sends c
            served.hold.set()
        assert served.span_names() == ["a", "b", "c"]
        assert (len(served.requests), batcher.exported, batcher.dropped) == (2, 3, 0)


async def test_at_close_a_collector_that_is_away_costs_one_timeout_not_one_per_batch() -> None:
    async with collector() as served:
        url = served.url  # nothing listens there once the block ends
    time = FakeTime()
    batcher, recorder = _batcher(url, ExportSettings(timeout_s=2, max_export_batch_size=2), time)
    _end_spans(recorder, ["a", "b", "c", "d", "e"])
    await batcher.aclose()
    assert (batcher.exported, batcher.dropped, batcher.queued) == (0, 5, 0)
    assert len(time.slept) == 1  # the first batch's one retry; the other batches were not tried
