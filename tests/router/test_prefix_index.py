from __future__ import annotations

from burstsched_plugins.approx_prefix import ApproxPrefixParameters, ApproxPrefixProducer
from burstsched_plugins.prefix_index import PrefixIndex
from hypothesis import given, settings
from hypothesis import strategies as st

from burstsched.framework import CycleState, EndpointSnapshot, PluginContext, PrefixMatch

from .helpers import sched_request


def test_match_is_contiguous_from_block_zero() -> None:
    index = PrefixIndex(default_capacity=100)
    index.add("a", [1, 2, 3, 4])
    index.add("b", [1, 2, 9])
    assert index.match([1, 2, 3, 4, 5], ["a", "b", "c"]) == {"a": 4, "b": 2, "c": 0}
    assert index.match([7, 2, 3], ["a", "b"]) == {"a": 0, "b": 0}


def test_capacity_bound_evicts_least_recent_blocks_keeping_chain_heads() -> None:
    index = PrefixIndex(default_capacity=4)
    index.add("a", [1, 2, 3])
    index.add("a", [10, 11, 12])
    assert index.size("a") == 4
    assert index.match([10, 11, 12], ["a"]) == {"a": 3}
    assert index.match([1, 2, 3], ["a"]) == {"a": 1}  # the first chain's head survived its tail


def test_shrinking_capacity_evicts_at_once() -> None:
    index = PrefixIndex(default_capacity=10)
    index.add("a", list(range(10)))
    index.set_capacity("a", 3)
    assert index.size("a") == 3
    assert index.match(list(range(10)), ["a"]) == {"a": 3}


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 20),
    ops=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.lists(st.integers(0, 40), max_size=12)), max_size=30
    ),
)
def test_index_never_exceeds_capacity_and_stays_consistent(
    capacity: int, ops: list[tuple[str, list[int]]]
) -> None:
    index = PrefixIndex(default_capacity=capacity)
    for endpoint, chain in ops:
        index.add(endpoint, chain)
        for name in "abc":
            assert index.size(name) <= capacity
    # the hash → endpoints map (used by match) agrees with each endpoint's own LRU set
    for block in range(41):
        matched = index.match([block], ["a", "b", "c"])
        for name in "abc":
            assert (matched[name] == 1) == index.holds(name, block)


def test_producer_bounds_index_by_reported_capacity_and_resets() -> None:
    producer = ApproxPrefixProducer(
        "p", ApproxPrefixParameters(default_capacity_blocks=1000), PluginContext()
    )
    # 20 GPU blocks of 16 tokens = 320 tokens = 5 pseudo blocks of 64
    endpoint = EndpointSnapshot("a", "u", block_size=16, num_gpu_blocks=20)
    request = sched_request(range(100, 112))
    producer.on_dispatch(request, endpoint)
    assert producer.index.size("a") == 5
    state = CycleState()
    producer.produce(request, [endpoint, EndpointSnapshot("b", "u")], state)
    assert state.get("a", PrefixMatch) == PrefixMatch(5, 12, 64)
    assert state.get("b", PrefixMatch) == PrefixMatch(0, 12, 64)
    producer.reset()
    assert producer.index.size("a") == 0


def test_unknown_capacity_uses_the_default() -> None:
    producer = ApproxPrefixProducer("p", ApproxPrefixParameters(default_capacity_blocks=3), PluginContext())
    producer.on_dispatch(sched_request(range(10)), EndpointSnapshot("a", "u"))
    assert producer.index.size("a") == 3
