"""The app's tracer provider: built by the lifespan when tracing is on, shut down (and flushed) with it.

No global tracer provider is set: the :class:`Tracing` object is passed to whoever records spans. The OTLP
exporter is imported only when tracing is on.
"""

from __future__ import annotations

import anyio
import anyio.to_thread
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import Receive, Scope, Send

from burstsched import __version__
from burstsched.telemetry.settings import TracingSettings
from burstsched.telemetry.spans import Handler, RequestTrace

INSTRUMENTATION_NAME = "burstsched"


class Tracing:
    """A tracer provider exporting in batches over OTLP/HTTP, and the tracer requests record spans with.

    ``exporter`` replaces the OTLP exporter (the batch processor still runs); ``schedule_delay_ms`` replaces
    the batch delay (default: ``OTEL_BSP_SCHEDULE_DELAY`` or 5 s). :meth:`shutdown` exports what is left.
    """

    def __init__(
        self,
        settings: TracingSettings,
        *,
        exporter: SpanExporter | None = None,
        schedule_delay_ms: float | None = None,
    ) -> None:
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=settings.endpoint)
        sampler = (
            None if settings.sample_ratio is None else ParentBased(TraceIdRatioBased(settings.sample_ratio))
        )
        resource = Resource.create({SERVICE_NAME: settings.service_name, SERVICE_VERSION: __version__})
        self.settings = settings
        self.provider = TracerProvider(resource=resource, sampler=sampler, shutdown_on_exit=False)
        self.provider.add_span_processor(
            BatchSpanProcessor(exporter, schedule_delay_millis=schedule_delay_ms)
        )
        self.tracer: Tracer = self.provider.get_tracer(INSTRUMENTATION_NAME, __version__)
        self.propagator = TraceContextTextMapPropagator()

    def begin(self, scope: Scope) -> RequestTrace:
        """Start the SERVER span of one HTTP request."""
        return RequestTrace.begin(self.tracer, self.propagator, scope, full=self.settings.full_detail)

    async def serve(self, scope: Scope, receive: Receive, send: Send, handler: Handler) -> None:
        """Run ``handler`` for one request inside its SERVER span (ended however the handler ends).

        A request the sampler leaves out is served as an untraced one (``trace`` None): the client's own
        ``traceparent``, if any, still goes upstream as received.
        """
        trace = self.begin(scope)
        if not trace.span.is_recording():
            await handler(scope, receive, send, None)
            return
        try:
            await handler(scope, receive, trace.wrap_send(send), trace)
        except BaseException as error:
            trace.fail(error)
            raise
        finally:
            trace.end()

    def shutdown(self) -> None:
        """Export the spans still queued and stop the exporter (blocks; bounded by the exporter timeout)."""
        self.provider.shutdown()

    async def aclose(self) -> None:
        """:meth:`shutdown` on a worker thread, shielded from cancellation: the event loop keeps serving
        (an in-process receiver, for one) while the last spans are exported."""
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self.shutdown)
