"""One simulated replica: engine, tokenizer, metrics, KV-event publisher and a uvicorn server.

All of it lives on one event loop. :meth:`SimReplica.start` binds a real socket on the configured
host and port (0: a free port) and serves; :meth:`SimReplica.stop` shuts down gracefully (bounded);
:meth:`SimReplica.kill` drops it abruptly, like SIGKILL: the listening socket closes (new
connections are refused) and every open connection is reset, streams included. With
``record_requests=True`` (tests only) :attr:`SimReplica.requests` keeps the inference requests received.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time

import uvicorn

from burstsched.sim.assembly import ReplicaParts
from burstsched.sim.clock import Clock, RealClock
from burstsched.sim.config import SimConfig
from burstsched.sim.engine import Engine
from burstsched.sim.faults import Faults
from burstsched.sim.kv_events import KVEventPublisher
from burstsched.sim.recording import RecordedRequest
from burstsched.sim.server import Client, build_app

log = logging.getLogger(__name__)


class SimStartError(RuntimeError):
    """A replica (or pool) did not come up in time, or could not bind."""


class SimReplica:
    """A simulated vLLM replica on the running event loop."""

    def __init__(
        self,
        config: SimConfig,
        *,
        name: str | None = None,
        clock: Clock | None = None,
        record_requests: bool = False,
    ) -> None:
        self.config = config
        self.name = name or config.name or "sim"
        self.clock = clock or RealClock()
        self.parts = ReplicaParts.build(config, record_requests=record_requests)
        self.tokenizer = self.parts.tokenizer
        self.template = self.parts.template
        self.metrics = self.parts.metrics
        self.faults = self.parts.faults
        self.publisher: KVEventPublisher | None = None
        self.engine: Engine | None = None
        self.port: int | None = None
        self.killed = False
        self.requests: list[RecordedRequest] | None = self.parts.recorded
        """The inference requests received, in order, when recording (tests only); else None."""
        self._server: uvicorn.Server | None = None
        self._serve_task: asyncio.Task[None] | None = None
        self._engine_task: asyncio.Task[None] | None = None
        self._stopped = False

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("replica is not started")
        return f"http://{self.config.host}:{self.port}"

    @property
    def kv_events_endpoint(self) -> str | None:
        return self.publisher.endpoint if self.publisher else None

    @property
    def kv_events_replay_endpoint(self) -> str | None:
        return self.publisher.replay_endpoint if self.publisher else None

    async def start(self, start_within_s: float = 10.0) -> None:
        """Bind, start the engine and the server; raises :class:`SimStartError` on failure or timeout."""
        cfg = self.config
        # proto IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted connections only then (else Nagle
        # holds small SSE chunks back until the client's delayed ACK, ~40 ms).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((cfg.host, cfg.port))
        except OSError as exc:
            sock.close()
            raise SimStartError(f"{self.name}: cannot bind {cfg.host}:{cfg.port}: {exc}") from exc
        self.port = sock.getsockname()[1]
        try:
            if cfg.kv_events_endpoint is not None:
                self.publisher = KVEventPublisher(
                    cfg.kv_events_endpoint,
                    topic=kv_events_topic(cfg, self.port),
                    replay_endpoint=cfg.kv_events_replay_endpoint,
                    encoding=cfg.kv_events_encoding,
                )
                self.publisher.start()
        except Exception as exc:
            sock.close()
            raise SimStartError(f"{self.name}: cannot open KV events endpoint: {exc}") from exc
        state = self.parts.assemble(
            self.name,
            self.clock,
            event_sink=self.publisher.publish if self.publisher else None,
            drop_connection=self._drop_connection,
        )
        self.engine = state.engine
        self._engine_task = asyncio.create_task(self.engine.run(), name=f"{self.name}-engine")
        server_config = uvicorn.Config(
            build_app(state),
            lifespan="off",
            log_config=None,
            log_level="warning",
            access_log=False,
            ws="none",
            timeout_graceful_shutdown=2,
            timeout_keep_alive=30,
        )
        self._server = uvicorn.Server(server_config)
        self._serve_task = asyncio.create_task(self._server.serve(sockets=[sock]), name=f"{self.name}-http")
        deadline = time.monotonic() + start_within_s
        while not self._server.started:
            if self._serve_task.done():
                failure = self._serve_task.exception()
                await self._cleanup()
                raise SimStartError(f"{self.name}: server failed to start: {failure!r}")
            if time.monotonic() > deadline:
                await self.kill()
                raise SimStartError(f"{self.name}: server did not start within {start_within_s} s")
            await asyncio.sleep(0.005)

    def set_faults(self, faults: Faults) -> None:
        self.faults.set(faults)

    def _drop_connection(self, client: Client | None) -> None:
        """Close the connection from ``client`` at once, unsent data dropped (as :meth:`kill` does to all)."""
        server = self._server
        if server is None or client is None:
            return
        peer = tuple(client)
        for connection in list(server.server_state.connections):
            if getattr(connection, "client", None) == peer:
                transport = getattr(connection, "transport", None)
                if transport is not None:
                    transport.abort()

    async def reset_prefix_cache(self, *, reset_running_requests: bool = False) -> bool:
        if self.engine is None or self.killed:
            return False
        return await self.engine.reset_prefix_cache(reset_running_requests=reset_running_requests)

    async def wait_closed(self) -> None:
        """Wait until the server stops by itself (e.g. on a signal)."""
        if self._serve_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._serve_task)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Graceful stop: no new connections, in-flight responses get up to 2 s, then everything closes."""
        if self._stopped:
            return
        if self._server is not None and self._serve_task is not None and not self._serve_task.done():
            await _close_listeners(self._server)
            self._server.should_exit = True
            try:
                await asyncio.wait_for(asyncio.shield(self._serve_task), grace_s)
            except TimeoutError:
                log.warning("%s: graceful stop timed out, killing", self.name)
        await self.kill()

    async def kill(self) -> None:
        """Abrupt stop: refuse new connections, reset open ones, end the engine."""
        if self._stopped:
            return
        self._stopped = True
        self.killed = True
        server = self._server
        if server is not None:
            await _close_listeners(server)
            for connection in list(server.server_state.connections):
                transport = getattr(connection, "transport", None)
                if transport is not None:
                    transport.abort()
            server.should_exit = True
            server.force_exit = True
        await self._cleanup()

    async def _cleanup(self) -> None:
        self._stopped = True
        self.faults.close()
        if self.engine is not None:
            self.engine.close()
        for task in (self._serve_task, self._engine_task):
            if task is not None and not task.done():
                if task is self._engine_task:
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(task, 5.0)
        if self.publisher is not None:
            await self.publisher.close()


