"""Finished spans batched on the event loop and posted over OTLP/HTTP, with no exporter thread.

OpenTelemetry's ``BatchSpanProcessor`` hands spans to a worker thread, which encodes them through protobuf
message objects and posts them with ``requests``. On a router that lives on one core this costs twice: the
encoding (78 µs per span), and the thread itself, which takes the GIL from the event loop at every batch
(the loop spent 529 µs per traced request with the thread and a do-nothing exporter, 371 µs without it).

Here :class:`SpanBatcher` takes each :class:`~burstsched.telemetry.span_record.SpanRecord` as it ends and
appends it to a list, nothing more. Its :meth:`~SpanBatcher.run` task, on the event loop, takes a batch
when ``max_export_batch_size`` spans are waiting or ``schedule_delay_ms`` has passed since the last, encodes
it in slices between requests (:class:`~burstsched.telemetry.otlp_encode.SpanEncoder`, 64 spans at a time)
and posts it with :class:`OtlpSender`. Spans beyond ``max_queue_size`` are dropped and counted
(:attr:`SpanBatcher.dropped`), as the SDK's processor does while its collector is slow or away.

:class:`OtlpSender` posts ``application/x-protobuf`` with aiohttp: the configured headers, gzip or deflate,
TLS with a private CA and client certificates, proxies from the environment. A batch is retried on 429,
502, 503 and 504 and on connection errors, after 1, 2, 4 … s (±20%) or the server's ``Retry-After``, within
``timeout_s`` in all (OpenTelemetry's rule); any other answer fails it at once. A failed batch is logged and
dropped.
"""

from __future__ import annotations

import gzip
import logging
import random
import ssl
import threading
import time
import zlib
from collections.abc import Awaitable, Callable
from email.utils import parsedate_to_datetime

import aiohttp
import anyio
import anyio.lowlevel
import anyio.to_thread

from burstsched import __version__
from burstsched.telemetry.otlp_encode import SpanEncoder
from burstsched.telemetry.settings import ExportSettings
from burstsched.telemetry.span_record import SpanRecord

log = logging.getLogger(__name__)

RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})
SLICE_SPANS = 64
"""Spans encoded between two yields to the event loop (about 1.5 ms of work)."""
_JITTER = 0.2


