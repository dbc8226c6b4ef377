"""The event hub: follows every replica's KV-event stream and hands the batches to the consumer plugins.

The app's lifespan owns it: :meth:`KVEventHub.run` runs one :class:`EventStream` per endpoint with an events
address until cancelled, with one ZMQ context for all. In central mode (addresses with ``sources``) the
streams read from one :class:`~burstsched.kvcache.central.CentralSocket` the hub binds, which sorts the
messages by topic. The consumers (plugins implementing
:class:`~burstsched.framework.KVEventConsumer`, e.g. the precise prefix producer) are told when an endpoint's
stream starts (``on_kv_stream_live``), each batch in sequence order, each reset, and when it stops. An
observer (the router's metrics) counts events, lag, gaps, replays, resets and undecodable messages.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import anyio
import zmq
import zmq.asyncio
from anyio.streams.memory import MemoryObjectReceiveStream

from burstsched.framework import KVEventConsumer
from burstsched.kvcache.addresses import StreamAddress
from burstsched.kvcache.central import CentralSocket
from burstsched.kvcache.stream import EventStream
from burstsched.prefix.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEventMessage,
)

log = logging.getLogger(__name__)


class HubObserver(Protocol):
    """What the hub reports (the router's metrics implement it)."""

    def kv_events(self, endpoint: str, kind: str, count: int) -> None: ...

    def kv_event_lag(self, endpoint: str, seconds: float) -> None: ...

    def kv_event_gap(self, endpoint: str, missing: int) -> None: ...

    def kv_event_replay(self, endpoint: str, outcome: str) -> None: ...

    def kv_stream_reset(self, endpoint: str, reason: str) -> None: ...

    def kv_event_decode_error(self, endpoint: str) -> None: ...


def _kind(event: object) -> str:
    if isinstance(event, BlockStored):
        return "BlockStored"
    if isinstance(event, BlockRemoved):
        return "BlockRemoved"
    if isinstance(event, AllBlocksCleared):
        return "AllBlocksCleared"
    return "other"


class KVEventHub:
    """Every endpoint's stream, fanned out to the consumers; ``wall_clock`` (epoch seconds) gives the lag."""

    def __init__(
        self,
        addresses: Sequence[StreamAddress],
        consumers: Sequence[KVEventConsumer],
        *,
        topic: str = "",
        replay_timeout_s: float = 2.0,
        observer: HubObserver | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._addresses = list(addresses)
        self._consumers = list(consumers)
        self._topic = topic
        self._replay_timeout_s = replay_timeout_s
        self._observer = observer
        self._wall_clock = wall_clock
        self._streams: dict[str, EventStream] = {}
        self._scopes: dict[str, anyio.CancelScope] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._context: zmq.asyncio.Context | None = None
        self._central: CentralSocket | None = None

    def stream(self, endpoint: str) -> EventStream | None:
        return self._streams.get(endpoint)

    async def run(
        self, *, dynamic: bool = False, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Follow every stream until cancelled; tells the consumers when each starts and stops.

        With ``dynamic``, it keeps running with no stream, for :meth:`add_endpoint` (discovery)."""
        if not self._consumers or (not self._addresses and not dynamic):
            task_status.started()
            return
        context = zmq.asyncio.Context()
        self._context = context
        try:
            central = next((a.events for a in self._addresses if a.central), None)
            if central is not None:  # bound before anything starts: a socket that cannot bind fails the start
                self._central = CentralSocket(central, context, self, topic=self._topic)
            async with anyio.create_task_group() as tg:
                self._tg = tg
                if self._central is not None:
                    tg.start_soon(self._central.run)
                for address in self._addresses:
                    self.add_endpoint(address)
                task_status.started()
                if dynamic:
                    await anyio.sleep_forever()
        finally:
            self._tg = None
            self._context = None
            if self._central is not None:
                self._central.close()
                self._central = None
            for endpoint in self._streams:
                for consumer in self._consumers:
                    consumer.on_kv_stream_closed(endpoint)
            self._streams.clear()
            self._scopes.clear()
            context.term()

    def add_endpoint(self, address: StreamAddress) -> None:
        """Follow one more endpoint's stream (while :meth:`run` runs); one already followed is left as is."""
        if self._tg is None or self._context is None or address.endpoint in self._streams:
            return
        central = self._central_for(address) if address.central else None
        if address.central and central is None:
            return
        stream = EventStream(
            address.endpoint,
            address.events,
            self,
            self._context,
            replay_address=address.replay,
            topic=self._topic,
            replay_timeout_s=self._replay_timeout_s,
        )
        self._streams[address.endpoint] = stream
        scope = anyio.CancelScope()
        self._scopes[address.endpoint] = scope
        for consumer in self._consumers:
            consumer.on_kv_stream_live(address.endpoint)
        if central is not None:
            self._tg.start_soon(self._follow_central, stream, central.register(address), scope)
            log.info(
                "following KV events of %s on %s, topics naming %s",
                address.endpoint,
                address.events,
                " or ".join(address.sources),
            )
        else:
            self._tg.start_soon(self._follow, stream, scope)
            log.info("following KV events of %s at %s", address.endpoint, address.events)

    def _central_for(self, address: StreamAddress) -> CentralSocket | None:
        """The central socket, bound on first use; None (logged) when it cannot be."""
        assert self._tg is not None and self._context is not None
        central = self._central
        if central is None:
            try:
                central = CentralSocket(address.events, self._context, self, topic=self._topic)
            except zmq.ZMQError as exc:
                log.error(
                    "KV events: cannot bind %s (%s): %s is matched by the approximate index",
                    address.events,
                    exc,
                    address.endpoint,
                )
                return None
            self._central = central
            self._tg.start_soon(central.run)
        elif central.address != address.events:
            log.error(
                "KV events: %s asks for central socket %s but %s is bound; not followed",
                address.endpoint,
                address.events,
                central.address,
            )
            return None
        return central

    @staticmethod
    async def _follow_central(
        stream: EventStream, messages: MemoryObjectReceiveStream[KVEventMessage], scope: anyio.CancelScope
    ) -> None:
        with scope:
            await stream.follow(messages)

    def follow_in_process(self, endpoint: str) -> None:
        """Take ``endpoint``'s events from a caller on this loop (an in-process replica's engine hands each
        step's batch to :meth:`batch`) instead of a ZMQ stream: the consumers hear the stream is live."""
        for consumer in self._consumers:
            consumer.on_kv_stream_live(endpoint)

    @staticmethod
    async def _follow(stream: EventStream, scope: anyio.CancelScope) -> None:
        with scope:
            await stream.run()

    def remove_endpoint(self, endpoint: str) -> None:
        """Stop following ``endpoint`` (it left the pool); the consumers are told its stream closed."""
        scope = self._scopes.pop(endpoint, None)
        if self._streams.pop(endpoint, None) is None:
            return
        if scope is not None:
            scope.cancel()
        if self._central is not None:
            self._central.unregister(endpoint)
        for consumer in self._consumers:
            consumer.on_kv_stream_closed(endpoint)
        log.info("stopped following KV events of %s", endpoint)

    def endpoint_down(self, endpoint: str) -> None:
        """``endpoint`` failed its checks: whatever comes next from it starts a new sequence."""
        stream = self._streams.get(endpoint)
        if stream is not None:
            stream.forget()

    # --- StreamSink -----------------------------------------------------------------------------------

    def batch(self, endpoint: str, seq: int, batch: EventBatch) -> None:
        observer = self._observer
        if observer is not None:
            counts: dict[str, int] = {}
            for event in batch.events:
                kind = _kind(event)
                counts[kind] = counts.get(kind, 0) + 1
            for kind, count in counts.items():
                observer.kv_events(endpoint, kind, count)
            observer.kv_event_lag(endpoint, max(0.0, self._wall_clock() - batch.ts))
        for consumer in self._consumers:
            consumer.on_kv_events(endpoint, batch)

    def reset(self, endpoint: str, reason: str) -> None:
        log.warning("KV events of %s: dropping its prefix entries (%s)", endpoint, reason)
        if self._observer is not None:
            self._observer.kv_stream_reset(endpoint, reason)
        for consumer in self._consumers:
            consumer.on_kv_stream_reset(endpoint, reason)

    def gap(self, endpoint: str, missing: int) -> None:
        log.info("KV events of %s: %d batches missing, replaying", endpoint, missing)
        if self._observer is not None:
            self._observer.kv_event_gap(endpoint, missing)

    def replay(self, endpoint: str, outcome: str) -> None:
        if self._observer is not None:
            self._observer.kv_event_replay(endpoint, outcome)

    def decode_error(self, endpoint: str, error: str) -> None:
        log.warning("KV events of %s: undecodable message: %s", endpoint, error)
        if self._observer is not None:
            self._observer.kv_event_decode_error(endpoint)
