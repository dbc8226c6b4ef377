"""The Starlette application: ``create_app(config, ...)`` builds the router; its lifespan owns the resources.

Routes: ``POST /v1/chat/completions`` and ``POST /v1/completions`` (scheduled and proxied),
``GET /v1/models``, ``GET /health`` (liveness), ``GET /ready`` (at least one healthy endpoint),
``GET /metrics`` (the router's own metrics), ``POST /admin/reset`` (drop learned scheduling state, e.g. the
prefix index), ``POST /admin/reload`` (read the config again and swap it in, see
:mod:`burstsched.front.live_config`).

Middleware, outermost first: refusal while draining on shutdown (:mod:`burstsched.front.draining`), API and
admin keys (:mod:`burstsched.front.auth`), the body read deadline (:mod:`burstsched.front.limits`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import partial

import anyio
import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from burstsched.admission import Admission
from burstsched.config import EndpointConfig, RouterConfig
from burstsched.discovery import Discovery, build_discovery
from burstsched.dispatch import (
    Dispatcher,
    Prewarmer,
    Upstream,
    UpstreamClient,
    getter,
    poster,
    tls_context,
    upstream_request_headers,
)
from burstsched.dispatch.drain import Drainer
from burstsched.flow import FlowQueue, ProbabilisticAdmitter
from burstsched.framework import ApiKind, KVEventConsumer, PluginContext, PluginRegistry
from burstsched.front.auth import AuthMiddleware, AuthSettings
from burstsched.front.decide import Refusal, decide
from burstsched.front.draining import RefuseWhileDraining
from burstsched.front.hot_path import ErrorGuard, RouterApp
from burstsched.front.limits import BodyDeadlineMiddleware
from burstsched.front.live_config import ConfigSource, LiveConfig
from burstsched.front.plugin_headers import echo_endpoint
from burstsched.front.request import ClientDisconnected, RequestError, read_body
from burstsched.kvcache import KVEventHub, stream_addresses
from burstsched.pool import CircuitSettings, EndpointPool
from burstsched.recording import Recorder
from burstsched.recording.line import usage_counts
from burstsched.scheduling import Scheduler, build_scheduler
from burstsched.telemetry import RequestTrace, Tracing, resolve_tracing
from burstsched.telemetry.metrics import CONTENT_TYPE, RouterMetrics
from burstsched.tokenization import PromptTokenizer, build_prompt_tokenizer
from burstsched.wire.errors import error_response

log = logging.getLogger(__name__)

Clock = Callable[[], float]


@dataclass
class Router:
    """The running router's parts, built by the lifespan; the app's handlers go through it."""

    config: RouterConfig
    upstream: Upstream
    """The client that dispatches requests to the replicas (health, models, scrapes and ``/tokenize`` use a
    second one, so that dispatch connections idle out after a burst)."""
    pool: EndpointPool
    scheduler: Scheduler
    dispatcher: Dispatcher
    metrics: RouterMetrics
    admission: Admission
    tracing: Tracing | None = None
    tokenizer: PromptTokenizer | None = None
    """Turns prompts into the engine's token ids for the precise prefix index (None: not used)."""
    hub: KVEventHub | None = None
    clock: Clock = time.monotonic
    discovery_source: str = "static"
    recorder: Recorder | None = None
    """Traffic recording (``recording:``): one line per dispatched request (None: off)."""
    prewarmer: Prewarmer | None = None
    """Copies of hot shared prefixes to idle endpoints (``prewarm:``; None: off)."""
    flow: FlowQueue | None = None
    """The flow-control queue (``flow_control:``; None: off)."""
    admitter: ProbabilisticAdmitter | None = None
    """Sheddable requests refused by chance as the pool saturates (``flow_control.admitter``; None: off)."""

    async def handle_completion(
        self, api: ApiKind, scope: Scope, receive: Receive, send: Send, trace: RequestTrace | None = None
    ) -> None:
        """Read one chat or completions request, decide where it goes (:func:`.decide.decide`, the same
        decision as the gateway's picker) and proxy it there (``trace``: its spans)."""
        arrived = time.monotonic()
        client_headers: list[tuple[bytes, bytes]] = scope["headers"]
        header_map = _wanted_headers(client_headers)
        request_timeout_ms = self.config.limits.request_timeout_ms
        deadline = None
        if request_timeout_ms is not None:
            deadline = asyncio.get_running_loop().time() + request_timeout_ms / 1000.0
        try:
            body = await read_body(receive, header_map, self.config.limits.max_body_bytes)
        except ClientDisconnected:
            self.metrics.request_done(None, "cancelled")
            return
        except RequestError as exc:
            self.metrics.request_done(None, "rejected")
            response = error_response(exc.status, exc.message, param=exc.param, code=exc.code)
            await response(scope, receive, send)
            return
        outcome = await decide(
            self, api, body, client_headers, header_map.get("x-request-id"), receive=receive, trace=trace
        )
        if isinstance(outcome, Refusal):
            self.metrics.request_done(None, outcome.outcome)
            if outcome.outcome != "cancelled":  # the client went away: nothing to send
                refusal = error_response(
                    outcome.status,
                    outcome.message,
                    param=outcome.param,
                    code=outcome.code,
                    headers=dict(outcome.headers) if outcome.headers else None,
                )
                await refusal(scope, receive, send)
            return
        parsed, request, profile = outcome.parsed, outcome.request, self.scheduler.profile
        served = await self.dispatcher.forward(
            parsed,
            request,
            outcome.decision,
            upstream_request_headers(client_headers, request.request_id),
            receive,
            echo_endpoint(send, profile.echo_headers),
            trace=trace,
            deadline=deadline,
            prefill_cap=outcome.prefill_cap,
        )
        if self.recorder is not None:  # queued here (response sent); formatted and written in batches
            self.recorder.record(arrived, parsed, request, outcome.admitted, served, outcome.queued_s)
        if self.flow is not None and served.outcome == "ok":  # the tokens it used, for program-aware fairness
            prompt_tokens, output_tokens, _ = usage_counts(served.response_tail)
            flow = outcome.identity.flow
            self.flow.completed(flow, prompt_tokens or request.prompt_tokens, output_tokens or 0)


