"""Upstream proxying with failover before the first byte and an error event after it.

The response is written straight to the ASGI ``send``: a streaming (SSE) response is forwarded chunk by
chunk as it arrives, once its first chunk came (a replica that fails between its headers and its first chunk
still lets the request move on); any other response is read whole first, so a failure while reading it can
still move the request to the next endpoint. Endpoints whose circuit is open are tried last. A client
disconnect cancels the upstream request. A request past its deadline, or still running when a shutdown's
drain time is up, ends early: with an error event and ``[DONE]`` when its stream has begun, else with a
504 (deadline) or 503 (shutdown) error body.

``on_dispatch`` (the scheduler's dispatch hooks: the prefix indexes) fires for a stream's endpoint when its
response head comes back 2xx: a stream's head comes as soon as the replica queued the request, before its
prefill, so later requests of the prefix still follow it, and an endpoint that failed before its head
(unreachable, timed out, 5xx) or refused the request (4xx) is never recorded. A whole-body request's head
comes only with its whole answer, so its hooks fire at each attempt's start instead: a burst of them must
follow the first during its prefill (measured: at the head, a burst of 8 split over both replicas in 3 of
6 runs), and an endpoint that then fails keeps the prefix in the approximate index until evicted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import httpx
from starlette.types import Receive, Send

from burstsched.dispatch.drain import Drainer
from burstsched.dispatch.headers import client_response_headers, predicted_ttft_header, prefix_headers
from burstsched.dispatch.upstream import Upstream, UpstreamResponse
from burstsched.framework import ApiKind, Decision, EndpointSnapshot, SchedRequest, uncached_tokens
from burstsched.pool import CircuitState, EndpointPool
from burstsched.telemetry.metrics import RouterMetrics
from burstsched.wire.errors import error_body, sse_error_event

if TYPE_CHECKING:
    from burstsched.telemetry import RequestTrace, UpstreamSpan

log = logging.getLogger(__name__)

DONE_EVENT = b"data: [DONE]\n\n"
_JSON = [(b"content-type", b"application/json")]


class ParsedRequest(Protocol):
    """What the dispatcher needs of a validated client request (the front's ``ParsedRequest``)."""

    @property
    def api(self) -> ApiKind: ...

    @property
    def body(self) -> bytes:
        """Forwarded upstream as received."""
        ...

    @property
    def stream(self) -> bool: ...


DispatchHookFn = Callable[[SchedRequest, EndpointSnapshot], None]

RESPONSE_TAIL_BYTES = 2048
"""The most of a stream's end a :class:`Served` keeps (``keep_response_tail``): its usage chunk."""

_WHOLE_READ_BYTES = 128
"""A stream's reads of this many bytes or more are kept by reference, the last two of them; a shorter read
is joined to the newer one. What is kept is then the stream's last 256 bytes or more (all of a shorter
stream): its ``[DONE]`` for the end check, and its usage object, which vLLM writes in well under 256
bytes from its ``"usage"`` key to the stream's end, for the recorder."""

_ENDING_BYTES = 32
"""A stream is whole when its last this many bytes hold ``data: [DONE]``."""


@dataclass(frozen=True, slots=True)
class Served:
    """How a request was served, for the traffic recorder (:mod:`burstsched.recording`)."""

    endpoint: str | None
    outcome: str
    first_byte_at: float | None
    """``time.monotonic()`` when the response's head (a stream: its first chunk) went to the client."""
    response_tail: bytes = b""
    """A JSON response's body or a stream's end: its last two reads of 128 bytes or more and any shorter
    reads after them, at most 2 KiB (``keep_response_tail`` only; the recorder's usage)."""


@dataclass(slots=True)
class _Exchange:
    """What happened to one client request, for its metrics."""

    endpoint: str | None = None
    outcome: str = "upstream_error"
    complete: bool = False
    client_gone: bool = False
    started: bool = False
    """The response's head went to the client (a stream: its first chunk too)."""
    attempts: int = 0
    abort_reason: str | None = None
    """Why the request was ended early (``shutdown``), when it was; a deadline leaves it None."""
    trace: RequestTrace | None = None
    span: UpstreamSpan | None = None
    """The current attempt's CLIENT span (tracing on only)."""
    prefix: Sequence[tuple[bytes, bytes]] = ()
    """The current attempt's prefix headers (what the router expected of its endpoint's cache)."""
    queued_prefill: int = 0
    """Prompt tokens the current attempt's endpoint is expected to compute before its first token, counted
    in the pool's ledger until the first token (or the end of the attempt)."""
    first_byte_at: float | None = None
    response_tail: bytes = b""
    load_at_send: tuple[int, int] = (0, 1)
    """The current attempt's endpoint's queued prefill (its own included) and in-flight requests (itself
    included) right after it was counted there: what its time to first token is fitted against."""
    sent_at: float = 0.0


class _AttemptFailed(Exception):
    """This endpoint failed before anything reached the client; try the next one."""

    def __init__(self, result: str, message: str) -> None:
        super().__init__(message)
        self.result = result
        self.message = message


class Dispatcher:
    """Sends a scheduled request upstream and writes the response to the client.

    Requests go through the app's one :class:`Upstream` (the same client as the pool's checks and
    scrapes). Its errors are httpx's ``TransportError`` family: a connect error or connect timeout marks
    the endpoint unreachable; any of them moves the request to the next endpoint before its first byte.
    """

    def __init__(
        self,
        upstream: Upstream,
        pool: EndpointPool,
        metrics: RouterMetrics,
        *,
        on_dispatch: DispatchHookFn,
        max_attempts: int,
        timeouts: httpx.Timeout,
        first_byte_timeout_s: float | None = None,
        drainer: Drainer | None = None,
        keep_response_tail: bool = False,
    ) -> None:
        self._upstream = upstream
        self._pool = pool
        self._metrics = metrics
        self._on_dispatch = on_dispatch
        self._max_attempts = max_attempts
        self._timeouts = timeouts.as_dict()
        self._first_byte_timeout = first_byte_timeout_s
        self._drainer = drainer
        self._keep_tail = keep_response_tail

    async def forward(
        self,
        parsed: ParsedRequest,
        request: SchedRequest,
        decision: Decision,
        headers: Sequence[tuple[bytes, bytes]],
        receive: Receive,
        send: Send,
        *,
        trace: RequestTrace | None = None,
        deadline: float | None = None,
        prefill_cap: int | None = None,
    ) -> Served:
        """Serve the client from the best endpoint that answers; never raises for upstream failures.

        Each attempt counts the prompt tokens its endpoint must compute (from the decision's prefix match,
        at most ``prefill_cap``: a group member whose group's prefix is computed once) in the pool's queued
        prefill until the first token.

        A client disconnect cancels this task (and with it the upstream request) through a watcher task.
        ``deadline`` (event-loop time) ends the request early, like a shutdown's abort.
        """
        exchange = _Exchange(trace=trace)
        task = asyncio.current_task()
        assert task is not None
        watcher = asyncio.ensure_future(_wait_for_disconnect(receive))

        def on_disconnect(done: asyncio.Future[None]) -> None:
            if not done.cancelled() and done.exception() is None and not exchange.complete:
                exchange.outcome = "cancelled"
                exchange.client_gone = True
                task.cancel()

        watcher.add_done_callback(on_disconnect)
        guard = asyncio.timeout_at(deadline)
        try:
            async with guard:
                done = self._track(guard, exchange)
                try:
                    await self._attempts(parsed, request, decision, headers, send, exchange, prefill_cap)
                finally:
                    done()
        except TimeoutError:
            if not guard.expired():
                raise
            await self._end_early(send, exchange, stream=parsed.stream)
        except asyncio.CancelledError:
            if not exchange.client_gone or task.uncancel() > 0:
                raise
        finally:
            watcher.remove_done_callback(on_disconnect)
            watcher.cancel()
            self._metrics.request_done(exchange.endpoint, exchange.outcome)
            if trace is not None:
                trace.served(exchange.endpoint, exchange.outcome)
        return Served(exchange.endpoint, exchange.outcome, exchange.first_byte_at, exchange.response_tail)

    def _track(self, guard: asyncio.Timeout, exchange: _Exchange) -> Callable[[], None]:
        """Register the request with the drainer: its abort expires ``guard`` now."""
        if self._drainer is None:
            return lambda: None

        def abort() -> None:
            if not guard.expired() and not exchange.complete:
                exchange.abort_reason = "shutdown"
                guard.reschedule(asyncio.get_running_loop().time())

        return self._drainer.register(abort)

    async def _end_early(self, send: Send, exchange: _Exchange, *, stream: bool) -> None:
        """End a request cut short by its deadline or a shutdown, in the shape its client expects."""
        if exchange.complete or (exchange.started and not stream):
            return
        exchange.complete = True
        if exchange.abort_reason == "shutdown":
            status, message, exchange.outcome = 503, "the router is shutting down", "aborted"
        else:
            status, message, exchange.outcome = 504, "the request took longer than its time limit", "timeout"
        if exchange.started:
            body = sse_error_event(status, message) + DONE_EVENT
            await send({"type": "http.response.body", "body": body, "more_body": False})
        else:
            await _send_json(send, status, error_body(status, message))

    async def _attempts(
        self,
        parsed: ParsedRequest,
        request: SchedRequest,
        decision: Decision,
        headers: Sequence[tuple[bytes, bytes]],
        send: Send,
        exchange: _Exchange,
        prefill_cap: int | None = None,
    ) -> None:
        failures: list[str] = []
        for attempt, (endpoint, claimed) in enumerate(self._candidates(decision)):
            exchange.endpoint = endpoint.name
            exchange.outcome = "cancelled"
            exchange.attempts = attempt + 1
            match = decision.matches.get(endpoint.name)
            exchange.prefix = prefix_headers(
                match, None if request.token_ids is None else len(request.token_ids)
            )
            queued = uncached_tokens(request, match)
            exchange.queued_prefill = queued if prefill_cap is None else min(queued, prefill_cap)
            self._pool.acquire(endpoint.name, exchange.queued_prefill, request.prompt_tokens)
            exchange.load_at_send = self._pool.load(endpoint.name)
            exchange.sent_at = time.monotonic()
            if endpoint.ttft is not None:
                ahead, in_flight = exchange.load_at_send
                predicted = endpoint.ttft.predict(ahead, in_flight - 1)
                exchange.prefix = [*exchange.prefix, predicted_ttft_header(predicted)]
            if not parsed.stream:  # its head comes with its whole answer: later requests must follow it now
                self._on_dispatch(request, endpoint)
            if exchange.trace is not None:
                exchange.span = exchange.trace.upstream(
                    endpoint.name, endpoint.url + parsed.api.path, attempt
                )
            try:
                await self._attempt(endpoint, parsed, request, headers, send, exchange)
                return
            except _AttemptFailed as failed:
                self._metrics.attempt(endpoint.name, failed.result)
                failures.append(f"{endpoint.name}: {failed.message}")
                log.info("request %s: %s failed (%s)", request.request_id, endpoint.name, failed.message)
                if exchange.span is not None:
                    exchange.span.failed(failed.result, failed.message)
            finally:
                self._pool.release(endpoint.name, exchange.queued_prefill)
                exchange.queued_prefill = 0
                self._pool.end_attempt(endpoint.name, claimed)
                if exchange.span is not None:
                    exchange.span.end()
                    exchange.span = None
        exchange.outcome = "upstream_error"
        message = "no endpoint could serve the request: " + "; ".join(failures or ["none was tried"])
        exchange.complete = True
        await _send_json(send, 502, error_body(502, message))

    def _candidates(self, decision: Decision) -> Iterator[tuple[EndpointSnapshot, CircuitState]]:
        """Up to ``max_attempts`` endpoints in ranked order, each claimed from its circuit; those whose
        circuit refuses come last, tried only when no other endpoint is left."""
        refused: list[EndpointSnapshot] = []
        tried = 0
        for scored in decision.ranked:
            if tried >= self._max_attempts:
                return
            claimed = self._pool.begin_attempt(scored.endpoint.name)
            if claimed is None:
                refused.append(scored.endpoint)
                continue
            tried += 1
            yield scored.endpoint, claimed
        for endpoint in refused[: self._max_attempts - tried]:
            yield endpoint, CircuitState.CLOSED

    async def _attempt(
        self,
        endpoint: EndpointSnapshot,
        parsed: ParsedRequest,
        request: SchedRequest,
        headers: Sequence[tuple[bytes, bytes]],
        send: Send,
        exchange: _Exchange,
    ) -> None:
        name = endpoint.name
        try:
            sent = list(headers) if exchange.span is None else exchange.span.inject(headers)
            async with asyncio.timeout(self._first_byte_timeout if parsed.stream else None):
                upstream = await self._upstream.request(
                    "POST", endpoint.url + parsed.api.path, sent, parsed.body, self._timeouts
                )
        except TimeoutError:
            self._pool.report_failure(name, unreachable=False)
            raise _AttemptFailed("timeout", "no response head within the first-byte timeout") from None
        except httpx.TimeoutException as exc:
            self._pool.report_failure(name, unreachable=isinstance(exc, httpx.ConnectTimeout))
            raise _AttemptFailed("timeout", f"timed out ({type(exc).__name__})") from None
        except httpx.TransportError as exc:
            self._pool.report_failure(name, unreachable=isinstance(exc, httpx.ConnectError))
            raise _AttemptFailed("connect_error", f"{type(exc).__name__}: {exc}") from None
        try:
            status = upstream.status
            if exchange.span is not None:
                exchange.span.response(status)
            if status >= 500:
                self._pool.report_failure(name, unreachable=False)
                raise _AttemptFailed("status_5xx", f"answered HTTP {status}")
            if (
                status < 300 and parsed.stream
            ):  # this endpoint took the stream: the only one its hooks hear of
                self._on_dispatch(request, endpoint)
            if parsed.stream and status < 300:
                await self._stream(upstream, name, send, exchange)
                return
            try:
                body = b"".join([chunk async for chunk in upstream.iter_body()])
            except httpx.HTTPError as exc:
                self._pool.report_failure(name, unreachable=False)
                raise _AttemptFailed(
                    "read_error", f"{type(exc).__name__} while reading the response"
                ) from None
            self._pool.report_success(name)
            self._metrics.attempt(name, "ok")
            if exchange.span is not None:
                exchange.span.body(body)
            exchange.outcome = "ok" if status < 400 else "client_error"
            exchange.complete = True
            response_headers = client_response_headers(
                upstream.headers,
                name,
                content_length=len(body),
                attempts=exchange.attempts,
                prefix=exchange.prefix,
            )
            exchange.started = True
            exchange.first_byte_at = time.monotonic()
            if self._keep_tail:
                exchange.response_tail = body
            await send({"type": "http.response.start", "status": status, "headers": response_headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
        finally:
            await upstream.aclose()

    async def _stream(self, upstream: UpstreamResponse, name: str, send: Send, exchange: _Exchange) -> None:
        chunks = upstream.iter_body()
        first = await self._first_chunk(chunks, name)
        ahead, in_flight = exchange.load_at_send
        self._pool.observe_ttft(name, ahead, in_flight - 1, time.monotonic() - exchange.sent_at)
        self._pool.prefill_done(name, exchange.queued_prefill)
        exchange.queued_prefill = 0
        self._pool.report_success(name)
        self._metrics.attempt(name, "ok")
        response_headers = client_response_headers(
            upstream.headers, name, content_length=None, attempts=exchange.attempts, prefix=exchange.prefix
        )
        exchange.outcome = "stream_error"
        exchange.started = True
        exchange.first_byte_at = time.monotonic()
        # One step per read and no Python-level call, the same whether the router records or not: a read of
        # 128 bytes or more becomes the newest of the two kept by reference (no copy), a shorter one is
        # joined to the newest (a copy, bounded by the 2 KiB kept). A deque of the last 2 KiB cost recorded
        # streams 0.03 µs more per read.
        previous = newest = b""
        whole_read = _WHOLE_READ_BYTES
        await send({"type": "http.response.start", "status": upstream.status, "headers": response_headers})
        is_sse = any(
            k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in upstream.headers
        )
        failure: str | None = None
        span = exchange.span
        try:
            chunk: bytes | None = first
            while chunk is not None:
                if chunk:
                    if span is not None:
                        span.chunk(chunk)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    if len(chunk) >= whole_read:
                        previous, newest = newest, chunk
                    else:
                        newest = (newest + chunk)[-RESPONSE_TAIL_BYTES:]
                chunk = await anext(chunks, None)
        except httpx.HTTPError as exc:
            failure = f"upstream {name} failed mid-stream: {type(exc).__name__}"
        except Exception as exc:  # any failure after the first byte still ends the stream properly
            log.exception("stream from %s failed", name)
            failure = f"stream from {name} failed: {type(exc).__name__}"
        last = previous + newest
        if len(last) > RESPONSE_TAIL_BYTES:  # a long read: keep only its end, not the whole read
            last = last[-RESPONSE_TAIL_BYTES:]
        if failure is None and is_sse and DONE_EVENT.strip() not in last[-_ENDING_BYTES:]:
            failure = f"upstream {name} ended the stream early"
        if failure is not None:
            self._pool.report_failure(name, unreachable=False)
            log.warning("%s", failure)
            if span is not None:
                span.failed("stream_error", failure)
            exchange.complete = True
            await send(
                {
                    "type": "http.response.body",
                    "body": sse_error_event(502, failure) + DONE_EVENT,
                    "more_body": False,
                }
            )
            return
        exchange.outcome = "ok"
        exchange.complete = True
        if self._keep_tail:  # parsed for usage by the recorder
            exchange.response_tail = last
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _first_chunk(self, chunks: AsyncIterator[bytes], name: str) -> bytes:
        """The stream's first non-empty chunk; a failure before it still lets the request move on."""
        try:
            async for chunk in chunks:
                if chunk:
                    return chunk
        except httpx.HTTPError as exc:
            self._pool.report_failure(name, unreachable=False)
            raise _AttemptFailed("read_error", f"{type(exc).__name__} before the first chunk") from None
        self._pool.report_failure(name, unreachable=False)
        raise _AttemptFailed("read_error", "the stream ended before its first chunk")


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _send_json(send: Send, status: int, body: dict[str, object]) -> None:
    payload = json.dumps(body).encode()
    headers = [*_JSON, (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload, "more_body": False})
