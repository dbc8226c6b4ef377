"""``burstsched serve``: run the router; also in-process helpers that serve it on a free 127.0.0.1 port.

In tests and the demo::

    async with running_router(config) as router:      # same event loop, real socket
        httpx.post(f"{router.url}/v1/completions", ...)
        router.app.state.router.scheduler              # the live Scheduler, pool, metrics

    with router_thread(config) as router:              # its own loop on a background thread
        ...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import math
import os
import random
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

import anyio
import uvicorn
from starlette.applications import Starlette

from burstsched.config import (
    ConfigError,
    LimitsConfig,
    RouterConfig,
)
from burstsched.dispatch import Upstream
from burstsched.dispatch.drain import Drainer
from burstsched.framework import PluginRegistry
from burstsched.front.app import Clock, create_app
from burstsched.front.live_config import ConfigSource
from burstsched.server.header_guard import guarded_protocol
from burstsched.server.pool_arguments import (
    add_pool_arguments,
    lacks_endpoints,
    pool_argv,
    pool_config_source,
)
from burstsched.server.reload import ReloadTriggers
from burstsched.server.workers import (
    SOCKET_MODES,
    WORKER_HEADER,
    Supervisor,
    WorkerLink,
    adopt_sockets,
    close_all,
    worker_sockets,
)
from burstsched.telemetry.metrics import RouterMetrics


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_pool_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    parser.add_argument("--log-level", default="warning", help="log level (default: %(default)s)")
    parser.add_argument(
        "--reload-poll",
        type=float,
        default=None,
        metavar="S",
        help="reload the config when the file's content changes, looking every S seconds (default: off; "
        "SIGHUP and POST /admin/reload always reload)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="router processes serving the one port, each with its own pool, scheduler and index (default: "
        "%(default)s); a parent supervises them (see burstsched.server.workers)",
    )
    parser.add_argument(
        "--worker-sockets",
        choices=SOCKET_MODES,
        default="reuseport",
        help="with --workers: a SO_REUSEPORT socket per worker (the kernel spreads connections evenly) or "
        "one shared socket (default: %(default)s)",
    )
    # set by the parent of --workers for each worker it starts
    parser.add_argument("--worker-id", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--listen-fds", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-link", type=int, default=None, help=argparse.SUPPRESS)


def _worker_command(args: argparse.Namespace) -> Callable[[int, Sequence[int], int], list[str]]:
    """How the parent of ``--workers`` starts worker ``i``: this command again, with the sockets it inherits.

    Every argument of :func:`add_arguments` that a worker needs is passed on here."""
    base = [sys.executable, "-m", "burstsched", "serve", *pool_argv(args), "--host", args.host]
    base += ["--port", str(args.port), "--log-level", args.log_level]
    if args.reload_poll is not None:
        base += ["--reload-poll", str(args.reload_poll)]

    def command(index: int, fds: Sequence[int], link: int) -> list[str]:
        listen = ",".join(str(fd) for fd in fds)
        return [*base, "--worker-id", str(index), "--listen-fds", listen, "--worker-link", str(link)]

    return command


def _supervise(args: argparse.Namespace, config: RouterConfig) -> int:
    """``--workers N``: bind the sockets once, run N workers, stop them on SIGTERM/SIGINT."""
    try:
        sockets = worker_sockets(
            args.host, args.port, config.auth.admin_port, args.workers, args.worker_sockets
        )
    except OSError as exc:
        print(f"burstsched serve: cannot listen: {exc}", file=sys.stderr)
        return 2
    drain_s = config.shutdown.drain_timeout_ms / 1000.0
    supervisor = Supervisor(_worker_command(args), sockets, stop_timeout_s=drain_s + 15.0)
    try:
        return supervisor.run()
    finally:
        close_all(sockets)


def _as_worker(args: argparse.Namespace, app: Starlette, server: DrainingServer) -> list[socket.socket]:
    """A worker of ``--workers``: its inherited sockets; it tells the parent once serving, and stops (as on
    SIGTERM) if the parent goes."""
    link = WorkerLink(args.worker_link) if args.worker_link is not None else None

    def started() -> None:
        metrics = getattr(getattr(app.state, "router", None), "metrics", None)
        if isinstance(metrics, RouterMetrics):
            metrics.watch_worker(str(args.worker_id), os.getpid())
        if link is not None:
            link.ready()

    def parent_gone() -> None:
        server.should_exit = True

    server.on_started = started
    if link is not None:
        link.watch_parent(parent_gone)
    return adopt_sockets([int(fd) for fd in str(args.listen_fds or "").split(",") if fd])


def run(args: argparse.Namespace) -> int:
    source = pool_config_source(args)
    try:
        config = source()
        if args.reload_poll is not None and not args.reload_poll > 0:
            print("burstsched serve: --reload-poll must be positive", file=sys.stderr)
            return 2
        if lacks_endpoints(config):
            print(
                "burstsched serve: no endpoints (give --endpoint or list them in the config)", file=sys.stderr
            )
            return 2
        if args.workers < 1:
            print("burstsched serve: --workers must be at least 1", file=sys.stderr)
            return 2
        app = create_app(config, config_source=source)
    except ConfigError as exc:
        print(f"burstsched serve: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.workers > 1 and args.worker_id is None:
        return _supervise(args, config)  # the parent forwards SIGHUP to its workers
    triggers = ReloadTriggers(app, args.config, args.reload_poll)
    triggers.hold()
    headers = [(WORKER_HEADER, str(args.worker_id))] if args.worker_id is not None else []
    uv_config = _uvicorn_config(
        app, host=args.host, port=args.port, log_level=args.log_level, limits=config.limits, headers=headers
    )
    server = DrainingServer(uv_config, _drainer(app), freeze_gc=True)
    sockets: list[socket.socket] | None = None
    if args.worker_id is not None:
        sockets = _as_worker(args, app, server)
    elif config.auth.admin_port is not None:  # one server, two listening sockets: the API's and the admin's
        try:
            sockets = [_listen(args.host, args.port), _listen(args.host, config.auth.admin_port)]
        except OSError as exc:
            print(f"burstsched serve: cannot listen: {exc}", file=sys.stderr)
            return 2
    _reload_on_signal(server, triggers)
    try:
        server.run(sockets=sockets)
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it shut down on
        pass
    finally:
        for sock in sockets or []:
            sock.close()
    return 0


def _reload_on_signal(server: DrainingServer, triggers: ReloadTriggers) -> None:
    """Once serving: SIGHUP (and the file watch) reload the config."""
    then = server.on_started

    def started() -> None:
        triggers.start()
        if then is not None:
            then()

    server.on_started = started


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _uvicorn_config(
    app: Starlette,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    log_level: str = "warning",
    limits: LimitsConfig | None = None,
    headers: Sequence[tuple[str, str]] = (),
) -> uvicorn.Config:
    limits = limits if limits is not None else LimitsConfig()
    drainer = _drainer(app)
    drain_s = drainer.timeout_s if drainer is not None else 0.0
    protocol = guarded_protocol(
        header_timeout_s=limits.header_timeout_ms / 1000.0,
        max_header_bytes=limits.max_header_bytes,
        keep_alive_s=limits.keep_alive_timeout_ms / 1000.0,
    )
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol,
        lifespan="on",
        log_level=log_level,
        access_log=False,
        server_header=False,
        date_header=False,
        headers=list(headers),
        timeout_keep_alive=max(1, math.ceil(limits.keep_alive_timeout_ms / 1000.0)),
        timeout_graceful_shutdown=math.ceil(drain_s) + 10,  # the drainer ends requests before this
    )


def _drainer(app: Starlette) -> Drainer | None:
    drainer = getattr(app.state, "drainer", None)
    return drainer if isinstance(drainer, Drainer) else None


class DrainingServer(uvicorn.Server):
    """uvicorn, with the app's :class:`Drainer` run as shutdown begins (uvicorn stops accepting then).

    ``freeze_gc``: once started, move every object alive then (modules, plugins, compiled kernels, the
    config) out of the cyclic garbage collector's reach (``gc.freeze``). The process holds a few hundred
    thousand such objects (numba, pydantic, OpenTelemetry); without this, each full collection walks them
    all, and the collections that requests' garbage sets off cost ~15% of the router's CPU per request.
    """

    def __init__(
        self, config: uvicorn.Config, drainer: Drainer | None = None, *, freeze_gc: bool = False
    ) -> None:
        super().__init__(config)
        self.drainer = drainer
        self.freeze_gc = freeze_gc
        self.on_started: Callable[[], None] | None = None
        """Called once the server is listening (a worker of ``--workers`` tells its parent)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.freeze_gc and self.started:
            gc.collect()
            gc.freeze()
        if self.started and self.on_started is not None:
            self.on_started()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        drainer = self.drainer
        drain = asyncio.ensure_future(drainer.drain()) if drainer is not None else None
        try:
            await super().shutdown(sockets)
        finally:
            if drain is not None:
                drain.cancel()