_WANTED_HEADERS = frozenset({b"content-length", b"x-request-id"})


def _wanted_headers(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The request headers the router itself reads (the rest go upstream untouched)."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in headers if k in _WANTED_HEADERS}


def _router(scope: Scope) -> Router:
    router: Router = scope["app"].state.router
    return router


class _CompletionsEndpoint:
    """A raw ASGI endpoint, so the proxy writes straight to ``send``."""

    def __init__(self, api: ApiKind) -> None:
        self.api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        router = _router(scope)
        send = router.metrics.timed(send)
        if router.tracing is None:
            await router.handle_completion(self.api, scope, receive, send)
        else:
            await router.tracing.serve(scope, receive, send, partial(router.handle_completion, self.api))


async def _models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": _router(request.scope).pool.model_cards()})


async def _health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def _ready(request: Request) -> Response:
    healthy = _router(request.scope).pool.healthy_count()
    if healthy == 0:
        return error_response(503, "no healthy endpoint")
    return JSONResponse({"status": "ready", "healthy_endpoints": healthy})


async def _metrics(request: Request) -> Response:
    return Response(_router(request.scope).metrics.render(), media_type=CONTENT_TYPE)


async def _endpoints(request: Request) -> Response:
    """The pool's members: state (joining, healthy, unhealthy, draining), url, source, since (epoch s)."""
    router = _router(request.scope)
    now_wall, now = time.time(), router.clock()
    return JSONResponse(
        {
            "discovery": router.discovery_source,
            "endpoints": [
                {
                    "name": s.name,
                    "url": s.url,
                    "state": s.state,
                    "source": s.source,
                    "since": round(now_wall - (now - s.since), 3),
                    "in_flight": s.in_flight,
                }
                for s in router.pool.statuses()
            ],
        }
    )


async def _reset(request: Request) -> Response:
    router = _router(request.scope)
    router.scheduler.reset()
    router.admission.reset()
    return JSONResponse({"status": "reset"})


async def _queue(request: Request) -> Response:
    """The flow-control queue now: requests and bytes per priority band, each band's flows and oldest wait."""
    flow = _router(request.scope).flow
    return JSONResponse(flow.describe() if flow is not None else {"enabled": False, "requests": 0})


async def _reload(request: Request) -> Response:
    """Read the config again and swap it in; 200 with the outcome when applied or unchanged, 422 refused."""
    live: LiveConfig = request.app.state.live_config
    outcome = await live.reload("admin")
    return JSONResponse(outcome.as_json(), status_code=422 if outcome.outcome == "refused" else 200)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(exc.status_code, exc.detail, headers=dict(exc.headers or {}))


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    log.error("unexpected error serving %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal error in the router")


def _event_hub(
    config: RouterConfig, consumers: list[KVEventConsumer], metrics: RouterMetrics, in_process: bool
) -> KVEventHub | None:
    """The KV-event hub when the profile has a consumer (the precise prefix producer)."""
    if not consumers:
        return None
    addresses = stream_addresses(config.endpoints, config.kv_events)
    missing = {e.endpoint_name for e in config.endpoints} - {a.endpoint for a in addresses}
    if missing and not in_process:
        log.warning(
            "no KV-event address for %s (set kv_events.endpoint_template or the endpoint's kv_events): "
            "their prefix matches come from the approximate index",
            ", ".join(sorted(missing)),
        )
    kv = config.kv_events
    return KVEventHub(
        addresses,
        consumers,
        topic=kv.topic,
        replay_timeout_s=kv.replay_timeout_ms / 1000.0,
        observer=metrics,
    )


def _prompt_tokenizer(
    config: RouterConfig, needed: bool, upstream: Upstream, pool: EndpointPool
) -> PromptTokenizer | None:
    """The prompt tokenizer when a precise producer needs token ids and the config names a source."""
    if not needed:
        return None

    def any_healthy_url() -> str | None:
        return next((s.url for s in pool.snapshots() if s.healthy), None)

    tokenizer = build_prompt_tokenizer(config.tokenizer, poster(upstream), any_healthy_url)
    if tokenizer is None:
        log.warning(
            "the profile has a precise prefix producer but tokenizer.source is none: every request is "
            "matched by the approximate index"
        )
    return tokenizer


def _upstream_client(config: RouterConfig) -> UpstreamClient:
    """The production upstream client, as the ``dispatch`` section configures it."""
    dispatch = config.dispatch
    return UpstreamClient(
        max_connections=dispatch.max_connections,
        keepalive=dispatch.max_keepalive_connections > 0,
        tls=tls_context(ca_file=dispatch.tls.ca_file, verify=dispatch.tls.verify),
    )


def create_app(
    config: RouterConfig,
    *,
    registry: PluginRegistry | None = None,
    upstream: Upstream | None = None,
    clock: Clock = time.monotonic,
    rng: random.Random | None = None,
    discovery: Discovery | None = None,
    config_source: ConfigSource | None = None,
    kv_events_in_process: bool = False,
) -> Starlette:
    """The router as an ASGI app; its lifespan builds the scheduler, the upstream client and the pool.

    ``registry`` defaults to the installed plugins; ``upstream`` replaces the upstream client for every
    request to the replicas (default: an :class:`UpstreamClient` the lifespan opens and closes; tests pass
    e.g. an :class:`~burstsched.dispatch.HttpxUpstream` over ``httpx.MockTransport``);
    ``clock`` (monotonic seconds) and ``rng`` drive staleness and the pickers' randomness; ``discovery``
    replaces the source the config's ``discovery`` section names (tests inject a resolver this way);
    ``config_source`` reads the config again for a live reload (``POST /admin/reload``, and ``serve``'s SIGHUP
    and file watch; None: a reload is refused); ``kv_events_in_process``: the caller hands the replicas' KV
    events to the hub itself (``KVEventHub.follow_in_process``, an in-process replay), so endpoints without a
    ZMQ address are expected.
    """
    registry = registry if registry is not None else PluginRegistry.discover()
    rng = rng if rng is not None else random.Random()
    build_scheduler(
        config, registry, PluginContext(rng=random.Random(0), clock=clock)
    )  # fail fast on bad config
    tracing_settings = resolve_tracing(config.tracing, os.environ)  # None: tracing off, no tracer at all
    auth_settings = AuthSettings.resolve(config.auth, os.environ)
    drainer = Drainer(config.shutdown.drain_timeout_ms / 1000.0)
    circuit = config.dispatch.circuit
    circuit_settings = CircuitSettings(
        circuit.failure_threshold, circuit.open_ms / 1000, max(circuit.open_ms, circuit.max_open_ms) / 1000
    )
    first_byte_ms = config.dispatch.timeouts.first_byte_ms
    source = discovery if discovery is not None else build_discovery(config)
    dynamic = source.source != "static"

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        metrics = RouterMetrics()
        plugin_context = PluginContext(rng=rng, clock=clock)
        scheduler = build_scheduler(
            config,
            registry,
            plugin_context,
            observer=metrics.observe_plugin,
            cycle_observer=metrics.scheduling_duration.observe,
        )
        timeouts = config.dispatch.timeouts
        upstream_timeouts = httpx.Timeout(
            connect=timeouts.connect_ms / 1000.0,
            read=timeouts.read_ms / 1000.0,
            write=timeouts.write_ms / 1000.0,
            pool=timeouts.pool_ms / 1000.0,
        )
        async with AsyncExitStack() as resources:
            # Dispatch and the pool's own traffic (health, models, scrapes, /tokenize) use separate
            # connections: the scrapes every few tens of ms would otherwise keep every connection a burst
            # opened busy, so the dispatch pool could never shrink back once the burst is over.
            upstream_io = upstream
            control_io = upstream
            if upstream_io is None:
                upstream_io = await resources.enter_async_context(_upstream_client(config))
            if control_io is None:
                control_io = await resources.enter_async_context(_upstream_client(config))
            consumers = [p for p in scheduler.profile.plugins if isinstance(p, KVEventConsumer)]
            hub = _event_hub(config, consumers, metrics, kv_events_in_process)

            def endpoint_down(name: str) -> None:
                scheduler.forget_endpoint(name)
                if hub is not None:
                    hub.endpoint_down(name)

            def endpoint_removed(name: str) -> None:
                scheduler.forget_endpoint(name)
                if hub is not None:
                    hub.remove_endpoint(name)

            pool = EndpointPool(
                [] if dynamic else config.endpoints,
                config.pool,
                getter(control_io),
                clock=clock,
                models=config.models,
                circuit=circuit_settings,
                on_down=endpoint_down,
                on_removed=endpoint_removed,
                on_change=metrics.discovery_change,
            )
            tokenizer = _prompt_tokenizer(config, bool(consumers), control_io, pool)
            metrics.watch_endpoints(pool.snapshots, pool.prefill_demands)
            metrics.watch_discovery(lambda: [s.state for s in pool.statuses()])
            metrics.watch_plugins(scheduler.profile.plugins, lambda: pool.names)
            loop = asyncio.get_running_loop()
            runtime = metrics.watch_runtime(lambda: len(asyncio.all_tasks(loop)))
            dispatcher = Dispatcher(
                upstream_io,
                pool,
                metrics,
                on_dispatch=scheduler.on_dispatch,
                max_attempts=config.dispatch.max_attempts,
                timeouts=upstream_timeouts,
                first_byte_timeout_s=None if first_byte_ms is None else first_byte_ms / 1000.0,
                drainer=drainer,
                keep_response_tail=config.recording.enabled
                or config.flow_control.fairness == "program-aware",
            )
            recorder = None
            if config.recording.enabled:
                recorder = Recorder(config.recording, config.prefix_hashing, geometry=pool.kv_geometry)
                recorder.start()
                resources.callback(recorder.close)  # writes what the last flush left
            tracing = Tracing(tracing_settings) if tracing_settings is not None else None
            if tracing is not None:
                metrics.watch_trace_export(tracing.batcher.counts)
            admission = Admission(config.admission, scheduler, pool.snapshots)
            flow = None
            if config.flow_control.enabled:
                flow = FlowQueue(
                    config.flow_control,
                    scheduler,
                    pool.snapshots,
                    min_shared_blocks=config.admission.min_shared_blocks,
                    max_per_endpoint=config.admission.max_per_endpoint,
                    follow_s=config.admission.late_members_ms / 1000.0,
                    room_source=pool,
                    metrics=metrics,
                )
            prewarmer = None
            if config.prewarm.enabled:
                prewarmer = Prewarmer(
                    config.prewarm,
                    upstream_io,
                    pool,
                    metrics,
                    on_dispatch=scheduler.on_dispatch,
                    clock=clock,
                )
                await resources.enter_async_context(prewarmer)  # copies in flight end with the router
            app.state.router = Router(
                config, upstream_io, pool, scheduler, dispatcher, metrics, admission, tracing, tokenizer, hub
            )
            app.state.router.clock = clock
            app.state.router.prewarmer = prewarmer
            app.state.router.flow = flow
            if config.flow_control.admitter is not None:
                app.state.router.admitter = ProbabilisticAdmitter(config.flow_control.admitter, rng.random)
            app.state.router.discovery_source = source.source
            router = app.state.router

            def swapped(new_config: RouterConfig) -> None:
                router.config = new_config

            app.state.live_config = LiveConfig(
                config,
                config_source,
                registry,
                plugin_context,
                scheduler,
                admission,
                pool,
                metrics,
                hub,
                source.source,
                swapped,
            )

            def apply(endpoints: list[EndpointConfig]) -> None:
                pool.sync(endpoints, source=source.source)
                if hub is not None:
                    for address in stream_addresses(endpoints, config.kv_events):
                        hub.add_endpoint(address)

            async def follow_discovery() -> None:
                async for endpoints in source.endpoint_sets():
                    apply(endpoints)

            app.state.router.recorder = recorder
            await pool.refresh()
            if flow is not None:
                await resources.enter_async_context(flow)  # refuses what is still queued at shutdown
            async with admission, anyio.create_task_group() as tg:
                if hub is not None:
                    # a reload may add endpoints, whose streams the hub then follows
                    await tg.start(partial(hub.run, dynamic=dynamic or config_source is not None))
                tg.start_soon(pool.run)
                if dynamic:
                    tg.start_soon(follow_discovery, name="burstsched-discovery")
                tg.start_soon(runtime.sampler.run, name="burstsched-loop-lag")
                if recorder is not None:
                    tg.start_soon(recorder.run, name="burstsched-recorder")
                if tracing is not None:
                    tg.start_soon(tracing.run, name="burstsched-span-export")
                try:
                    yield
                finally:
                    tg.cancel_scope.cancel()
                    if tracing is not None:
                        await tracing.aclose()  # exports the spans still queued

    routes = [
        Route("/v1/chat/completions", _CompletionsEndpoint(ApiKind.CHAT), methods=["POST"]),
        Route("/v1/completions", _CompletionsEndpoint(ApiKind.COMPLETIONS), methods=["POST"]),
        Route("/v1/models", _models, methods=["GET"]),
        Route("/health", _health, methods=["GET"]),
        Route("/ready", _ready, methods=["GET"]),
        Route("/metrics", _metrics, methods=["GET"]),
        Route("/admin/reset", _reset, methods=["POST"]),
        Route("/admin/reload", _reload, methods=["POST"]),
        Route("/admin/endpoints", _endpoints, methods=["GET"]),
        Route("/admin/queue", _queue, methods=["GET"]),
    ]
    body_timeout_s = config.limits.body_timeout_ms / 1000.0
    middleware = [
        Middleware(RefuseWhileDraining, drainer=drainer),
        Middleware(AuthMiddleware, settings=auth_settings),
        Middleware(BodyDeadlineMiddleware, body_timeout_s=body_timeout_s),
    ]

    def hot(api: ApiKind) -> ASGIApp:
        """The same middleware as every other route, outermost first, around one completions endpoint."""
        wrapped: ASGIApp = ErrorGuard(_CompletionsEndpoint(api))
        for cls, args, kwargs in reversed(middleware):
            wrapped = cls(wrapped, *args, **kwargs)
        return wrapped

    app = RouterApp(
        hot={"/v1/chat/completions": hot(ApiKind.CHAT), "/v1/completions": hot(ApiKind.COMPLETIONS)},
        routes=routes,
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_error, Exception: _unexpected_error},
    )
    app.state.drainer = drainer  # burstsched serve drains it on shutdown
    return app
