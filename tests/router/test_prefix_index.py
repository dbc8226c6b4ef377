from __future__ import annotations

import random
from collections import OrderedDict

from burstsched_plugins.approx_prefix import ApproxPrefixParameters, ApproxPrefixProducer
from burstsched_plugins.prefix_index import PrefixIndex
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

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
    # a's cache is full by the index's count (5 of 5 blocks); b reported no capacity: its fill is unknown
    assert state.get("a", PrefixMatch) == PrefixMatch(5, 12, 64, fill=1.0)
    assert state.get("b", PrefixMatch) == PrefixMatch(0, 12, 64, fill=None)
    producer.reset()
    assert producer.index.size("a") == 0
    producer.produce(request, [endpoint], state)
    assert state.get("a", PrefixMatch) == PrefixMatch(0, 12, 64, fill=0.0)


def test_unknown_capacity_uses_the_default() -> None:
    producer = ApproxPrefixProducer("p", ApproxPrefixParameters(default_capacity_blocks=3), PluginContext())
    producer.on_dispatch(sched_request(range(10)), EndpointSnapshot("a", "u"))
    assert producer.index.size("a") == 3


# --- the compact implementation against a plain-dict model --------------------------------------------------

EDGE_KEYS = (0, 1, 2, 3, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1)
"""Small ints and the extremes of the 64-bit range: none of them may act as an empty-slot marker."""
keys = st.sampled_from(EDGE_KEYS + tuple(range(4, 16))) | st.integers(0, 2**64 - 1)
chains = st.lists(keys, max_size=10)


class PrefixModel:
    """The old implementation's semantics in plain dicts: per-endpoint LRU, evicted after each add."""

    def __init__(self, default_capacity: int) -> None:
        self.default = default_capacity
        self.capacities: dict[str, int] = {}
        self.lru: dict[str, OrderedDict[int, None]] = {}

    def capacity(self, endpoint: str) -> int:
        return self.capacities.get(endpoint, self.default)

    def set_capacity(self, endpoint: str, blocks: int) -> None:
        self.capacities[endpoint] = max(1, blocks)
        self._evict(endpoint)

    def add(self, endpoint: str, chain: list[int]) -> None:
        lru = self.lru.setdefault(endpoint, OrderedDict())
        for block in reversed(chain):
            lru[block] = None
            lru.move_to_end(block)
        self._evict(endpoint)

    def match(self, chain: list[int], endpoints: list[str]) -> dict[str, int]:
        matched = {}
        for endpoint in endpoints:
            held = self.lru.get(endpoint, OrderedDict())
            depth = 0
            while depth < len(chain) and chain[depth] in held:
                depth += 1
            matched[endpoint] = depth
        return matched

    def size(self, endpoint: str) -> int:
        return len(self.lru.get(endpoint, ()))

    def _evict(self, endpoint: str) -> None:
        lru = self.lru.get(endpoint)
        while lru is not None and len(lru) > self.capacity(endpoint):
            lru.popitem(last=False)


class PrefixIndexMachine(RuleBasedStateMachine):
    """Random add / capacity / remove / clear / match sequences: the index agrees with the model."""

    names: tuple[str, ...] = ("a", "b", "c", "d")

    def __init__(self) -> None:
        super().__init__()
        self.index = PrefixIndex(4)
        self.model = PrefixModel(4)

    @initialize(capacity=st.integers(1, 12))
    def start(self, capacity: int) -> None:
        self.index = PrefixIndex(capacity)
        self.model = PrefixModel(capacity)

    @rule(data=st.data(), chain=chains)
    def add(self, data: st.DataObject, chain: list[int]) -> None:
        endpoint = data.draw(st.sampled_from(self.names))
        self.index.add(endpoint, chain)
        self.model.add(endpoint, chain)

    @rule(data=st.data(), blocks=st.integers(-1, 14))
    def set_capacity(self, data: st.DataObject, blocks: int) -> None:
        endpoint = data.draw(st.sampled_from(self.names))
        self.index.set_capacity(endpoint, blocks)
        self.model.set_capacity(endpoint, blocks)

    @rule(data=st.data())
    def remove_endpoint(self, data: st.DataObject) -> None:
        endpoint = data.draw(st.sampled_from(self.names))
        self.index.remove_endpoint(endpoint)
        self.model.lru.pop(endpoint, None)

    @rule()
    def clear(self) -> None:
        self.index.clear()
        self.model.lru.clear()

    @rule(data=st.data(), chain=chains)
    def match(self, data: st.DataObject, chain: list[int]) -> None:
        endpoints = data.draw(st.lists(st.sampled_from(self.names + ("unknown",)), max_size=6))
        assert self.index.match(chain, endpoints) == self.model.match(chain, endpoints)

    @invariant()
    def agrees_with_the_model(self) -> None:
        for name in self.names:
            assert self.index.size(name) == self.model.size(name) <= self.model.capacity(name)
            assert self.index.capacity(name) == self.model.capacity(name)
        assert self.index.entries() == sum(self.model.size(name) for name in self.names)
        for name in self.names[:2]:
            held = self.model.lru.get(name, OrderedDict())
            for block in EDGE_KEYS:
                assert self.index.holds(name, block) == (block in held)


PrefixIndexMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestPrefixIndexMachine = PrefixIndexMachine.TestCase


class WidePrefixIndexMachine(PrefixIndexMachine):
    """The same with 70 endpoints: ids past 64 are matched without the bitmask fast path."""

    names = tuple(f"e{i}" for i in range(70))

    @rule(chain=chains)
    def add_everywhere(self, chain: list[int]) -> None:
        for endpoint in self.names:
            self.index.add(endpoint, chain)
            self.model.add(endpoint, chain)

    @rule(chain=chains)
    def match_everywhere(self, chain: list[int]) -> None:
        assert self.index.match(chain, self.names) == self.model.match(chain, list(self.names))


WidePrefixIndexMachine.TestCase.settings = settings(max_examples=15, stateful_step_count=30, deadline=None)
TestWidePrefixIndexMachine = WidePrefixIndexMachine.TestCase


def test_lru_order_refreshes_on_add_and_evicts_the_oldest_first() -> None:
    index = PrefixIndex(default_capacity=4)
    index.add("a", [1, 2])  # order, oldest first: 2 1
    index.add("a", [3, 4])  # 2 1 4 3
    index.add("a", [2])  # 1 4 3 2
    index.add("a", [5])  # 1 goes: 4 3 2 5
    assert [b for b in (1, 2, 3, 4, 5) if index.holds("a", b)] == [2, 3, 4, 5]
    index.set_capacity("a", 2)  # 2 5
    assert [b for b in (1, 2, 3, 4, 5) if index.holds("a", b)] == [2, 5]


def test_extreme_hash_values_are_ordinary_keys() -> None:
    index = PrefixIndex(default_capacity=10)
    index.add("a", [0, 2**64 - 1, 0])
    assert index.match([0, 2**64 - 1, 7], ["a", "b"]) == {"a": 2, "b": 0}
    assert index.size("a") == 2
    index.add("b", [2**64 - 1])
    assert index.match([2**64 - 1], ["a", "b"]) == {"a": 1, "b": 1}
    assert index.match([0], ["a", "b"]) == {"a": 1, "b": 0}
    assert index.match([], ["a"]) == {"a": 0}


def test_growth_across_many_resizes_keeps_every_entry_within_the_memory_bound() -> None:
    rng = random.Random(7)
    index = PrefixIndex(default_capacity=1_000_000)
    chains_by_endpoint: dict[str, list[list[int]]] = {"a": [], "b": [], "c": []}
    for i in range(1200):  # 300 000 distinct entries: node pages and every shard grow many times
        chain = [rng.getrandbits(64) for _ in range(250)]
        endpoint = "abc"[i % 3]
        index.add(endpoint, chain)
        chains_by_endpoint[endpoint].append(chain)
    assert index.entries() == 300_000
    assert index.size("a") == index.size("b") == index.size("c") == 100_000
    assert index.nbytes() <= 100 * index.entries()
    for endpoint, added in chains_by_endpoint.items():
        for chain in rng.sample(added, 20):
            assert index.match(chain, ["a", "b", "c"]) == {e: 250 if e == endpoint else 0 for e in "abc"}
    index.set_capacity("b", 10)
    assert index.entries() == 200_010
    assert index.match(chains_by_endpoint["b"][-1], ["b"]) == {"b": 10}


def test_a_removed_endpoint_can_come_back_cold() -> None:
    index = PrefixIndex(default_capacity=100)
    for round_ in range(3):
        index.add("a", list(range(round_, 50)))
        index.remove_endpoint("a")
        assert index.size("a") == 0 and index.entries() == 0
    index.add("a", [1])
    assert index.match([1, 2], ["a"]) == {"a": 1}
