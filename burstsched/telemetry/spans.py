"""One request's spans: the SERVER span and its children (admission wait, scheduling, upstream attempts).

These objects exist only while tracing is on (and the request is sampled); the request path holds
``RequestTrace | None`` and checks it, so an untraced request builds no span objects at all. Parents are
passed explicitly (no context variables).

``tracing.detail: full``::

    SERVER  POST /v1/chat/completions      continues the client's traceparent; GenAI request attributes
      ├─ burstsched.admission              the request's wait in its window (window, group, role, bypass)
      ├─ burstsched.schedule               the decision: chosen endpoint, one ``score`` event per candidate
      └─ CLIENT  chat <model>              one per upstream attempt; traceparent injected; ``first_token``
                                           event; usage, response id and finish reasons from the response

``tracing.detail: lean`` (the default) records the same facts with fewer objects, since every span costs the
router CPU to build and to encode for export: the admission and scheduling attributes go on the SERVER span,
the decision is one ``burstsched.schedule`` event there (candidates, totals and each scorer's scores as
arrays in rank order), and an admission span is kept only for a request that waited in a window (its wait
is worth a bar of its own). A warm request's trace is then two spans: SERVER and CLIENT.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import urlsplit

from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue
from starlette.types import Message, Receive, Scope, Send

from burstsched.framework import Decision
from burstsched.telemetry import attributes as attr
from burstsched.telemetry.span_record import SpanRecord, SpanRecorder
from burstsched.telemetry.usage import ResponseInfo, StreamTail, from_json_body, from_sse_tail

_TRACE_HEADERS = (b"traceparent", b"tracestate")


class AdmissionOutcome(Protocol):
    """What admission says about a request (``burstsched.admission.Admitted`` has these fields)."""

    @property
    def decision(self) -> Decision: ...
    @property
    def window_id(self) -> int | None: ...
    @property
    def group_id(self) -> str | None: ...
    @property
    def role(self) -> str: ...
    @property
    def group_size(self) -> int: ...
    @property
    def shared_blocks(self) -> int: ...
    @property
    def waited_s(self) -> float: ...
    @property
    def scheduled_s(self) -> float: ...


class UpstreamSpan:
    """The CLIENT span of one upstream attempt."""

    __slots__ = ("_span", "_first", "_tail", "_ended")

    def __init__(self, span: SpanRecord) -> None:
        self._span = span
        self._first = True
        self._tail: StreamTail | None = None
        self._ended = False

    @property
    def span(self) -> SpanRecord:
        return self._span

    def inject(self, headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """``headers`` with the client's ``traceparent``/``tracestate`` replaced by this span's."""
        out = [(k, v) for k, v in headers if k not in _TRACE_HEADERS]
        out.append((b"traceparent", self._span.traceparent().encode()))
        if self._span.trace_state:
            out.append((b"tracestate", self._span.trace_state.encode("latin-1")))
        return out

    def response(self, status: int) -> None:
        """The replica answered with ``status`` (4xx and 5xx are errors of a CLIENT span)."""
        self._span.set_attribute(attr.HTTP_RESPONSE_STATUS_CODE, status)
        if status >= 400:
            self._span.set_attribute(attr.ERROR_TYPE, str(status))
            self._span.set_status(StatusCode.ERROR)

    def chunk(self, data: bytes) -> None:
        """A chunk of a streamed response; the first one is the ``first_token`` event."""
        if self._first:
            self._first = False
            self._span.add_event(attr.EVENT_FIRST_TOKEN)
            self._tail = StreamTail()
        if self._tail is not None:
            self._tail.add(data)

    def body(self, data: bytes) -> None:
        """A whole (non-streamed) response body: the ``first_token`` event (all tokens at once) and usage."""
        if self._first:
            self._first = False
            self._span.add_event(attr.EVENT_FIRST_TOKEN)
        self._record(from_json_body(data))

    def failed(self, result: str, message: str) -> None:
        """The attempt failed (``result`` as in ``burstsched_upstream_attempts_total``)."""
        self._span.set_attributes({attr.UPSTREAM_RESULT: result, attr.ERROR_TYPE: result})
        self._span.set_status(StatusCode.ERROR, message)

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        if self._tail is not None:
            self._record(from_sse_tail(self._tail.value()))
            self._tail = None
        self._span.end()

    def _record(self, info: ResponseInfo) -> None:
        values: dict[str, AttributeValue] = {}
        if info.response_id is not None:
            values[attr.GEN_AI_RESPONSE_ID] = info.response_id
        if info.model is not None:
            values[attr.GEN_AI_RESPONSE_MODEL] = info.model
        if info.input_tokens is not None:
            values[attr.GEN_AI_USAGE_INPUT_TOKENS] = info.input_tokens
        if info.output_tokens is not None:
            values[attr.GEN_AI_USAGE_OUTPUT_TOKENS] = info.output_tokens
        if info.cached_tokens is not None:
            values[attr.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = info.cached_tokens
        if info.finish_reasons:
            values[attr.GEN_AI_RESPONSE_FINISH_REASONS] = list(info.finish_reasons)
        if values:
            self._span.set_attributes(values)


class RequestTrace:
    """The SERVER span of one client request and the child spans the request path records under it."""

    __slots__ = (
        "_recorder",
        "_span",
        "_operation",
        "_model",
        "_admission",
        "_admission_started",
        "_full",
        "_ended",
    )

    def __init__(self, recorder: SpanRecorder, span: SpanRecord, *, full: bool = False) -> None:
        self._recorder = recorder
        self._span = span
        self._operation = "chat"
        self._model = ""
        self._admission: SpanRecord | None = None
        self._admission_started = 0
        self._full = full
        self._ended = False

    @classmethod
    def begin(
        cls,
        recorder: SpanRecorder,
        propagator: TraceContextTextMapPropagator,
        scope: Scope,
        *,
        full: bool = False,
    ) -> RequestTrace | None:
        """Start the SERVER span of the HTTP request ``scope``, continuing its ``traceparent`` if any; None
        when the sampler leaves the request out.

        ``full``: admission and scheduling as child spans (``tracing.detail: full``), else the lean layout.
        """
        carrier: dict[str, str] = {}
        attributes: dict[str, AttributeValue] = {}
        for name, value in scope.get("headers", ()):
            if name in _TRACE_HEADERS:
                carrier[name.decode("latin-1")] = value.decode("latin-1")
            elif name == b"user-agent":
                attributes[attr.USER_AGENT_ORIGINAL] = value.decode("latin-1")
            elif name == b"host":
                host, _, port = value.decode("latin-1").rpartition(":")
                if host and port.isdigit():
                    attributes[attr.SERVER_ADDRESS], attributes[attr.SERVER_PORT] = host, int(port)
                else:
                    attributes[attr.SERVER_ADDRESS] = value.decode("latin-1")
        parent = propagator.extract(carrier) if carrier else None
        method: str = scope.get("method", "POST")
        path: str = scope.get("path", "")
        attributes[attr.HTTP_REQUEST_METHOD] = method
        attributes[attr.HTTP_ROUTE] = path
        attributes[attr.URL_PATH] = path
        attributes[attr.URL_SCHEME] = scope.get("scheme", "http")
        client = scope.get("client")
        if client:
            attributes[attr.CLIENT_ADDRESS] = client[0]
        span = recorder.root(f"{method} {path}", parent, kind=SpanKind.SERVER, attributes=attributes)
        return None if span is None else cls(recorder, span, full=full)

    @property
    def span(self) -> SpanRecord:
        """The SERVER span."""
        return self._span

    def wrap_send(self, send: Send) -> Send:
        """``send`` that records the response status on the SERVER span (5xx is an error)."""
        span = self._span

        async def traced_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status: int = message["status"]
                span.set_attribute(attr.HTTP_RESPONSE_STATUS_CODE, status)
                if status >= 500:
                    span.set_attribute(attr.ERROR_TYPE, str(status))
                    span.set_status(StatusCode.ERROR)
            await send(message)

        return traced_send

    def describe(self, payload: Mapping[str, Any], *, chat: bool, model: str, request_id: str) -> None:
        """The GenAI request attributes, from the validated body and the resolved model."""
        self._operation = attr.OPERATION_CHAT if chat else attr.OPERATION_TEXT_COMPLETION
        self._model = model
        values: dict[str, AttributeValue] = {
            attr.GEN_AI_OPERATION_NAME: self._operation,
            attr.GEN_AI_REQUEST_MODEL: model,
            attr.REQUEST_ID: request_id,
            attr.REQUEST_STREAM: payload.get("stream") is True,
        }
        max_tokens = payload.get("max_completion_tokens", payload.get("max_tokens"))
        if type(max_tokens) is int:
            values[attr.GEN_AI_REQUEST_MAX_TOKENS] = max_tokens
        for key, name in (
            ("temperature", attr.GEN_AI_REQUEST_TEMPERATURE),
            ("top_p", attr.GEN_AI_REQUEST_TOP_P),
        ):
            value = payload.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                values[name] = float(value)
        self._span.set_attributes(values)

    # --- admission and scheduling ---------------------------------------------------------------------

    def admission_started(self) -> None:
        """The request enters admission (the window, or scheduling at once when it bypasses)."""
        if self._full:
            self._admission = self._recorder.child(self._span, attr.SPAN_ADMISSION)
        else:
            self._admission_started = self._recorder.clock_ns()

    def admitted(self, outcome: AdmissionOutcome) -> None:
        """Admission decided: record its wait and the decision (spans or SERVER attributes, by detail)."""
        now = self._recorder.clock_ns()
        bypass = str(outcome.role) == "bypass"
        values = _admission_attributes(outcome, bypass)
        values[attr.ADMISSION_WAITED_S] = outcome.waited_s
        span = self._admission
        self._admission = None
        if span is None and not self._full and not bypass:  # a wait in a window: worth its own span
            span = self._recorder.child(
                self._span, attr.SPAN_ADMISSION, start_time=self._admission_started or now
            )
        if span is not None:
            span.set_attributes(values)
            span.end(end_time=now)
        values[attr.SCHEDULE_PLACED_BY] = "request" if bypass else "window"
        started = max(now - int(outcome.scheduled_s * 1e9), self._admission_started)
        if self._full:
            self._schedule_span(outcome.decision, start=started, end=now, extra=values)
        else:
            self._schedule_event(outcome.decision, at=started, extra=values)

    def queued(self, waited_s: float, priority: int, flow: str, overtook: int) -> None:
        """The request waited in the flow-control queue: an event at its release, with the wait."""
        self._span.add_event(
            attr.EVENT_QUEUE,
            {
                attr.QUEUE_WAITED_S: waited_s,
                attr.QUEUE_PRIORITY: priority,
                attr.QUEUE_FLOW: flow,
                attr.QUEUE_OVERTOOK: overtook,
            },
            timestamp=self._recorder.clock_ns(),
        )

    def _schedule_span(
        self, decision: Decision, *, start: int, end: int, extra: Mapping[str, AttributeValue]
    ) -> None:
        chosen = decision.ranked[0]
        values = _decision_attributes(decision)
        values.update(extra)
        span = self._recorder.child(self._span, attr.SPAN_SCHEDULE, start_time=start, attributes=values)
        for rank, scored in enumerate(decision.ranked):
            event: dict[str, AttributeValue] = {
                attr.ENDPOINT: scored.name,
                attr.SCORE_RANK: rank,
                attr.SCORE_TOTAL: scored.total,
            }
            for scorer, score in scored.scores.items():
                event[attr.SCORE_PREFIX + scorer] = score
            span.add_event(attr.EVENT_SCORE, event, timestamp=start)
        span.end(end_time=end)
        self._span.set_attribute(attr.ENDPOINT, chosen.name)

    def _schedule_event(self, decision: Decision, *, at: int, extra: Mapping[str, AttributeValue]) -> None:
        values = _decision_attributes(decision)
        values.update(extra)
        self._span.set_attributes(values)
        ranked = decision.ranked
        event: dict[str, AttributeValue] = {
            attr.SCHEDULE_RANKED: [s.name for s in ranked],
            attr.SCORE_TOTAL: [s.total for s in ranked],
        }
        for scorer in ranked[0].scores:
            event[attr.SCORE_PREFIX + scorer] = [s.scores.get(scorer, 0.0) for s in ranked]
        self._span.add_event(attr.EVENT_SCHEDULE, event, timestamp=at)

    # --- upstream ---------------------------------------------------------------------------------------

    def upstream(self, endpoint: str, url: str, attempt: int) -> UpstreamSpan:
        """Start the CLIENT span of upstream attempt ``attempt`` (0 first) to ``endpoint`` at ``url``."""
        parts = urlsplit(url)
        values: dict[str, AttributeValue] = {
            attr.GEN_AI_OPERATION_NAME: self._operation,
            attr.GEN_AI_REQUEST_MODEL: self._model,
            attr.HTTP_REQUEST_METHOD: "POST",
            attr.URL_FULL: url,
            attr.SERVER_ADDRESS: parts.hostname or "",
            attr.SERVER_PORT: parts.port or (443 if parts.scheme == "https" else 80),
            attr.ENDPOINT: endpoint,
            attr.UPSTREAM_ATTEMPT: attempt,
        }
        if attempt > 0:
            values[attr.HTTP_REQUEST_RESEND_COUNT] = attempt
        span = self._recorder.child(
            self._span, f"{self._operation} {self._model}".strip(), kind=SpanKind.CLIENT, attributes=values
        )
        return UpstreamSpan(span)

    def served(self, endpoint: str | None, outcome: str) -> None:
        """The request's outcome (as in ``burstsched_requests_total``) and its last endpoint."""
        if endpoint is None:
            self._span.set_attribute(attr.UPSTREAM_RESULT, outcome)
        else:
            self._span.set_attributes({attr.UPSTREAM_RESULT: outcome, attr.ENDPOINT: endpoint})

    # --- the end ----------------------------------------------------------------------------------------

    def fail(self, error: BaseException) -> None:
        """The request's handler raised ``error``."""
        self._span.record_exception(error)
        self._span.set_attribute(attr.ERROR_TYPE, type(error).__qualname__)
        self._span.set_status(StatusCode.ERROR, str(error) or type(error).__name__)

    def end(self) -> None:
        """End the SERVER span (and an admission span left open by an error)."""
        if self._ended:
            return
        self._ended = True
        if self._admission is not None:
            self._admission.set_status(StatusCode.ERROR, "not admitted")
            self._admission.end()
            self._admission = None
        self._span.end()


