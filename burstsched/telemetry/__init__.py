"""Tracing: OpenTelemetry spans of each request, exported over OTLP/HTTP; off, it costs nothing.

The app's lifespan resolves :class:`TracingSettings` from the ``tracing:`` config section and the ``OTEL_*``
environment (:func:`resolve_tracing`), builds a :class:`Tracing` when they say so, and shuts it down at exit.
Each traced request gets a :class:`RequestTrace` (its SERVER span) and, per upstream attempt, an
:class:`UpstreamSpan`; the spans are :mod:`~burstsched.telemetry.span_record` records, exported by
:mod:`~burstsched.telemetry.export`. Attribute names are in :mod:`burstsched.telemetry.attributes`.
"""

from burstsched.telemetry import attributes
from burstsched.telemetry.provider import Tracing
from burstsched.telemetry.settings import TracingSettings, resolve_tracing
from burstsched.telemetry.spans import AdmissionOutcome, Handler, RequestTrace, UpstreamSpan
from burstsched.telemetry.usage import ResponseInfo, StreamTail, from_json_body, from_sse_tail

__all__ = [
    "AdmissionOutcome",
    "Handler",
    "RequestTrace",
    "ResponseInfo",
    "StreamTail",
    "Tracing",
    "TracingSettings",
    "UpstreamSpan",
    "attributes",
    "from_json_body",
    "from_sse_tail",
    "resolve_tracing",
]
