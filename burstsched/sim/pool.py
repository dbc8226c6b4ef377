"""N simulated replicas in this process, for tests, demos and load tests.

The replicas' servers (uvicorn, real sockets on 127.0.0.1, free ports) run on one background thread
with its own event loop, so the pool works from sync and async callers alike and never shares the
caller's loop::

    with SimPool(2, SimConfig(time_scale=0.05)) as pool:
        pool.urls                      # ["http://127.0.0.1:PORT", ...]
        pool.set_faults(0, Faults(error_rate=1.0, error_status=503))
        pool.reset_prefix_cache()
        pool.kill(1)                   # abrupt, like SIGKILL
        pool.requests(0)               # with record_requests=True (tests): the inference requests received

    async with SimPool(configs=[cfg_a, cfg_b]) as pool: ...   # start/stop off the caller's loop

Start and stop are bounded in time (:class:`SimStartError`, :class:`SimStopError`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from types import TracebackType
from typing import TypeVar

import anyio.to_thread

from burstsched.sim.config import SimConfig
from burstsched.sim.faults import Faults
from burstsched.sim.recording import RecordedRequest
from burstsched.sim.replica import SimReplica, SimStartError

T = TypeVar("T")


class SimStopError(RuntimeError):
    """The pool's thread did not finish in time."""