Handler = Callable[[Scope, Receive, Send, RequestTrace | None], Awaitable[None]]


def _admission_attributes(outcome: AdmissionOutcome, bypass: bool) -> dict[str, AttributeValue]:
    values: dict[str, AttributeValue] = {
        attr.GROUP_ROLE: str(outcome.role),
        attr.GROUP_SIZE: outcome.group_size,
        attr.ADMISSION_BYPASS: bypass,
    }
    if outcome.window_id is not None:
        values[attr.WINDOW_ID] = outcome.window_id
    if outcome.group_id is not None:
        values[attr.GROUP_ID] = outcome.group_id
        values[attr.GROUP_SHARED_BLOCKS] = outcome.shared_blocks
    return values


def _decision_attributes(decision: Decision) -> dict[str, AttributeValue]:
    values: dict[str, AttributeValue] = {
        attr.ENDPOINT: decision.ranked[0].name,
        attr.SCHEDULE_CANDIDATES: len(decision.ranked),
    }
    prefix = decision.prefix
    if prefix is not None:
        values[attr.PREFIX_INDEX] = prefix.source
        values[attr.PREFIX_MATCHED_BLOCKS] = prefix.matched_blocks
        values[attr.PREFIX_TOTAL_BLOCKS] = prefix.total_blocks
    return values
