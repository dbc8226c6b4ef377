"""The precise prefix producer: matches from KV events, speculative entries, and the approximate fallback."""

from __future__ import annotations

from burstsched_plugins.precise_prefix import PrecisePrefixParameters, PrecisePrefixProducer
from burstsched_plugins.token_chain import chain_hashes, root_seed

from burstsched.framework import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CycleState,
    EndpointSnapshot,
    EventBatch,
    PluginContext,
    PrefixMatch,
    SchedRequest,
)
from burstsched.framework.types import ApiKind

BS = 4


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _producer(clock: Clock, **params: float | int | None) -> PrecisePrefixProducer:
    parameters = PrecisePrefixParameters.model_validate({"block_size": BS, **params})
    producer = PrecisePrefixProducer("precise", parameters, PluginContext(clock=clock))
    for name in ("a", "b"):
        producer.on_kv_stream_live(name)
    return producer


def _endpoints(*names: str) -> list[EndpointSnapshot]:
    return [EndpointSnapshot(name, f"http://{name}") for name in names]


def _request(tokens: list[int] | None, rid: str = "r", salt: str | None = None) -> SchedRequest:
    return SchedRequest(
        rid,
        "m",
        ApiKind.COMPLETIONS,
        block_hashes=(11, 12, 13),
        token_ids=None if tokens is None else tuple(tokens),
        cache_salt=salt,
    )


def _match(producer: PrecisePrefixProducer, request: SchedRequest, *names: str) -> dict[str, PrefixMatch]:
    state = CycleState()
    producer.produce(request, _endpoints(*names), state)
    out = {}
    for name in names:
        match = state.get(name, PrefixMatch)
        assert match is not None
        out[name] = match
    return out


def _stored(tokens: list[int], engine: list[int], parent: int | None = None) -> BlockStored:
    return BlockStored(tuple(engine), parent, tuple(tokens), BS)


def _batch(*events: object) -> EventBatch:
    return EventBatch(0.0, tuple(events), 0)  # type: ignore[arg-type]


TOKENS = list(range(1, 15))  # 3 full blocks of 4, and 2 tokens more


def test_events_make_exact_matches_and_removals_shorten_them() -> None:
    producer = _producer(Clock())
    producer.on_kv_events("a", _batch(_stored(TOKENS[:8], [901, 902])))
    producer.on_kv_events("a", _batch(_stored(TOKENS[8:12], [903], parent=902)))  # chained by the parent
    matches = _match(producer, _request(TOKENS), "a", "b")
    assert matches["a"] == PrefixMatch(3, 3, BS, "precise")
    assert matches["b"] == PrefixMatch(0, 3, BS, "precise")
    producer.on_kv_events("a", _batch(BlockRemoved((902,))))
    assert _match(producer, _request(TOKENS), "a")["a"].matched_blocks == 1
    producer.on_kv_events("a", _batch(AllBlocksCleared()))
    assert _match(producer, _request(TOKENS), "a")["a"].matched_blocks == 0


def test_the_router_hash_ignores_the_engines_names() -> None:
    producer = _producer(Clock())
    producer.on_kv_events("a", _batch(_stored(TOKENS[:8], [1, 2])))
    producer.on_kv_events("b", _batch(_stored(TOKENS[:8], [77, 78])))  # another seed, same tokens
    matches = _match(producer, _request(TOKENS), "a", "b")
    assert matches["a"].matched_blocks == matches["b"].matched_blocks == 2
    other = [t + 100 for t in TOKENS]
    assert _match(producer, _request(other), "a")["a"].matched_blocks == 0


def test_a_child_whose_parent_was_never_seen_is_not_guessed() -> None:
    producer = _producer(Clock())
    producer.on_kv_events("a", _batch(_stored(TOKENS[4:8], [902], parent=901)))
    assert producer.stats.unchained == 1
    assert _match(producer, _request(TOKENS), "a")["a"].matched_blocks == 0


def test_cache_salt_separates_chains() -> None:
    producer = _producer(Clock())
    salted = BlockStored((1,), None, tuple(TOKENS[:4]), BS, extra_keys=(("tenant-1",),))
    producer.on_kv_events("a", _batch(salted))
    assert _match(producer, _request(TOKENS, salt="tenant-1"), "a")["a"].matched_blocks == 1
    assert _match(producer, _request(TOKENS, rid="r2"), "a")["a"].matched_blocks == 0
    assert chain_hashes(TOKENS, BS, seed=root_seed("x")) != chain_hashes(TOKENS, BS, seed=root_seed(None))


def test_a_request_without_token_ids_falls_back_to_the_approximate_index() -> None:
    producer = _producer(Clock())
    request = _request(None)
    producer.on_dispatch(request, _endpoints("b")[0])
    matches = _match(producer, request, "a", "b")
    assert matches["a"] == PrefixMatch(0, 3, 64, "approximate")
    assert matches["b"] == PrefixMatch(3, 3, 64, "approximate")


