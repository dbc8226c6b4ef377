"""The app's tracing: built by the lifespan when tracing is on, closed (and flushed) with it.

No global tracer provider is set: the :class:`Tracing` object is passed to whoever records spans. Spans are
:class:`~burstsched.telemetry.span_record.SpanRecord` objects, exported by
:class:`~burstsched.telemetry.export.SpanBatcher` on the event loop (see those modules for why not the
SDK's spans, batch processor and exporter).
"""

from __future__ import annotations

import random

import anyio
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import Receive, Scope, Send

from burstsched import __version__
from burstsched.telemetry.export import OtlpSender, SpanBatcher
from burstsched.telemetry.otlp_encode import SpanEncoder
from burstsched.telemetry.settings import TracingSettings
from burstsched.telemetry.span_record import SpanRecorder
from burstsched.telemetry.spans import Handler, RequestTrace

INSTRUMENTATION_NAME = "burstsched"


class Tracing:
    """The recorder requests start spans with, and the batcher that exports them over OTLP/HTTP. The owner
    runs :meth:`run` in a task and awaits :meth:`aclose` at exit, which exports what is left."""

    def __init__(self, settings: TracingSettings, *, rng: random.Random | None = None) -> None:
        resource = Resource.create({SERVICE_NAME: settings.service_name, SERVICE_VERSION: __version__})
        self.settings = settings
        self.batcher = SpanBatcher(
            OtlpSender(settings.endpoint, settings.export, rng=rng),
            SpanEncoder(resource, INSTRUMENTATION_NAME, __version__),
        )
        self.recorder = SpanRecorder(self.batcher.add, _sampler(settings), resource, rng=rng)
        self.propagator = TraceContextTextMapPropagator()

    def begin(self, scope: Scope) -> RequestTrace | None:
        """Start the SERVER span of one HTTP request (None: the sampler leaves it out)."""
        return RequestTrace.begin(self.recorder, self.propagator, scope, full=self.settings.full_detail)

    async def serve(self, scope: Scope, receive: Receive, send: Send, handler: Handler) -> None:
        """Run ``handler`` for one request inside its SERVER span (ended however the handler ends).

        A request the sampler leaves out is served as an untraced one (``trace`` None): the client's own
        ``traceparent``, if any, still goes upstream as received.
        """
        trace = self.begin(scope)
        if trace is None:
            await handler(scope, receive, send, None)
            return
        try:
            await handler(scope, receive, trace.wrap_send(send), trace)
        except BaseException as error:
            trace.fail(error)
            raise
        finally:
            trace.end()

    async def run(self) -> None:
        """Export finished spans in batches until cancelled."""
        await self.batcher.run()

    async def aclose(self) -> None:
        """Export the spans still queued (each batch bounded by the export timeout), then stop; shielded from
        cancellation."""
        with anyio.CancelScope(shield=True):
            await self.batcher.aclose()


def _sampler(settings: TracingSettings) -> Sampler:
    """``ParentBased(TraceIdRatioBased(ratio))``, or with no ratio the sampler ``OTEL_TRACES_SAMPLER`` names,
    resolved as the SDK resolves it (a provider built for that alone, never used to record)."""
    if settings.sample_ratio is not None:
        return ParentBased(TraceIdRatioBased(settings.sample_ratio))
    return TracerProvider(shutdown_on_exit=False).sampler