class SimPool:
    """Simulated replicas named ``sim-0``, ``sim-1``… (or by their configs' names)."""

    def __init__(
        self,
        n: int | None = None,
        config: SimConfig | None = None,
        *,
        configs: Sequence[SimConfig] | None = None,
        start_timeout_s: float = 20.0,
        stop_timeout_s: float = 20.0,
        call_timeout_s: float = 10.0,
        record_requests: bool = False,
    ) -> None:
        if configs is not None:
            if config is not None or (n is not None and n != len(configs)):
                raise ValueError("give either n and config, or configs")
            self._configs = list(configs)
        else:
            if n is None or n < 1:
                raise ValueError("a pool needs n >= 1 replicas")
            self._configs = [config or SimConfig()] * n
        if not self._configs:
            raise ValueError("a pool needs at least one replica")
        self._names = [c.name or f"sim-{i}" for i, c in enumerate(self._configs)]
        if len(set(self._names)) != len(self._names):
            raise ValueError(f"replica names must be unique: {self._names}")
        self._start_timeout = start_timeout_s
        self._stop_timeout = stop_timeout_s
        self._call_timeout = call_timeout_s
        self._record_requests = record_requests
        self._replicas: list[SimReplica] = []
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._ready = threading.Event()
        self._stop_requested = threading.Event()
        self._error: BaseException | None = None
        self._started = False

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> SimPool:
        """Start every replica; returns when all answer, or raises :class:`SimStartError`."""
        if self._thread is not None:
            raise RuntimeError("pool already started")
        self._thread = threading.Thread(target=self._thread_main, name="burstsched-sim-pool", daemon=True)
        self._thread.start()
        if not self._ready.wait(self._start_timeout):
            self._request_stop()
            self._thread.join(self._stop_timeout)
            raise SimStartError(f"pool did not start within {self._start_timeout} s")
        if self._error is not None:
            self._thread.join(self._stop_timeout)
            raise SimStartError(f"pool failed to start: {self._error}") from self._error
        self._started = True
        return self

    def stop(self) -> None:
        """Stop every replica and the pool's thread (idempotent)."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        self._request_stop()
        thread.join(self._stop_timeout)
        if thread.is_alive():
            raise SimStopError(f"pool did not stop within {self._stop_timeout} s")

    def __enter__(self) -> SimPool:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> SimPool:
        await anyio.to_thread.run_sync(self.start)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await anyio.to_thread.run_sync(self.stop)

    # -- what callers see -----------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return list(self._names)

    @property
    def urls(self) -> list[str]:
        self._check_started()
        return [r.url for r in self._replicas]

    @property
    def configs(self) -> list[SimConfig]:
        return list(self._configs)

    @property
    def kv_events_endpoints(self) -> list[str | None]:
        """Each replica's bound KV-event PUB endpoint (None where events are off)."""
        self._check_started()
        return [r.kv_events_endpoint for r in self._replicas]

    @property
    def kv_events_replay_endpoints(self) -> list[str | None]:
        self._check_started()
        return [r.kv_events_replay_endpoint for r in self._replicas]

    def requests(self, index: int) -> list[RecordedRequest]:
        """The inference requests replica ``index`` received so far, in order (a copy; still readable once
        the pool stopped). Only with ``record_requests=True``: otherwise a RuntimeError, so a test never
        reads "nothing received" from a pool that was not recording."""
        self._check_started()
        recorded = self._replicas[index].requests
        if recorded is None:
            raise RuntimeError("this pool does not record requests: SimPool(..., record_requests=True)")
        return list(recorded)

    def replica(self, index: int) -> SimReplica:
        """The replica object itself (its engine and metrics live on the pool's thread: read only)."""
        self._check_started()
        return self._replicas[index]

    # -- control (sync) -------------------------------------------------------------------------------
    def set_faults(self, index: int, faults: Faults) -> None:
        self._call(partial(self._set_faults, index, faults))

    def reset_prefix_cache(self, *, reset_running_requests: bool = False) -> list[bool]:
        """Clear every live replica's prefix cache; per replica, whether it was cleared."""
        return self._call(partial(self._reset_all, reset_running_requests))

    def kill(self, index: int) -> None:
        """Stop replica ``index`` abruptly: refused connections, open ones reset."""
        self._call(self._replicas[index].kill)

    # -- control (async) ------------------------------------------------------------------------------
    async def aset_faults(self, index: int, faults: Faults) -> None:
        await anyio.to_thread.run_sync(partial(self.set_faults, index, faults))

    async def areset_prefix_cache(self, *, reset_running_requests: bool = False) -> list[bool]:
        return await anyio.to_thread.run_sync(
            partial(self.reset_prefix_cache, reset_running_requests=reset_running_requests)
        )

    async def akill(self, index: int) -> None:
        await anyio.to_thread.run_sync(partial(self.kill, index))

    # -- internals -------------------------------------------------------------------------------------
    def _check_started(self) -> None:
        if not self._started:
            raise RuntimeError("pool is not started")

    def _call(self, fn: Callable[[], Awaitable[T]]) -> T:
        self._check_started()
        loop = self._loop
        if loop is None or self._thread is None or not self._thread.is_alive():
            raise RuntimeError("pool is stopped")

        async def run() -> T:
            return await fn()

        return asyncio.run_coroutine_threadsafe(run(), loop).result(self._call_timeout)

    async def _set_faults(self, index: int, faults: Faults) -> None:
        self._replicas[index].set_faults(faults)

    async def _reset_all(self, reset_running_requests: bool) -> list[bool]:
        results = await asyncio.gather(
            *(r.reset_prefix_cache(reset_running_requests=reset_running_requests) for r in self._replicas)
        )
        return list(results)

    def _request_stop(self) -> None:
        self._stop_requested.set()
        loop, event = self._loop, self._stop_event
        if loop is not None and event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to the starting thread
            if self._error is None:
                self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        replicas = [
            SimReplica(dataclasses.replace(c, name=name), name=name, record_requests=self._record_requests)
            for c, name in zip(self._configs, self._names, strict=True)
        ]
        results = await asyncio.gather(*(r.start() for r in replicas), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            self._error = failures[0]
            await asyncio.gather(*(r.kill() for r in replicas), return_exceptions=True)
            self._ready.set()
            return
        self._replicas = replicas
        self._ready.set()
        if not self._stop_requested.is_set():
            await self._stop_event.wait()
        await asyncio.gather(*(r.stop(grace_s=2.0) for r in replicas), return_exceptions=True)
