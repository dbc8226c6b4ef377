"""Publishing a replica's KV-cache events over ZMQ, as vLLM's ``ZmqEventPublisher`` does.

A PUB socket sends ``[topic, seq (8 bytes big-endian, from 0), msgpack batch]`` once per engine step
that produced events. An optional ROUTER socket serves replays from a buffer of the last
``buffer_steps`` batches: request ``[b"", start_seq]``, reply one ``[b"", topic, seq, payload]`` per
buffered batch with ``seq >= start_seq``, then ``[b"", b"", -1, b""]`` (vLLM 0.32's frames, measured: the
topic frame is there, as in the PUB messages). An endpoint with ``*`` (or ``ipc://``) is
bound, any other connected, like vLLM; ``tcp://HOST:*`` or ``tcp://HOST:0`` binds a free port.
The wire format lives in :mod:`burstsched.prefix.kv_events`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque

import zmq
import zmq.asyncio

from burstsched.prefix.kv_events import (
    REPLAY_END_SEQ,
    Encoding,
    EventBatch,
    KVEvent,
    encode_batch,
    encode_seq,
)

log = logging.getLogger(__name__)


def _normalise(endpoint: str) -> str:
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        return endpoint[:-2] + ":*"
    return endpoint


def _open(sock: zmq.Socket[bytes] | zmq.asyncio.Socket, endpoint: str) -> str:
    endpoint = _normalise(endpoint)
    if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
        sock.bind(endpoint)
        bound = sock.getsockopt(zmq.LAST_ENDPOINT)
        return bound.decode() if isinstance(bound, bytes) else str(bound)
    sock.connect(endpoint)
    return endpoint


class KVEventPublisher:
    """PUB (and optional replay ROUTER) sockets of one replica; call :meth:`close` when done."""

    def __init__(
        self,
        endpoint: str,
        *,
        topic: str = "",
        replay_endpoint: str | None = None,
        encoding: Encoding = "map",
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        data_parallel_rank: int = 0,
    ) -> None:
        self._topic = topic.encode("utf-8")
        self._encoding: Encoding = encoding
        self._rank = data_parallel_rank
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._actx = zmq.asyncio.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        try:
            self.endpoint = _open(self._pub, endpoint)
            self.replay_endpoint: str | None = None
            if replay_endpoint is not None:
                self._replay = self._actx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self.replay_endpoint = _open(self._replay, replay_endpoint)
        except zmq.ZMQError:
            self._close_sockets()
            raise

    def start(self) -> None:
        """Serve replay requests (call from the event loop that will run it)."""
        if self._replay is not None and self._replay_task is None:
            self._replay_task = asyncio.create_task(self._serve_replay(self._replay))

    @property
    def next_seq(self) -> int:
        return self._seq

    def publish(self, events: list[KVEvent]) -> None:
        """Send one batch now (never blocks; a full queue drops, as a PUB socket at its HWM does)."""
        if not events or self._pub.closed:
            return
        payload = encode_batch(EventBatch(time.time(), tuple(events), self._rank), self._encoding)
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        with contextlib.suppress(zmq.Again):
            self._pub.send_multipart([self._topic, encode_seq(seq), payload], flags=zmq.NOBLOCK)

    async def close(self) -> None:
        if self._replay_task is not None:
            self._replay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replay_task
            self._replay_task = None
        self._close_sockets()

    def _close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()
        self._actx.term()

    async def _serve_replay(self, sock: zmq.asyncio.Socket) -> None:
        while True:
            frames = await sock.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("invalid KV-event replay request: %d frames", len(frames))
                continue
            client_id, _, start = frames
            start_seq = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= start_seq:
                    await sock.send_multipart([client_id, b"", self._topic, encode_seq(seq), payload])
            await sock.send_multipart([client_id, b"", b"", encode_seq(REPLAY_END_SEQ), b""])
