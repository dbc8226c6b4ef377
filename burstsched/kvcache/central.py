"""Central mode: one SUB socket the router binds, which every replica's publisher connects to.

llm-d calls it ``zmqEndpoint``: vLLM's publisher connects instead of binding when its ``endpoint`` is not a
wildcard (``tcp://router:5557``), so all replicas' messages arrive on one socket, and only the topic says
whose each is. Each replica sets it to ``kv@<host>:<port>@<model>`` (llm-d's precise producer reads the
middle as the pod's address and serving port); the socket hands each message to the endpoint the topic
names, through a bounded queue that the endpoint's own :class:`~burstsched.kvcache.stream.EventStream`
reads, so every replica keeps its own sequence, gap replay and restart detection, and a slow replay of one
never holds up the others. A message for a full queue is dropped: its stream sees the gap and replays it.
A topic naming no endpoint (a replica not in the pool yet, or a topic set wrong) is dropped and logged once.
"""

from __future__ import annotations

import logging

import anyio
import zmq
import zmq.asyncio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from burstsched.kvcache.addresses import StreamAddress, topic_source
from burstsched.kvcache.stream import StreamSink
from burstsched.prefix.kv_events import KVEventDecodeError, KVEventMessage, decode_message

log = logging.getLogger(__name__)

_UNKNOWN_REMEMBERED = 1024


class CentralSocket:
    """The bound SUB socket and the routes from topic sources to endpoints; :meth:`run` until cancelled."""

    def __init__(
        self,
        address: str,
        context: zmq.asyncio.Context,
        sink: StreamSink,
        *,
        topic: str = "",
        queue_size: int = 4096,
    ) -> None:
        self.address = address
        self._sink = sink
        self._queue_size = queue_size
        self._routes: dict[str, tuple[str, MemoryObjectSendStream[KVEventMessage]]] = {}
        self._unknown: set[str] = set()
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, topic.encode("utf-8"))
        try:
            sub.bind(address)
        except zmq.ZMQError:
            sub.close(linger=0)
            raise
        self._sub = sub
        log.info("KV events: bound %s for the replicas' publishers (central mode)", address)

    def register(self, address: StreamAddress) -> MemoryObjectReceiveStream[KVEventMessage]:
        """Route the messages whose topic names one of ``address.sources`` to ``address.endpoint``."""
        send, receive = anyio.create_memory_object_stream[KVEventMessage](self._queue_size)
        for source in address.sources:
            self._routes[source] = (address.endpoint, send)
            self._unknown.discard(source)
        return receive

    def unregister(self, endpoint: str) -> None:
        for source, (name, send) in list(self._routes.items()):
            if name == endpoint:
                del self._routes[source]
                send.close()

    def endpoint_of(self, topic: str) -> str | None:
        route = self._routes.get(topic_source(topic))
        return route[0] if route is not None else None

    async def run(self) -> None:
        try:
            while True:
                self.route(await self._sub.recv_multipart())
        finally:
            self.close()

    def close(self) -> None:
        """Close the socket and every endpoint's queue (idempotent)."""
        for _, send in self._routes.values():
            send.close()
        self._sub.close(linger=0)

    def route(self, frames: list[bytes]) -> None:
        """Hand one received message to its endpoint's queue."""
        topic = frames[0].decode("utf-8", "replace") if frames else ""
        source = topic_source(topic)
        route = self._routes.get(source)
        if route is None:
            if source not in self._unknown and len(self._unknown) < _UNKNOWN_REMEMBERED:
                self._unknown.add(source)
                log.warning(
                    "KV events on %s: topic %r names no endpoint (expected kv@<host>:<port>@<model> or "
                    "kv@<name>@<model>); its messages are dropped",
                    self.address,
                    topic,
                )
            return
        endpoint, send = route
        try:
            message = decode_message(frames)
        except KVEventDecodeError as exc:
            self._sink.decode_error(endpoint, str(exc))
            return
        try:
            send.send_nowait(message)
        except anyio.WouldBlock:
            log.debug("KV events of %s: queue full, a batch dropped (its gap is replayed)", endpoint)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the endpoint is leaving