class OtlpSender:
    """Posts encoded ``ExportTraceServiceRequest`` bodies to one OTLP/HTTP traces URL."""

    def __init__(
        self,
        url: str,
        settings: ExportSettings,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        self.url = url
        self.settings = settings
        self._rng = rng or random.Random()
        self._clock = clock
        self._sleep = sleep
        self._headers = {
            "content-type": "application/x-protobuf",
            "user-agent": f"burstsched/{__version__}",
            **({"content-encoding": settings.compression} if settings.compression != "none" else {}),
            **dict(settings.headers),
        }
        self._session: aiohttp.ClientSession | None = None

    def _tls(self) -> ssl.SSLContext | bool:
        s = self.settings
        if s.certificate is None and s.client_certificate is None:
            return True
        context = ssl.create_default_context(cafile=s.certificate)
        if s.client_certificate is not None:
            context.load_cert_chain(s.client_certificate, s.client_key)
        return context

    async def send(self, body: bytes) -> bool:
        """Post ``body``, retrying what may pass later; True when the collector accepted it."""
        if self.settings.compression == "gzip":
            body = await anyio.to_thread.run_sync(gzip.compress, body)
        elif self.settings.compression == "deflate":
            body = await anyio.to_thread.run_sync(zlib.compress, body)
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._tls()), trust_env=True, auto_decompress=False
            )
        deadline = self._clock() + self.settings.timeout_s
        retry = 0
        while True:
            left = deadline - self._clock()
            status, retry_after, why = await self._post(body, left)
            if status is not None and 200 <= status < 300:
                return True
            retryable = status is None or status in RETRYABLE_STATUSES
            backoff = retry_after if retry_after is not None else (2**retry) * self._jitter()
            if not retryable or backoff >= deadline - self._clock():
                log.warning("OTLP export to %s failed: %s; the batch is dropped", self.url, why)
                return False
            log.info("OTLP export to %s: %s; retrying in %.1f s", self.url, why, backoff)
            await self._sleep(backoff)
            retry += 1

    def _jitter(self) -> float:
        return self._rng.uniform(1 - _JITTER, 1 + _JITTER)

    async def _post(self, body: bytes, timeout_s: float) -> tuple[int | None, float | None, str]:
        """(status or None on a connection error, ``Retry-After`` in seconds, what happened)."""
        assert self._session is not None
        try:
            async with self._session.post(
                self.url,
                data=body,
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=max(timeout_s, 0.001)),
                allow_redirects=False,
            ) as response:
                await response.read()
                return (
                    response.status,
                    _retry_after(response.headers.get("retry-after")),
                    f"HTTP {response.status}",
                )
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            return None, None, f"{type(error).__name__}: {error}"

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header (seconds or an HTTP date) as seconds from now."""
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        return max(parsedate_to_datetime(value).timestamp() - time.time(), 0.0)
    except (TypeError, ValueError):
        return None


class SpanBatcher:
    """Queues finished spans (:meth:`add`); :meth:`run` exports them in batches.

    Spans should end on the event loop's thread (every span of the router does); :meth:`add` from another
    thread still queues, and the next timed batch takes it.
    """

    def __init__(self, sender: OtlpSender, encoder: SpanEncoder) -> None:
        self.sender = sender
        self.settings = sender.settings
        self.encoder = encoder
        self.dropped = 0
        """Spans dropped: the queue was full, or their batch failed."""
        self.exported = 0
        """Spans the collector accepted."""
        self.encode_cpu_s = 0.0
        """Event-loop CPU spent encoding (thread time)."""
        self._queue: list[SpanRecord] = []
        self._full: anyio.Event | None = None
        self._loop_thread: int | None = None
        self._closed = False
        self._reported_drops = 0
        self._exporting = anyio.Lock()
        """One batch at a time: the run task's and the closing flush's."""

    def add(self, span: SpanRecord) -> None:
        """Queue a finished span (dropped and counted when the queue is full or the batcher closed)."""
        if self._closed:
            return
        queue = self._queue
        if len(queue) >= self.settings.max_queue_size:
            self.dropped += 1
            return
        queue.append(span)
        if (
            len(queue) == self.settings.max_export_batch_size
            and self._full is not None
            and threading.get_ident() == self._loop_thread
        ):
            self._full.set()

    # --- the loop's side ----------------------------------------------------------------------------------

    @property
    def queued(self) -> int:
        return len(self._queue)

    def counts(self) -> tuple[int, int, int]:
        """(exported, dropped, queued) spans."""
        return self.exported, self.dropped, len(self._queue)

    async def run(self) -> None:
        """Export batches until cancelled: a full batch at once, otherwise every ``schedule_delay_ms``."""
        self._loop_thread = threading.get_ident()
        delay_s = self.settings.schedule_delay_ms / 1000.0
        while True:
            self._full = anyio.Event()
            if len(self._queue) < self.settings.max_export_batch_size:
                with anyio.move_on_after(delay_s):
                    await self._full.wait()
            await self.export_batch()

    async def export_batch(self) -> bool:
        """Encode and send up to ``max_export_batch_size`` queued spans; False when the batch failed."""
        async with self._exporting:
            return await self._export_batch()

    async def _export_batch(self) -> bool:
        size = self.settings.max_export_batch_size
        batch, self._queue[:size] = self._queue[:size], []
        if not batch:
            return True
        encoded: list[bytes] = []
        for start in range(0, len(batch), SLICE_SPANS):
            if start:
                await anyio.lowlevel.checkpoint()  # requests go on between slices
            began = time.thread_time()
            encoded += [self.encoder.span(span) for span in batch[start : start + SLICE_SPANS]]
            self.encode_cpu_s += time.thread_time() - began
        began = time.thread_time()
        body = self.encoder.request(encoded)
        self.encode_cpu_s += time.thread_time() - began
        with anyio.CancelScope(shield=True):  # a batch on its way is finished (bounded by timeout_s)
            sent = await self.sender.send(body)
        if sent:
            self.exported += len(batch)
        else:
            self.dropped += len(batch)
        self._report_drops()
        return sent

    def _report_drops(self) -> None:
        if self.dropped > self._reported_drops:
            log.warning("%d spans dropped so far (queue full or export failed)", self.dropped)
            self._reported_drops = self.dropped

    async def flush(self) -> None:
        """Export everything queued now, batch after batch. After a batch that failed (its retries used up
        ``timeout_s``), the rest is dropped: at exit, a collector that is away costs one timeout, not one
        per batch."""
        while self._queue:
            if not await self.export_batch():
                self.dropped += len(self._queue)
                self._queue.clear()
                self._report_drops()

    async def aclose(self) -> None:
        """Stop taking spans, export what waits, close the connection."""
        self._closed = True
        await self.flush()
        async with self._exporting:  # a batch the run task had on its way is through
            await self.sender.aclose()
