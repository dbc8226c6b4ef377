"""The event stream's sequencing: in order, joined late, gaps replayed or reset, restarts; over real ZMQ
sockets against the simulator's publisher (the same PUB/ROUTER protocol as vLLM's)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
import pytest
import zmq
import zmq.asyncio

from burstsched.kvcache import EventStream
from burstsched.prefix.kv_events import AllBlocksCleared, BlockRemoved, EventBatch, KVEventMessage
from burstsched.sim.kv_events import KVEventPublisher

pytestmark = pytest.mark.anyio


@dataclass
class RecordingSink:
    """Records what a stream delivers."""

    batches: list[int] = field(default_factory=list)
    resets: list[str] = field(default_factory=list)
    gaps: list[int] = field(default_factory=list)
    replays: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def batch(self, endpoint: str, seq: int, batch: EventBatch) -> None:
        self.batches.append(seq)

    def reset(self, endpoint: str, reason: str) -> None:
        self.resets.append(reason)

    def gap(self, endpoint: str, missing: int) -> None:
        self.gaps.append(missing)

    def replay(self, endpoint: str, outcome: str) -> None:
        self.replays.append(outcome)

    def decode_error(self, endpoint: str, error: str) -> None:
        self.errors.append(error)


def _message(seq: int, ts: float | None = None) -> KVEventMessage:
    stamp = float(seq) if ts is None else ts
    return KVEventMessage("", seq, EventBatch(stamp, (BlockRemoved((seq,)),), 0))


@pytest.fixture
async def context() -> AsyncIterator[zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    yield ctx
    ctx.term()


@pytest.fixture
async def publisher() -> AsyncIterator[KVEventPublisher]:
    pub = KVEventPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*")
    pub.start()
    yield pub
    await pub.close()


def _stream(sink: RecordingSink, context: zmq.asyncio.Context, replay: str | None) -> EventStream:
    return EventStream("a", "tcp://127.0.0.1:1", sink, context, replay_address=replay, replay_timeout_s=2.0)


async def test_in_order_batches_pass_straight_through(context: zmq.asyncio.Context) -> None:
    sink = RecordingSink()
    stream = _stream(sink, context, None)
    for seq in range(3):
        await stream.accept(_message(seq))
    assert sink.batches == [0, 1, 2] and not sink.resets and not sink.gaps


async def test_a_gap_is_replayed_from_the_publishers_buffer(
    context: zmq.asyncio.Context, publisher: KVEventPublisher
) -> None:
    for seq in range(6):
        publisher.publish([BlockRemoved((seq,))])
    sink = RecordingSink()
    stream = _stream(sink, context, publisher.replay_endpoint)
    await stream.accept(_message(0))
    with anyio.fail_after(5):
        await stream.accept(_message(5))
    assert sink.gaps == [4]
    assert sink.replays == ["ok"]
    assert sink.batches == [0, 1, 2, 3, 4, 5]
    assert sink.resets == []


async def test_joining_late_replays_from_zero_without_a_reset(
    context: zmq.asyncio.Context, publisher: KVEventPublisher
) -> None:
    for seq in range(3):
        publisher.publish([BlockRemoved((seq,))])
    sink = RecordingSink()
    stream = _stream(sink, context, publisher.replay_endpoint)
    with anyio.fail_after(5):
        await stream.accept(_message(3))
    assert sink.batches == [0, 1, 2, 3] and sink.replays == ["ok"] and sink.resets == []


async def test_a_gap_without_replay_resets_the_endpoint(context: zmq.asyncio.Context) -> None:
    sink = RecordingSink()
    stream = _stream(sink, context, None)
    await stream.accept(_message(0))
    await stream.accept(_message(4))
    assert sink.resets == ["gap"] and sink.replays == ["unavailable"]
    assert sink.batches == [0, 4]


async def test_a_replay_that_no_longer_holds_the_gap_resets(
    context: zmq.asyncio.Context,
) -> None:
    pub = KVEventPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", buffer_steps=2)
    pub.start()
    try:
        for seq in range(6):
            pub.publish([BlockRemoved((seq,))])
        sink = RecordingSink()
        stream = _stream(sink, context, pub.replay_endpoint)
        await stream.accept(_message(0))
        with anyio.fail_after(5):
            await stream.accept(_message(6))
        assert sink.replays == ["partial"] and sink.resets == ["gap"]
        assert sink.batches == [0, 4, 5, 6]  # what the buffer still held is applied after the reset
    finally:
        await pub.close()


async def test_a_replay_socket_that_never_answers_times_out_and_resets(context: zmq.asyncio.Context) -> None:
    silent = context.socket(zmq.ROUTER)
    silent.setsockopt(zmq.LINGER, 0)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    try:
        sink = RecordingSink()
        stream = EventStream(
            "a",
            "tcp://127.0.0.1:1",
            sink,
            context,
            replay_address=f"tcp://127.0.0.1:{port}",
            replay_timeout_s=0.2,
        )
        await stream.accept(_message(0))
        with anyio.fail_after(5):
            await stream.accept(_message(3))
        assert sink.replays == ["failed"] and sink.resets == ["gap"] and sink.batches == [0, 3]
    finally:
        silent.close(linger=0)


async def test_a_sequence_going_back_is_a_restart(context: zmq.asyncio.Context) -> None:
    sink = RecordingSink()
    stream = _stream(sink, context, None)
    for seq in (0, 1, 2):
        await stream.accept(_message(seq))
    await stream.accept(_message(0, ts=100.0))  # a newer batch with an older number: a new process
    assert sink.resets == ["restart"] and sink.batches == [0, 1, 2, 0]


async def test_a_batch_seen_again_after_a_replay_is_dropped(context: zmq.asyncio.Context) -> None:
    sink = RecordingSink()
    stream = _stream(sink, context, None)
    for seq in (0, 1, 2):
        await stream.accept(_message(seq))
    await stream.accept(_message(1))  # the subscription delivers a batch the replay brought already
    await stream.accept(_message(3))
    assert sink.resets == [] and sink.batches == [0, 1, 2, 3]


async def test_on_start_the_stream_catches_up_from_the_replay_socket(
    context: zmq.asyncio.Context, publisher: KVEventPublisher
) -> None:
    for seq in range(4):
        publisher.publish([BlockRemoved((seq,))])
    sink = RecordingSink()
    stream = EventStream("a", publisher.endpoint, sink, context, replay_address=publisher.replay_endpoint)
    async with anyio.create_task_group() as tg:
        tg.start_soon(stream.run)
        with anyio.fail_after(5):
            # no new message is published: only the catch-up can bring them
            while len(sink.batches) < 4:  # noqa: ASYNC110 - polls what the stream task delivers
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert sink.batches == [0, 1, 2, 3] and sink.replays == ["ok"]


async def test_forget_starts_a_new_sequence(context: zmq.asyncio.Context) -> None:
    sink = RecordingSink()
    stream = _stream(sink, context, None)
    await stream.accept(_message(0))
    await stream.accept(_message(1))
    stream.forget()
    await stream.accept(_message(0))
    assert sink.resets == [] and sink.batches == [0, 1, 0]


async def test_run_receives_from_a_real_publisher_and_skips_garbage(
    context: zmq.asyncio.Context, publisher: KVEventPublisher
) -> None:
    sink = RecordingSink()
    stream = EventStream("a", publisher.endpoint, sink, context, replay_address=publisher.replay_endpoint)
    garbage = context.socket(zmq.PUB)
    garbage.setsockopt(zmq.LINGER, 0)
    garbage_port = garbage.bind_to_random_port("tcp://127.0.0.1")
    bad = EventStream("b", f"tcp://127.0.0.1:{garbage_port}", sink, context)
    async with anyio.create_task_group() as tg:
        tg.start_soon(stream.run)
        tg.start_soon(bad.run)
        with anyio.fail_after(10):
            # a SUB socket takes a moment to join: publish until the stream has seen something
            while not sink.batches:
                publisher.publish([AllBlocksCleared()])
                await garbage.send_multipart([b"", b"\x00" * 8, b"\xc1"])
                await anyio.sleep(0.02)
            while not sink.errors:
                await garbage.send_multipart([b"", b"\x00" * 8, b"\xc1"])
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
    garbage.close(linger=0)
    # every published batch arrived in order, those sent before the subscription joined by replay
    assert sink.batches == list(range(len(sink.batches)))
    assert sink.resets == []
