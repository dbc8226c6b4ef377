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
import contextlib
import logging
import random
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Generator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import uvicorn
from starlette.applications import Starlette

from burstsched.app import Clock, create_app
from burstsched.config import ConfigError, RouterConfig, load_config, parse_endpoint_arg
from burstsched.framework import PluginRegistry

DEFAULT_CONFIG = Path("config") / "default.yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", type=Path, default=DEFAULT_CONFIG, help="YAML config (default: %(default)s)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    parser.add_argument(
        "--endpoint",
        action="append",
        default=[],
        metavar="[NAME=]URL",
        help="a replica's base URL, optionally named; repeat for each; replaces the config's endpoints",
    )
    parser.add_argument("--log-level", default="warning", help="log level (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    try:
        endpoints = [parse_endpoint_arg(text) for text in args.endpoint]
        config = load_config(args.config, endpoints=endpoints)
        if not config.endpoints:
            print(
                "burstsched serve: no endpoints (give --endpoint or list them in the config)", file=sys.stderr
            )
            return 2
        app = create_app(config)
    except ConfigError as exc:
        print(f"burstsched serve: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    server = uvicorn.Server(_uvicorn_config(app, host=args.host, port=args.port, log_level=args.log_level))
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it shut down on
        pass
    return 0


def _uvicorn_config(
    app: Starlette, *, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="on",
        log_level=log_level,
        access_log=False,
        server_header=False,
        date_header=False,
        timeout_graceful_shutdown=10,
    )


class _QuietServer(uvicorn.Server):
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
async def serving(app: Starlette, *, start_timeout: float = 30.0) -> AsyncIterator[str]:
    """Serve any ASGI app with uvicorn on a free 127.0.0.1 port in the current event loop; yield its URL."""
    sock = _bound_socket()
    server = _QuietServer(_uvicorn_config(app))
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
    transport: httpx.AsyncBaseTransport | None = None,
    clock: Clock = time.monotonic,
    rng: random.Random | None = None,
    start_timeout: float = 30.0,
) -> AsyncIterator[RunningRouter]:
    """Serve the router with uvicorn on a free 127.0.0.1 port in the current event loop."""
    app = create_app(config, registry=registry, transport=transport, clock=clock, rng=rng)
    async with serving(app, start_timeout=start_timeout) as url:
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
    server = _QuietServer(_uvicorn_config(app))
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
