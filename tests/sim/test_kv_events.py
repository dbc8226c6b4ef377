"""KV events: the wire codec (both encodings) and a real ZMQ subscriber against a simulated replica."""

from __future__ import annotations

import anyio
import msgpack
import pytest
import zmq
import zmq.asyncio
from hypothesis import given, settings
from hypothesis import strategies as st

from burstsched.prefix.kv_events import (
    REPLAY_END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEvent,
    KVEventDecodeError,
    UnknownEvent,
    decode_batch,
    decode_message,
    decode_seq,
    encode_batch,
    encode_seq,
)
from burstsched.sim import SimConfig, SimPool
from burstsched.sim.block_cache import BlockHasher

from .http_helpers import chat, client

hashes = st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=4)
stored = st.builds(
    lambda hs, parent, bs, group: BlockStored(
        block_hashes=tuple(hs),
        parent_block_hash=parent,
        token_ids=tuple(range(len(hs) * bs)),
        block_size=bs,
        extra_keys=tuple(None for _ in hs),
        group_idx=group,
        kv_cache_spec_kind="full_attention",
    ),
    hashes,
    st.none() | st.integers(0, 2**64 - 1),
    st.integers(1, 8),
    st.none() | st.integers(0, 3),
)
removed = st.builds(lambda hs: BlockRemoved(block_hashes=tuple(hs), group_idx=0), hashes)
events = st.lists(stored | removed | st.just(AllBlocksCleared()), max_size=6)


@settings(max_examples=60, deadline=None)
@given(evs=events, encoding=st.sampled_from(["map", "array"]), ts=st.floats(0, 2e9))
def test_batches_round_trip_in_both_encodings(evs: list[KVEvent], encoding: str, ts: float) -> None:
    batch = EventBatch(ts, tuple(evs), 0)
    assert decode_batch(encode_batch(batch, "map" if encoding == "map" else "array")) == batch


def test_map_encoding_is_vllm_032_shape() -> None:
    event = BlockStored(
        (5,), None, (1, 2), 2, extra_keys=(None,), group_idx=0, kv_cache_spec_kind="full_attention"
    )
    ts, evs, rank = msgpack.unpackb(encode_batch(EventBatch(1.5, (event,), 0), "map"))
    assert (ts, rank) == (1.5, 0)
    assert evs == [
        {
            "type": "BlockStored",
            "block_hashes": [5],
            "parent_block_hash": None,
            "token_ids": [1, 2],
            "block_size": 2,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
            "extra_keys": [None],
            "group_idx": 0,
            "kv_cache_spec_kind": "full_attention",
        }
    ]


def test_legacy_arrays_with_trailing_fields_left_out_decode() -> None:
    payload = msgpack.packb(
        [
            2.0,
            [
                ["BlockStored", [7, 8], None, [1, 2, 3, 4], 2, None],
                ["BlockRemoved", [7]],
                ["AllBlocksCleared"],
            ],
        ]
    )
    batch = decode_batch(payload)
    assert batch.data_parallel_rank is None
    assert batch.events == (
        BlockStored((7, 8), None, (1, 2, 3, 4), 2, medium=None),
        BlockRemoved((7,), medium=None),
        AllBlocksCleared(),
    )


def test_unknown_event_types_are_kept_and_garbage_is_rejected() -> None:
    batch = decode_batch(msgpack.packb([1.0, [{"type": "Future", "x": 1}], 0]))
    assert batch.events == (UnknownEvent("Future"),)
    for bad in (b"\xc1", msgpack.packb({"nope": 1}), msgpack.packb([1.0, [{"type": "BlockStored"}], 0])):
        with pytest.raises(KVEventDecodeError):
            decode_batch(bad)
    with pytest.raises(KVEventDecodeError):
        decode_message([b"topic", b"\x00"])


def test_sequence_frames() -> None:
    assert decode_seq(encode_seq(0)) == 0
    assert decode_seq(encode_seq(2**40)) == 2**40
    assert decode_seq(encode_seq(REPLAY_END_SEQ)) == REPLAY_END_SEQ
    assert encode_seq(1) == b"\x00" * 7 + b"\x01"


