"""The app's tracer provider: built by the lifespan when tracing is on, shut down (and flushed) with it.

No global tracer provider is set: the :class:`Tracing` object is passed to whoever records spans. Finished
spans are exported by the app's own :class:`~burstsched.telemetry.export.SpanBatcher` on the event loop (see
that module for why not the SDK's batch processor and exporter).
"""

from __future__ import annotations

import random

import anyio
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import Receive, Scope, Send

from burstsched import __version__
from burstsched.telemetry.export import OtlpSender, SpanBatcher
from burstsched.telemetry.settings import TracingSettings
from burstsched.telemetry.spans import Handler, RequestTrace

INSTRUMENTATION_NAME = "burstsched"


class Tracing:
    """A tracer provider whose spans are exported over OTLP/HTTP by :attr:`batcher`, and the tracer requests
    record spans with. The owner runs :meth:`run` in a task and awaits :meth:`aclose` at exit, which exports
    what is left."""

    def __init__(self, settings: TracingSettings, *, rng: random.Random | None = None) -> None:
        sampler = (
            None if settings.sample_ratio is None else ParentBased(TraceIdRatioBased(settings.sample_ratio))
        )
        resource = Resource.create({SERVICE_NAME: settings.service_name, SERVICE_VERSION: __version__})
        self.settings = settings
        self.batcher = SpanBatcher(OtlpSender(settings.endpoint, settings.export, rng=rng))
        self.provider = TracerProvider(resource=resource, sampler=sampler, shutdown_on_exit=False)
        self.provider.add_span_processor(self.batcher)
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

    async def run(self) -> None:
        """Export finished spans in batches until cancelled."""
        await self.batcher.run()

    async def aclose(self) -> None:
        """Export the spans still queued (each batch bounded by the export timeout), then stop; shielded from
        cancellation."""
        with anyio.CancelScope(shield=True):
            await self.batcher.aclose()
            self.provider.shutdown()
