"""KVEventHub.add_endpoint/remove_endpoint: endpoints discovered while the hub runs are followed, and those
that leave stop reaching the consumers; over real ZMQ sockets against the simulator's publisher."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
import pytest

from burstsched.kvcache import KVEventHub
from burstsched.kvcache.addresses import StreamAddress
from burstsched.prefix.kv_events import BlockRemoved, EventBatch
from burstsched.sim.kv_events import KVEventPublisher

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class RecordingConsumer:
    """A KV-event consumer that records what the hub tells it, in order."""

    name: str = "recorder"
    calls: list[tuple[str, str]] = field(default_factory=list)
    """(what, endpoint): live, closed, reset."""
    blocks: dict[str, list[int]] = field(default_factory=dict)
    """Per endpoint, the hashes of the BlockRemoved events received."""

    def on_kv_events(self, endpoint: str, batch: EventBatch) -> None:
        for event in batch.events:
            if isinstance(event, BlockRemoved):
                self.blocks.setdefault(endpoint, []).extend(int(h) for h in event.block_hashes)

    def on_kv_stream_reset(self, endpoint: str, reason: str) -> None:
        self.calls.append(("reset", endpoint))

    def on_kv_stream_live(self, endpoint: str) -> None:
        self.calls.append(("live", endpoint))

    def on_kv_stream_closed(self, endpoint: str) -> None:
        self.calls.append(("closed", endpoint))


@pytest.fixture
async def publishers() -> AsyncIterator[list[KVEventPublisher]]:
    pubs = [KVEventPublisher("tcp://127.0.0.1:*") for _ in range(2)]
    for pub in pubs:
        pub.start()
    yield pubs
    for pub in pubs:
        await pub.close()


def _address(endpoint: str, publisher: KVEventPublisher) -> StreamAddress:
    assert publisher.endpoint is not None
    return StreamAddress(endpoint, publisher.endpoint, None)


async def _delivered(
    consumer: RecordingConsumer, endpoint: str, publisher: KVEventPublisher, block: int
) -> None:
    """Publish ``block`` on ``publisher`` until ``consumer`` has it from ``endpoint`` (a SUB socket joins a
    PUB some time after connecting: what is published before is not received); fail after 5 s."""
    with anyio.fail_after(5):
        while block not in consumer.blocks.get(endpoint, []):
            publisher.publish([BlockRemoved((block,))])
            await anyio.sleep(0.02)


async def test_an_endpoint_added_while_running_is_followed_once_and_a_removed_one_stops(
    publishers: list[KVEventPublisher],
) -> None:
    consumer = RecordingConsumer()
    hub = KVEventHub([], [consumer])
    a, b = _address("a", publishers[0]), _address("b", publishers[1])
    async with anyio.create_task_group() as tg:
        await tg.start(lambda task_status: hub.run(dynamic=True, task_status=task_status))
        assert hub.stream("a") is None  # dynamic: running with no stream yet

        hub.add_endpoint(a)
        hub.add_endpoint(a)  # discovery repeats the set: the stream already followed is left as is
        stream_a = hub.stream("a")
        assert stream_a is not None and stream_a.address == publishers[0].endpoint
        assert consumer.calls == [("live", "a")]
        await _delivered(consumer, "a", publishers[0], 1)

        hub.add_endpoint(b)
        await _delivered(consumer, "b", publishers[1], 2)

        hub.remove_endpoint("a")
        assert hub.stream("a") is None
        assert consumer.calls == [("live", "a"), ("live", "b"), ("closed", "a")]
        received_from_a = list(consumer.blocks["a"])
        publishers[0].publish([BlockRemoved((3,))])
        await _delivered(consumer, "b", publishers[1], 4)  # b is still followed: a's event had its chance
        assert consumer.blocks["a"] == received_from_a

        hub.remove_endpoint("a")  # already gone, and never known: nothing happens
        hub.remove_endpoint("nobody")
        assert consumer.calls == [("live", "a"), ("live", "b"), ("closed", "a")]

        hub.add_endpoint(a)  # back (a replica that left and returned): followed again from scratch
        assert hub.stream("a") is not None and hub.stream("a") is not stream_a
        await _delivered(consumer, "a", publishers[0], 5)
        tg.cancel_scope.cancel()
    # the hub stopped: the consumers are told that every stream still followed closed
    assert consumer.calls[3] == ("live", "a")
    assert sorted(consumer.calls[4:]) == [("closed", "a"), ("closed", "b")]
    assert hub.stream("a") is None and hub.stream("b") is None
    assert ("reset", "a") not in consumer.calls and ("reset", "b") not in consumer.calls


async def test_add_endpoint_is_ignored_when_the_hub_is_not_running(
    publishers: list[KVEventPublisher],
) -> None:
    consumer = RecordingConsumer()
    hub = KVEventHub([], [consumer])
    hub.add_endpoint(_address("a", publishers[0]))
    assert hub.stream("a") is None and consumer.calls == []
    hub.remove_endpoint("a")
    assert consumer.calls == []


async def test_a_static_hub_without_addresses_returns_at_once_and_a_dynamic_one_waits() -> None:
    consumer = RecordingConsumer()
    with anyio.fail_after(5):
        await KVEventHub([], [consumer]).run()  # nothing to follow, no discovery: nothing to do
    hub = KVEventHub([], [consumer])
    async with anyio.create_task_group() as tg:
        await tg.start(lambda task_status: hub.run(dynamic=True, task_status=task_status))
        hub.add_endpoint(StreamAddress("late", "tcp://127.0.0.1:1", None))  # still running: followed
        assert hub.stream("late") is not None and consumer.calls == [("live", "late")]
        tg.cancel_scope.cancel()
    assert consumer.calls == [("live", "late"), ("closed", "late")]