async def _replay(ctx: zmq.asyncio.Context, endpoint: str, start: int) -> dict[int, bytes]:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        await sock.send_multipart([b"", encode_seq(start)])
        out: dict[int, bytes] = {}
        while True:
            _, _topic, seq_frame, payload = await sock.recv_multipart()  # vLLM 0.32's four frames
            seq = decode_seq(seq_frame)
            if seq == REPLAY_END_SEQ:
                return out
            out[seq] = payload
    finally:
        sock.close(linger=0)


@pytest.mark.anyio
@pytest.mark.parametrize("encoding", ["map", "array"])
async def test_a_subscriber_sees_exactly_the_blocks_stored_and_removed(encoding: str) -> None:
    config = SimConfig(
        time_scale=0.01,
        block_size=16,
        num_gpu_blocks=40,
        kv_events_endpoint="tcp://127.0.0.1:*",
        kv_events_replay_endpoint="tcp://127.0.0.1:*",
        kv_events_topic="kv@sim-0@kv-demo",
        kv_events_encoding="map" if encoding == "map" else "array",
        seed=3,
    )
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        async with SimPool(1, config) as pool:
            endpoint, replay = pool.kv_events_endpoints[0], pool.kv_events_replay_endpoints[0]
            assert endpoint is not None and replay is not None
            sub.connect(endpoint)
            async with client() as http:
                # 39 usable blocks; six distinct ~200-token prompts force evictions.
                for i in range(6):
                    text = f"Request {i}. " + " ".join(f"item{i}x{j}" for j in range(120))
                    await chat(http, pool.urls[0], text, max_tokens=20)
                engine = pool.replica(0).engine
                assert engine is not None
                expected = engine.cache.cached_hashes()
                last_seq = pool.replica(0).publisher.next_seq - 1  # type: ignore[union-attr]
                received: dict[int, bytes] = {}
                with anyio.fail_after(10):
                    while last_seq not in received:
                        message = await sub.recv_multipart()
                        decoded = decode_message(message)
                        assert decoded.topic == "kv@sim-0@kv-demo"
                        received[decoded.seq] = message[2]
                replayed = await _replay(ctx, replay, 0)
                assert sorted(replayed) == list(range(last_seq + 1))
                for seq, payload in received.items():
                    assert replayed[seq] == payload
                live: set[int] = set()
                stored_count = removed_count = 0
                hasher = BlockHasher(16, seed=3)
                for seq in sorted(replayed):
                    raw_events = msgpack.unpackb(replayed[seq])[1]
                    assert all(isinstance(e, dict if encoding == "map" else list) for e in raw_events)
                    for event in decode_batch(replayed[seq]).events:
                        if isinstance(event, BlockStored):
                            stored_count += len(event.block_hashes)
                            parent = event.parent_block_hash
                            for k, h in enumerate(event.block_hashes):
                                block = event.token_ids[k * 16 : (k + 1) * 16]
                                assert hasher.hash_block(parent, block) == h
                                parent = h
                            live.update(event.block_hashes)
                        elif isinstance(event, BlockRemoved):
                            removed_count += len(event.block_hashes)
                            live.difference_update(event.block_hashes)
                assert removed_count > 0
                assert live == expected
                assert stored_count - removed_count == len(expected)
                # An idle replica publishes a reset's AllBlocksCleared with its next step, as vLLM does:
                # the next request's first batch starts with one per reset.
                assert await pool.areset_prefix_cache() == [True]
                assert await pool.areset_prefix_cache() == [True]
                assert not await sub.poll(timeout=300)  # nothing while idle
                await chat(http, pool.urls[0], "After the reset. " + " ".join(f"w{j}" for j in range(60)))
                with anyio.fail_after(10):
                    batch = decode_message(await sub.recv_multipart()).batch
                assert batch.events[:2] == (AllBlocksCleared(), AllBlocksCleared())
                assert batch.events[2:] and all(isinstance(e, BlockStored) for e in batch.events[2:])
    finally:
        sub.close(linger=0)
        ctx.term()
