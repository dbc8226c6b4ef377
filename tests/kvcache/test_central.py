"""Central mode (llm-d's ``zmqEndpoint``): the router binds one socket, every replica's publisher connects to
it, and the topic ``kv@<host>:<port>@<model>`` says whose each message is. Over real ZMQ sockets: the
simulator's publisher connects to a non-wildcard address as vLLM's does."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest
import zmq

from burstsched.config import EndpointConfig, KVEventsConfig, parse_config_document
from burstsched.kvcache import KVEventHub, stream_addresses
from burstsched.kvcache.addresses import topic_source
from burstsched.prefix.kv_events import BlockRemoved
from burstsched.server.serve import RunningRouter, running_router
from burstsched.sim import SimConfig, SimPool
from burstsched.sim.kv_events import KVEventPublisher
from burstsched.testing.ports import free_port
from tests.kvcache.test_hub_membership import RecordingConsumer
from tests.router.helpers import FAST_POOL, eventually

pytestmark = pytest.mark.anyio
CORPUS = Path(__file__).resolve().parents[1] / "config" / "llmd_corpus"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_a_topic_names_its_source_as_llm_d_parses_it() -> None:
    assert topic_source("kv@10.0.0.5:8000@meta-llama/Llama-3.1-8B") == "10.0.0.5:8000"
    assert topic_source("kv@vllm-0@m") == "vllm-0"
    assert topic_source("plain") == "plain"  # no kv@...@...: the whole topic, as llm-d's parseTopic


def test_central_addresses_name_each_endpoint_by_host_port_and_name() -> None:
    config = KVEventsConfig(bind="tcp://0.0.0.0:5557", replay_template="tcp://{host}:5558")
    endpoints = [
        EndpointConfig(name="a", url="http://10.0.0.5:8000"),
        EndpointConfig(url="http://10.0.0.6:8000", kv_events="tcp://10.0.0.6:5557"),  # its own wins
    ]
    a, b = stream_addresses(endpoints, config)
    assert (a.endpoint, a.events, a.replay, a.sources) == (
        "a",
        "tcp://0.0.0.0:5557",
        "tcp://10.0.0.5:5558",
        ("10.0.0.5:8000", "a"),
    )
    assert (b.endpoint, b.events, b.central) == ("10.0.0.6:8000", "tcp://10.0.0.6:5557", False)


def test_bind_and_a_per_replica_template_are_not_both_set() -> None:
    with pytest.raises(ValueError, match="set one"):
        KVEventsConfig(bind="tcp://0.0.0.0:5557", endpoint_template="tcp://{host}:5557")


async def _delivered(
    consumer: RecordingConsumer, endpoint: str, publisher: KVEventPublisher, block: int
) -> None:
    """Publish ``block`` until ``consumer`` has it from ``endpoint`` (a connecting PUB drops what it sends
    before the connection is up); fail after 5 s."""
    with anyio.fail_after(5):
        while block not in consumer.blocks.get(endpoint, []):
            publisher.publish([BlockRemoved((block,))])
            await anyio.sleep(0.02)


async def test_one_bound_socket_sorts_each_replicas_messages_by_topic() -> None:
    bind = f"tcp://127.0.0.1:{free_port()}"
    endpoints = [
        EndpointConfig(name="a", url="http://127.0.0.1:9001"),
        EndpointConfig(name="b", url="http://127.0.0.1:9002"),
    ]
    consumer = RecordingConsumer()
    hub = KVEventHub(stream_addresses(endpoints, KVEventsConfig(bind=bind)), [consumer])
    pubs = [
        KVEventPublisher(bind, topic="kv@127.0.0.1:9001@m"),  # by host:port, as llm-d's pods say it
        KVEventPublisher(bind, topic="kv@b@m"),  # by the endpoint's name
        KVEventPublisher(bind, topic="kv@127.0.0.1:9999@m"),  # no such endpoint
    ]
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(hub.run)
            for pub in pubs:
                pub.start()
            await _delivered(consumer, "a", pubs[0], 1)
            await _delivered(consumer, "b", pubs[1], 2)
            for _ in range(10):
                pubs[2].publish([BlockRemoved((3,))])
            await _delivered(consumer, "a", pubs[0], 4)
            assert set(consumer.blocks["a"]) == {1, 4} and set(consumer.blocks["b"]) == {2}
            stream_a = hub.stream("a")
            assert stream_a is not None and stream_a.last_seq is not None and stream_a.last_seq > 0
            assert ("reset", "a") not in consumer.calls

            # a's replica restarts: its new publisher counts from 0 again, so a's entries are dropped
            await pubs[0].close()
            pubs[0] = KVEventPublisher(bind, topic="kv@127.0.0.1:9001@m")
            pubs[0].start()
            await _delivered(consumer, "a", pubs[0], 5)
            assert ("reset", "a") in consumer.calls and ("reset", "b") not in consumer.calls

            hub.remove_endpoint("b")  # b left: what its replica still sends reaches nobody
            before = list(consumer.blocks["b"])
            pubs[1].publish([BlockRemoved((6,))])
            await _delivered(consumer, "a", pubs[0], 7)
            assert consumer.blocks["b"] == before
            tg.cancel_scope.cancel()
    finally:
        for pub in pubs:
            await pub.close()


async def test_a_central_socket_that_cannot_bind_fails_the_start() -> None:
    taken = f"tcp://127.0.0.1:{free_port()}"
    holder = KVEventHub(
        stream_addresses([EndpointConfig(name="a", url="http://127.0.0.1:9001")], KVEventsConfig(bind=taken)),
        [RecordingConsumer()],
    )
    second = KVEventHub(
        stream_addresses([EndpointConfig(name="b", url="http://127.0.0.1:9002")], KVEventsConfig(bind=taken)),
        [RecordingConsumer()],
    )
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(holder.run)
            with pytest.raises(zmq.ZMQError):
                await second.run()
            tg.cancel_scope.cancel()


# --- end to end: llm-d's own central-mode config, loaded as is, on simulated replicas ---------------------


@pytest.fixture
async def central_pool() -> AsyncIterator[tuple[SimPool, str]]:
    """Two replicas whose publishers connect to one address (the router binds it later), with llm-d's
    topic; they bind their replay sockets, as vLLM does."""
    bind = f"tcp://127.0.0.1:{free_port()}"
    config = SimConfig(
        time_scale=0.02,
        num_gpu_blocks=64,
        max_model_len=1000,
        kv_events_endpoint=bind,
        kv_events_topic="kv@{host}:{port}@{model}",
        kv_events_replay_endpoint="tcp://127.0.0.1:*",
    )
    async with SimPool(2, config) as pool:
        yield pool, bind


@pytest.fixture
async def central_router(central_pool: tuple[SimPool, str]) -> AsyncIterator[RunningRouter]:
    pool, bind = central_pool
    text = (CORPUS / "router-deploy-sim-epp-kvcache-config.yaml").read_text(encoding="utf-8")
    loaded = parse_config_document(text, source="sim-epp-kvcache")
    assert loaded.config.kv_events.bind == "tcp://0.0.0.0:5557"  # as llm-d's file says
    endpoints = [
        EndpointConfig(name=name, url=url, kv_events_replay=replay)
        for name, url, replay in zip(pool.names, pool.urls, pool.kv_events_replay_endpoints, strict=True)
    ]
    config = loaded.config.model_copy(
        update={
            "endpoints": endpoints,
            "pool": FAST_POOL,
            "kv_events": loaded.config.kv_events.model_copy(update={"bind": bind}),  # loopback, a free port
        }
    )
    async with running_router(config, rng=random.Random(3)) as running:
        yield running


async def test_llm_d_central_mode_config_routes_on_the_replicas_events(
    central_pool: tuple[SimPool, str], central_router: RunningRouter
) -> None:
    pool, _ = central_pool
    hub = central_router.app.state.router.hub

    async def applied() -> bool:
        for i, name in enumerate(pool.names):
            publisher, stream = pool.replica(i).publisher, hub.stream(name)
            assert publisher is not None and stream is not None
            if publisher.next_seq > 0 and stream.last_seq != publisher.next_seq - 1:
                return False
        return True

    rng = random.Random(5)
    documents = [" ".join(f"w{rng.randrange(10_000)}" for _ in range(250)) for _ in range(6)]
    exact = warm = 0
    async with httpx.AsyncClient(base_url=central_router.url, timeout=30) as client:
        # a publisher's messages before its connection is up are lost, and seen missing (then replayed) only
        # at its next message: each replica is sent requests directly until the router has its events
        for i, url in enumerate(pool.urls):
            with anyio.fail_after(10):
                for n in range(10_000):  # a new prompt each time: each stores new blocks, so sends an event
                    warm_up = {"model": "kv-demo", "prompt": f"warm up {i} {n} " * 40, "max_tokens": 1}
                    assert (await client.post(f"{url}/v1/completions", json=warm_up)).is_success
                    await anyio.sleep(0.05)
                    stream = hub.stream(pool.names[i])
                    if stream is not None and stream.last_seq is not None and await applied():
                        break
        for i in range(24):
            doc = documents[i % 3] if i < 12 else documents[3 + i % 3]
            body = {
                "model": "kv-demo",
                "messages": [{"role": "user", "content": f"{doc}\nQuestion {i}?"}],
                "max_tokens": 2,
            }
            response = await client.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            assert response.headers["x-burstsched-prefix-index"] == "precise"
            predicted = int(response.headers["x-burstsched-predicted-cached-tokens"])
            actual = int(response.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
            exact += predicted == actual
            warm += actual > 0
            await eventually(applied, within_s=10)  # concurrency 1: every event in before the next one
        metrics = (await client.get("/metrics")).text
    assert exact == 24, f"{24 - exact} of 24 predictions were wrong"
    assert warm >= 12  # every document's later questions were found warm
    for name in pool.names:  # both replicas' events came in through the one bound socket
        assert f'burstsched_kv_events_total{{endpoint="{name}",type="BlockStored"}}' in metrics