def test_an_endpoint_without_a_stream_is_matched_approximately() -> None:
    producer = _producer(Clock())
    request = _request(TOKENS)
    producer.on_dispatch(request, _endpoints("c")[0])
    matches = _match(producer, request, "a", "c")
    assert matches["a"].source == "precise" and matches["c"] == PrefixMatch(3, 3, 64, "approximate")
    producer.on_kv_stream_closed("a")
    assert _match(producer, request, "a")["a"].source == "approximate"


def test_dispatched_blocks_are_speculative_until_their_ttl_or_their_event() -> None:
    clock = Clock()
    producer = _producer(clock, speculative_ttl_ms=1000)
    first, second = _request(TOKENS, "1"), _request(TOKENS, "2")
    producer.on_dispatch(first, _endpoints("a")[0])
    assert _match(producer, second, "a", "b")["a"].matched_blocks == 3  # before any event
    clock.now += 0.5
    producer.on_kv_events("a", _batch(_stored(TOKENS[:4], [901])))  # the engine stored block 0 only
    producer.on_kv_events("a", _batch(BlockRemoved((901,))))  # and evicted it again
    assert (
        _match(producer, second, "a")["a"].matched_blocks == 0
    )  # block 0's speculation was confirmed, then gone
    producer.on_dispatch(_request(TOKENS, "3"), _endpoints("b")[0])
    clock.now += 1.01
    assert _match(producer, second, "b")["b"].matched_blocks == 0  # expired


def test_a_silent_stream_after_a_dispatch_is_distrusted_until_the_next_event() -> None:
    clock = Clock()
    producer = _producer(clock, confirm_timeout_ms=2000, speculative_ttl_ms=0)
    request = _request(TOKENS)
    producer.on_dispatch(request, _endpoints("a")[0])
    clock.now += 1.0
    assert _match(producer, request, "a")["a"].source == "precise"
    clock.now += 1.5
    fallback = _match(producer, request, "a")["a"]
    assert fallback.source == "approximate" and fallback.matched_blocks == 3
    producer.on_kv_events("a", _batch(_stored(TOKENS[:12], [1, 2, 3])))
    assert _match(producer, request, "a")["a"] == PrefixMatch(3, 3, BS, "precise")


def test_a_fully_cached_dispatch_expects_no_event() -> None:
    clock = Clock()
    producer = _producer(clock, confirm_timeout_ms=1000)
    producer.on_kv_events("a", _batch(_stored(TOKENS[:12], [1, 2, 3])))
    request = _request(TOKENS)
    producer.on_dispatch(request, _endpoints("a")[0])
    clock.now += 5
    assert _match(producer, request, "a")["a"].source == "precise"


def test_reset_and_forget_drop_entries() -> None:
    producer = _producer(Clock(), speculative_ttl_ms=0)
    producer.on_kv_events("a", _batch(_stored(TOKENS[:8], [1, 2])))
    producer.on_kv_events("b", _batch(_stored(TOKENS[:8], [1, 2])))
    producer.on_kv_stream_reset("a", "gap")
    producer.forget_endpoint("b")
    matches = _match(producer, _request(TOKENS), "a", "b")
    assert matches["a"] == PrefixMatch(0, 3, BS, "precise") and matches["b"].matched_blocks == 0
    producer.on_kv_events("a", _batch(_stored(TOKENS[:8], [1, 2])))
    producer.reset()
    assert _match(producer, _request(TOKENS), "a")["a"].matched_blocks == 0


def test_the_block_size_comes_from_the_events_first() -> None:
    producer = PrecisePrefixProducer("p", PrecisePrefixParameters(), PluginContext(clock=Clock()))
    producer.on_kv_stream_live("a")
    request = _request(TOKENS)
    assert _match(producer, request, "a")["a"].source == "approximate"  # no block size known yet
    producer.on_kv_events("a", EventBatch(0.0, (BlockStored((1,), None, tuple(TOKENS[:2]), 2),), 0))
    assert _match(producer, request, "a")["a"] == PrefixMatch(1, 7, 2, "precise")
    snapshot = EndpointSnapshot("b", "http://b", block_size=BS)
    producer.on_kv_stream_live("b")
    state = CycleState()
    producer.produce(request, [snapshot], state)
    assert state.get("b", PrefixMatch) == PrefixMatch(0, 3, BS, "precise")


def test_other_media_are_ignored() -> None:
    producer = _producer(Clock())
    producer.on_kv_events("a", _batch(BlockStored((1,), None, tuple(TOKENS[:4]), BS, medium="CPU")))
    assert producer.stats.other_media == 1
    assert _match(producer, _request(TOKENS), "a")["a"].matched_blocks == 0