async def _close_listeners(server: uvicorn.Server) -> None:
    """Stop accepting, let every connection already accepted reach uvicorn, then close the listeners.

    asyncio accepts a connection in one loop step, builds its transport in a task run the step after, and
    calls ``connection_made`` (uvicorn then tracks the connection) the step after that. A
    ``Server.close()`` in between makes the transport's constructor fail (``Server._attach`` asserts the
    server still has sockets); asyncio drops that error and the accepted socket is never closed (a
    ResourceWarning when it is collected). So the listening sockets first leave the selector (no new
    accepts; the kernel backlog is reset when they close), two loop steps pass (the ready queue is FIFO:
    transports built, then ``connection_made`` run), and only then do the servers close.
    """
    loop = asyncio.get_running_loop()
    listeners = list(getattr(server, "servers", []))
    for listener in listeners:
        for sock in listener.sockets:
            loop.remove_reader(sock.fileno())
    for _ in range(2):
        await asyncio.sleep(0)
    for listener in listeners:
        listener.close()


def kv_events_topic(config: SimConfig, port: int) -> str:
    """The topic with ``{host}``, ``{port}`` and ``{model}`` filled in, as a pod spec fills in its own
    address for llm-d's central mode (``kv@{host}:{port}@{model}``); vLLM takes the topic as given."""
    return (
        config.kv_events_topic.replace("{host}", config.host)
        .replace("{port}", str(port))
        .replace("{model}", config.served_model_name)
    )
