"""The router's spans as plain records: what OTLP carries, and nothing the router does not use.

OpenTelemetry's SDK span is general: every attribute is checked and copied into a locked, bounded mapping,
every span goes through a chain of processors, and its context objects are rebuilt for each propagation.
Measured in process, that cost the event loop about 195 µs per traced request of ours (two spans, about 45
attributes and two events), most of it in the attribute checks. The router sets a fixed set of attributes
of known types, so a :class:`SpanRecord` keeps them in a plain dict, writes its ``traceparent`` itself and,
when it ends, is handed straight to the exporter (:class:`~burstsched.telemetry.export.SpanBatcher`).

What stays OpenTelemetry's own: the resource (``Resource.create``: service name and version,
``OTEL_RESOURCE_ATTRIBUTES``, the SDK's identity), the sampler (``ParentBased(TraceIdRatioBased)``, or the
one ``OTEL_TRACES_SAMPLER`` names), and the W3C ``traceparent``/``tracestate`` extraction. A root span asks
the sampler; an unsampled request gets no record at all. Children of a record are always recorded.
Ids come from the injected RNG (128 and 64 random bits, never zero, as the SDK's generator makes them).
There are no span limits: the router's spans hold a bounded set of attributes and events.
"""

from __future__ import annotations

import random
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Final

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.sampling import Decision, Sampler
from opentelemetry.trace import SpanKind, StatusCode, get_current_span
from opentelemetry.util.types import AttributeValue

SAMPLED: Final = 0x01
"""The W3C ``sampled`` trace flag."""

Attributes = dict[str, AttributeValue]
Event = tuple[str, int, Attributes | None]
"""(name, time in ns, attributes)."""


class SpanRecord:
    """One span: started by :class:`SpanRecorder`, filled by the request path, handed on at :meth:`end`."""

    __slots__ = (
        "name",
        "kind",
        "trace_id",
        "span_id",
        "parent_span_id",
        "parent_remote",
        "trace_state",
        "trace_flags",
        "start_ns",
        "end_ns",
        "attributes",
        "events",
        "status",
        "status_message",
        "_recorder",
    )

    def __init__(
        self,
        recorder: SpanRecorder,
        name: str,
        kind: SpanKind,
        trace_id: int,
        span_id: int,
        parent_span_id: int,
        *,
        parent_remote: bool = False,
        trace_state: str = "",
        trace_flags: int = SAMPLED,
        start_ns: int,
        attributes: Attributes | None = None,
    ) -> None:
        self.name = name
        self.kind = kind
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_span_id = parent_span_id
        """0 for a root span."""
        self.parent_remote = parent_remote
        self.trace_state = trace_state
        """The W3C ``tracestate`` value as it goes on the wire ("" when none)."""
        self.trace_flags = trace_flags
        self.start_ns = start_ns
        self.end_ns = 0
        self.attributes: Attributes = attributes if attributes is not None else {}
        self.events: list[Event] = []
        self.status = StatusCode.UNSET
        self.status_message = ""
        self._recorder = recorder

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        self.attributes[key] = value

    def set_attributes(self, values: Mapping[str, AttributeValue]) -> None:
        self.attributes.update(values)

    def add_event(
        self, name: str, attributes: Attributes | None = None, timestamp: int | None = None
    ) -> None:
        self.events.append((name, timestamp or self._recorder.clock_ns(), attributes))

    def set_status(self, code: StatusCode, message: str = "") -> None:
        """The span's status; a description is kept only with ``ERROR`` (as the SDK does)."""
        self.status = code
        self.status_message = message if code is StatusCode.ERROR else ""

    def record_exception(self, error: BaseException) -> None:
        """An ``exception`` event with the semantic conventions' attributes (as the SDK writes them)."""
        kind = type(error)
        name = (
            kind.__qualname__
            if kind.__module__ in ("builtins", "")
            else f"{kind.__module__}.{kind.__qualname__}"
        )
        self.add_event(
            "exception",
            {
                "exception.type": name,
                "exception.message": str(error),
                "exception.stacktrace": "".join(traceback.format_exception(error)),
                "exception.escaped": "False",
            },
        )

    def traceparent(self) -> str:
        """This span as the W3C ``traceparent`` header's value."""
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{self.trace_flags:02x}"

    def end(self, end_time: int | None = None) -> None:
        """End the span (once; later calls do nothing) and hand it to the exporter."""
        if self.end_ns:
            return
        self.end_ns = end_time or self._recorder.clock_ns()
        self._recorder.sink(self)


class SpanRecorder:
    """Starts :class:`SpanRecord` objects: roots through the sampler, children of records as they come.

    ``sink`` takes each span as it ends; ``rng`` makes the ids; ``clock_ns`` the timestamps.
    """

    def __init__(
        self,
        sink: Callable[[SpanRecord], None],
        sampler: Sampler,
        resource: Resource,
        *,
        rng: random.Random | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.sink = sink
        self.sampler = sampler
        self.resource = resource
        self.clock_ns = clock_ns
        self._bits = (rng or random.Random()).getrandbits

    def _id(self, bits: int) -> int:
        value = self._bits(bits)
        while not value:
            value = self._bits(bits)
        return value

    def root(
        self,
        name: str,
        parent: Context | None,
        *,
        kind: SpanKind = SpanKind.SERVER,
        attributes: Attributes | None = None,
    ) -> SpanRecord | None:
        """A span continuing ``parent`` (an extracted remote context, or None for a new trace), or None when
        the sampler leaves it out."""
        remote = get_current_span(parent).get_span_context() if parent is not None else None
        if remote is not None and not remote.is_valid:
            remote = None
        trace_id = remote.trace_id if remote is not None else self._id(128)
        result = self.sampler.should_sample(
            parent, trace_id, name, kind, attributes, None, remote.trace_state if remote else None
        )
        if result.decision is not Decision.RECORD_AND_SAMPLE:
            return None  # RECORD_ONLY too: a span that is never exported is not worth recording here
        if result.attributes:
            attributes = {**(attributes or {}), **result.attributes}
        trace_state = result.trace_state
        return SpanRecord(
            self,
            name,
            kind,
            trace_id,
            self._id(64),
            remote.span_id if remote is not None else 0,
            parent_remote=remote is not None,
            trace_state=trace_state.to_header() if trace_state else "",
            start_ns=self.clock_ns(),
            attributes=attributes,
        )

    def child(
        self,
        parent: SpanRecord,
        name: str,
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes | None = None,
        start_time: int | None = None,
    ) -> SpanRecord:
        """A span under ``parent``, in its trace (recorded, since the parent is)."""
        return SpanRecord(
            self,
            name,
            kind,
            parent.trace_id,
            self._id(64),
            parent.span_id,
            trace_state=parent.trace_state,
            trace_flags=parent.trace_flags,
            start_ns=start_time or self.clock_ns(),
            attributes=attributes,
        )
