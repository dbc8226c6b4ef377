"""The picker's gRPC server: Envoy's ``ExternalProcessor`` service and the gRPC health services.

The router is assembled exactly as ``burstsched serve`` assembles it (the app's lifespan in
:mod:`burstsched.front.app`: pool, discovery, scheduler, admission, index, metrics); the HTTP routes are not
served, only the lifespan runs. Health (the gRPC health checking protocol, on the same port): ``liveness``
and the overall service ``""`` serve as soon as the server runs; ``readiness`` and
``envoy.service.ext_proc.v3.ExternalProcessor`` once the pool has been checked, and until shutdown.

Metrics: with ``metrics_port``, ``GET /metrics`` over plain HTTP on that port (llm-d's picker uses 9090)
answers the router's Prometheus page, the same families as ``serve``'s ``/metrics``; ``GET /health`` (200
while the process serves) and ``GET /ready`` (200 once the pool has a healthy endpoint, else 503) are there
too, for probes that cannot speak gRPC over TLS (Kubernetes' gRPC probes are plaintext only).

In tests::

    async with running_epp(config) as epp:       # 127.0.0.1, a free port, the current event loop
        epp.port, epp.router.pool
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterable, AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import grpc
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from burstsched.config import RouterConfig
from burstsched.discovery import Discovery
from burstsched.epp.pb.ext_proc_pb2 import ProcessingRequest, ProcessingResponse
from burstsched.epp.picker import DEFAULT_MAX_WAIT_S, Picker
from burstsched.epp.session import Session
from burstsched.epp.tls import Tls
from burstsched.framework import PluginRegistry
from burstsched.front.app import Router, create_app
from burstsched.telemetry.metrics import CONTENT_TYPE

log = logging.getLogger(__name__)

SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
"""Envoy's service name: the method path is ``/envoy.service.ext_proc.v3.ExternalProcessor/Process``."""
LIVENESS = "liveness"
READINESS = "readiness"
_MESSAGE_SLACK = 1 << 20


@dataclass(frozen=True)
class RunningEpp:
    """A picker serving on ``host:port``; ``router`` holds the live pool, scheduler and metrics."""

    host: str
    port: int
    router: Router
    metrics_port: int | None = None
    """The Prometheus port (``GET /metrics``), when one is served."""
    tls: Tls | None = None
    """The certificate it serves, when it serves TLS."""

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"


class ExternalProcessor:
    """Envoy's ``Process`` method: one :class:`Session` per stream."""

    def __init__(self, router: Router, picker: Picker, served_header: str | None = None) -> None:
        self._router = router
        self._picker = picker
        self._served_header = served_header

    async def process(
        self, requests: AsyncIterable[ProcessingRequest], context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[ProcessingResponse]:
        async for answer in Session(self._router, self._picker, self._served_header).run(requests):
            yield answer

    def handler(self) -> grpc.GenericRpcHandler:
        method = grpc.stream_stream_rpc_method_handler(
            self.process,
            request_deserializer=ProcessingRequest.FromString,
            response_serializer=ProcessingResponse.SerializeToString,
        )
        return grpc.method_handlers_generic_handler(SERVICE, {"Process": method})


@asynccontextmanager
async def running_epp(
    config: RouterConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    fallbacks: int = 0,
    tls: Tls | None = None,
    registry: PluginRegistry | None = None,
    rng: random.Random | None = None,
    grace_s: float = 5.0,
    max_wait_s: float = DEFAULT_MAX_WAIT_S,
    metrics_port: int | None = None,
    discovery: Discovery | None = None,
    served_header: str | None = None,
) -> AsyncIterator[RunningEpp]:
    """Assemble the router, serve the picker on ``host:port`` (0: a free port) until the block ends;
    ``max_wait_s``: the cap on a request's wait in admission (see :mod:`burstsched.epp.picker`);
    ``metrics_port``: serve ``GET /metrics`` there (0: a free port; None: no metrics port); ``discovery``:
    where the endpoints come from instead of the config's (e.g. an InferencePool); ``served_header``: a
    response header naming the ``IP:PORT`` that served (None: none)."""
    app = create_app(config, registry=registry, rng=rng, discovery=discovery)
    async with app.router.lifespan_context(app):
        router: Router = app.state.router
        health = HealthServicer()
        for name in (LIVENESS, ""):
            await health.set(name, health_pb2.HealthCheckResponse.SERVING)
        for name in (READINESS, SERVICE):
            await health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        max_message = config.limits.max_body_bytes + _MESSAGE_SLACK  # BUFFERED sends the body in one message
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", max_message),
                ("grpc.max_send_message_length", max_message),
            ]
        )
        server.add_generic_rpc_handlers(
            [
                ExternalProcessor(
                    router,
                    Picker(router, fallbacks=fallbacks, rng=rng, max_wait_s=max_wait_s),
                    served_header,
                ).handler()
            ]
        )
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if tls is None:
            bound = server.add_insecure_port(address)
        else:
            credentials = grpc.ssl_server_credentials([(tls.key, tls.cert)])
            bound = server.add_secure_port(address, credentials)
        await server.start()
        metrics = await _metrics_site(router, host, metrics_port) if metrics_port is not None else None
        try:
            for name in (READINESS, SERVICE):
                await health.set(name, health_pb2.HealthCheckResponse.SERVING)
            yield RunningEpp(host, bound, router, metrics[1] if metrics is not None else None, tls)
        finally:
            await health.enter_graceful_shutdown()
            await server.stop(grace_s)
            if metrics is not None:
                await metrics[0].cleanup()


async def _metrics_site(router: Router, host: str, port: int) -> tuple[web.AppRunner, int]:
    """``GET /metrics`` on ``host:port`` (aiohttp, in this event loop); the runner and the bound port."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=router.metrics.render(), headers={"content-type": CONTENT_TYPE})

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def ready(_: web.Request) -> web.Response:
        healthy = router.pool.healthy_count()
        return web.Response(text=f"{healthy} healthy endpoint(s)", status=200 if healthy else 503)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, int(runner.addresses[0][1])