class _QuietServer(DrainingServer):
    """A uvicorn server that leaves the process's signal handlers alone (it is stopped by ``should_exit``)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


@dataclass(frozen=True)
class RunningRouter:
    """A router serving on ``url``; ``app.state.router`` holds its live parts once started."""

    url: str
    app: Starlette


def _bound_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@asynccontextmanager
async def serving(
    app: Starlette, *, start_timeout: float = 30.0, limits: LimitsConfig | None = None
) -> AsyncIterator[str]:
    """Serve any ASGI app with uvicorn on a free 127.0.0.1 port in the current event loop; yield its URL."""
    sock = _bound_socket()
    server = _QuietServer(_uvicorn_config(app, limits=limits), _drainer(app))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            with anyio.fail_after(start_timeout):
                while not server.started:
                    if server.should_exit:
                        raise RuntimeError("the server failed to start")
                    await anyio.sleep(0.01)
            try:
                yield f"http://127.0.0.1:{sock.getsockname()[1]}"
            finally:
                server.should_exit = True
    finally:
        sock.close()


@asynccontextmanager
async def running_router(
    config: RouterConfig,
    *,
    registry: PluginRegistry | None = None,
    upstream: Upstream | None = None,
    clock: Clock = time.monotonic,
    rng: random.Random | None = None,
    start_timeout: float = 30.0,
    config_source: ConfigSource | None = None,
) -> AsyncIterator[RunningRouter]:
    """Serve the router with uvicorn on a free 127.0.0.1 port in the current event loop (``config_source``:
    what ``POST /admin/reload`` reads)."""
    app = create_app(
        config, registry=registry, upstream=upstream, clock=clock, rng=rng, config_source=config_source
    )
    async with serving(app, start_timeout=start_timeout, limits=config.limits) as url:
        yield RunningRouter(url, app)


@contextmanager
def router_thread(
    config: RouterConfig,
    *,
    registry: PluginRegistry | None = None,
    clock: Clock = time.monotonic,
    rng: random.Random | None = None,
    start_timeout: float = 30.0,
) -> Iterator[RunningRouter]:
    """Serve the router with uvicorn on a free 127.0.0.1 port, on its own event loop in a thread."""
    app = create_app(config, registry=registry, clock=clock, rng=rng)
    sock = _bound_socket()
    server = _QuietServer(_uvicorn_config(app, limits=config.limits), _drainer(app))
    thread = threading.Thread(target=server.run, args=([sock],), name="burstsched-router", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + start_timeout
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the router failed to start")
            time.sleep(0.01)
        yield RunningRouter(f"http://127.0.0.1:{sock.getsockname()[1]}", app)
    finally:
        server.should_exit = True
        thread.join(timeout=start_timeout)
        sock.close()
