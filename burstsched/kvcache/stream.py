"""One replica's KV-event stream: a ZMQ SUB socket, the sequence kept in order, gaps replayed.

Every message carries a sequence number that the publisher increments per batch, from 0. The stream applies
batches in order and handles the three ways the order breaks:

- **joined late**: the first message seen has ``seq > 0`` (the router started after the replica, or ZMQ's
  subscription took a moment): the batches before it are asked from the replay socket;
- **gap**: ``seq > last + 1`` (messages dropped at a high-water mark, or a network hiccup): the missing
  batches are replayed. When that is impossible (no replay socket, a timeout, or the publisher's buffer no
  longer holds them), what the router holds for the endpoint may be wrong, so it is reset: the consumers drop
  its entries and later events rebuild them;
- **restart**: ``seq <= last`` with a batch newer than the last one applied: the sequence went backwards, so
  a new publisher process, whose cache starts empty. The endpoint is reset, then the new sequence is
  followed as if joined late. (``seq <= last`` with a batch no newer is a duplicate, delivered again after a
  replay, and is dropped.)

On start the stream subscribes, then asks the replay socket for everything it still holds, so the router's
view covers the replica's history at once (and the last batches before the subscription took effect, which no
later message would reveal as missing).

The replay protocol (vLLM 0.32's, measured): a DEALER sends ``[b"", start_seq (8 bytes)]`` to the replica's
ROUTER socket and receives ``[b"", topic, seq, payload]`` per buffered batch from ``start_seq`` on, then
``[b"", b"", -1, b""]``. Answers without the topic frame (``[b"", seq, payload]``) are read as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Protocol

import zmq
import zmq.asyncio
from anyio.streams.memory import MemoryObjectReceiveStream

from burstsched.prefix.kv_events import (
    REPLAY_END_SEQ,
    EventBatch,
    KVEventDecodeError,
    KVEventMessage,
    decode_batch,
    decode_message,
    decode_seq,
    encode_seq,
)

log = logging.getLogger(__name__)


class StreamSink(Protocol):
    """Where a stream delivers what it learns, in order, on the event loop."""

    def batch(self, endpoint: str, seq: int, batch: EventBatch) -> None: ...

    def reset(self, endpoint: str, reason: str) -> None: ...

    def gap(self, endpoint: str, missing: int) -> None: ...

    def replay(self, endpoint: str, outcome: str) -> None: ...

    def decode_error(self, endpoint: str, error: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Replayed:
    """The batches a replay returned with ``start <= seq < end``, and whether they begin at ``start``."""

    messages: tuple[tuple[int, EventBatch], ...]
    complete: bool


class EventStream:
    """Follows one endpoint's events; :meth:`run` until cancelled."""

    def __init__(
        self,
        endpoint: str,
        address: str,
        sink: StreamSink,
        context: zmq.asyncio.Context,
        *,
        replay_address: str | None = None,
        topic: str = "",
        replay_timeout_s: float = 2.0,
    ) -> None:
        self.endpoint = endpoint
        self.address = address
        self.replay_address = replay_address
        self._sink = sink
        self._context = context
        self._topic = topic.encode("utf-8")
        self._replay_timeout_s = replay_timeout_s
        self.last_seq: int | None = None
        self.last_ts = float("-inf")

    def forget(self) -> None:
        """The endpoint went away: the next message starts a new sequence (its state was dropped already)."""
        self.last_seq = None
        self.last_ts = float("-inf")

    async def run(self) -> None:
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        try:
            sub.connect(self.address)
            await self.catch_up()
            while True:
                frames = await sub.recv_multipart()
                try:
                    message = decode_message(frames)
                except KVEventDecodeError as exc:
                    self._sink.decode_error(self.endpoint, str(exc))
                    continue
                await self.accept(message)
        finally:
            sub.close(linger=0)

    async def follow(self, messages: MemoryObjectReceiveStream[KVEventMessage]) -> None:
        """Central mode: apply the messages another socket received for this endpoint, until cancelled."""
        await self.catch_up()
        async with messages:
            async for message in messages:
                await self.accept(message)

    async def catch_up(self) -> None:
        """Replay whatever the replica still buffers, so the view covers its history from the start."""
        if self.replay_address is not None:
            await self._fill(0, None, had_state=False)

    async def accept(self, message: KVEventMessage) -> None:
        """Apply one received message, replaying or resetting first if the sequence broke."""
        seq = message.seq
        last = self.last_seq
        if last is not None and seq <= last:
            if message.batch.ts <= self.last_ts:
                return  # a batch applied already (the subscription delivers what a replay brought)
            log.warning(
                "KV events of %s: sequence went back from %d to %d (replica restarted)",
                self.endpoint,
                last,
                seq,
            )
            self._sink.reset(self.endpoint, "restart")
            self.last_seq = last = None
        if last is None:
            if seq > 0:
                await self._fill(0, seq, had_state=False)
        elif seq > last + 1:
            self._sink.gap(self.endpoint, seq - last - 1)
            await self._fill(last + 1, seq, had_state=True)
        self._apply(seq, message.batch)

    def _apply(self, seq: int, batch: EventBatch) -> None:
        self.last_seq = seq
        self.last_ts = batch.ts
        self._sink.batch(self.endpoint, seq, batch)

    async def _fill(self, start: int, end: int | None, *, had_state: bool) -> None:
        """Replay ``[start, end)`` (``end`` None: all the replica holds); reset the endpoint when that fails
        and it held state that may be wrong."""
        if self.replay_address is None:
            if had_state:
                self._sink.replay(self.endpoint, "unavailable")
                self._sink.reset(self.endpoint, "gap")
            return
        replayed = await self.replay(start, end)
        if replayed is None:
            self._sink.replay(self.endpoint, "failed")
            if had_state:
                self._sink.reset(self.endpoint, "gap")
            return
        if not replayed.messages and end is None:
            return  # nothing buffered yet: nothing to catch up on
        if replayed.complete:
            self._sink.replay(self.endpoint, "ok")
        else:
            self._sink.replay(self.endpoint, "partial")
            if had_state:
                self._sink.reset(self.endpoint, "gap")
        for seq, batch in replayed.messages:
            self._apply(seq, batch)

    async def replay(self, start: int, end: int | None) -> Replayed | None:
        """Ask the replay socket for ``[start, end)`` (``end`` None: to the newest); None when it does not
        answer in time or garbles."""
        assert self.replay_address is not None
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        try:
            dealer.connect(self.replay_address)
            await dealer.send_multipart([b"", encode_seq(start)])
            messages: list[tuple[int, EventBatch]] = []
            async with asyncio.timeout(self._replay_timeout_s):
                while True:
                    frames = await dealer.recv_multipart()
                    if len(frames) not in (3, 4):
                        raise KVEventDecodeError(f"replay answer has {len(frames)} frames, expected 4")
                    seq = decode_seq(frames[-2])
                    if seq == REPLAY_END_SEQ:
                        break
                    if start <= seq and (end is None or seq < end):
                        messages.append((seq, decode_batch(frames[-1])))
        except TimeoutError:
            log.warning("KV-event replay from %s timed out", self.replay_address)
            return None
        except (KVEventDecodeError, zmq.ZMQError) as exc:
            log.warning("KV-event replay from %s failed: %s", self.replay_address, exc)
            return None
        finally:
            with contextlib.suppress(zmq.ZMQError):
                dealer.close(linger=0)
        messages.sort(key=lambda item: item[0])
        complete = (
            bool(messages)
            and messages[0][0] == start
            and (end is None or messages[-1][0] == end - 1)
            and _contiguous(messages)
        )
        return Replayed(tuple(messages), complete or start == end)


def _contiguous(messages: list[tuple[int, EventBatch]]) -> bool:
    return all(b[0] == a[0] + 1 for a, b in zip(messages, messages[1:], strict=False))
