"""The precise index (engine hash → router hash per endpoint) against a plain-dict model; its edge cases."""

from __future__ import annotations

import random
import subprocess
import sys
from collections import OrderedDict

import pytest
from burstsched_plugins.precise_index import PreciseIndex
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

EDGE = (0, 1, 2**63, 2**64 - 1)
engine_hashes = st.sampled_from(EDGE + tuple(range(2, 14))) | st.integers(0, 2**64 - 1)
router_hashes = st.sampled_from(EDGE + (5, 6, 7))
"""Few router hashes, so that two engine hashes of one endpoint often name the same one."""
stores = st.lists(st.tuples(engine_hashes, router_hashes), max_size=8)
KERNELS = ("touch", "evict", "remove", "find", "match", "rehash")


class PreciseModel:
    """Per endpoint an OrderedDict engine → router hash, least recently stored first."""

    def __init__(self, default_capacity: int) -> None:
        self.default = default_capacity
        self.capacities: dict[str, int] = {}
        self.blocks: dict[str, OrderedDict[int, int]] = {}
        self.overflow: dict[str, int] = {}

    def capacity(self, endpoint: str) -> int:
        return self.capacities.get(endpoint, self.default)

    def set_capacity(self, endpoint: str, blocks: int) -> None:
        self.capacities[endpoint] = max(1, blocks)
        self._evict(endpoint)

    def store(self, endpoint: str, pairs: list[tuple[int, int]]) -> None:
        held = self.blocks.setdefault(endpoint, OrderedDict())
        for engine, router in reversed(pairs):  # tail first: the chain's head ends freshest
            held[engine] = router
            held.move_to_end(engine)
        self._evict(endpoint)

    def remove(self, endpoint: str, engines: list[int]) -> int:
        held = self.blocks.get(endpoint, OrderedDict())
        return sum(held.pop(engine, None) is not None for engine in engines)

    def match(self, chain: list[int], endpoints: list[str]) -> dict[str, int]:
        matched = {}
        for endpoint in endpoints:
            routers = set(self.blocks.get(endpoint, {}).values())
            depth = 0
            while depth < len(chain) and chain[depth] in routers:
                depth += 1
            matched[endpoint] = depth
        return matched

    def size(self, endpoint: str) -> int:
        return len(self.blocks.get(endpoint, ()))

    def _evict(self, endpoint: str) -> None:
        held = self.blocks.get(endpoint)
        while held is not None and len(held) > self.capacity(endpoint):
            held.popitem(last=False)
            self.overflow[endpoint] = self.overflow.get(endpoint, 0) + 1


class PreciseIndexMachine(RuleBasedStateMachine):
    """Random store / remove / clear / capacity / match sequences: the index agrees with the model."""

    names: tuple[str, ...] = ("a", "b", "c")

    def __init__(self) -> None:
        super().__init__()
        self.index = PreciseIndex(6)
        self.model = PreciseModel(6)

    @initialize(capacity=st.integers(1, 12))
    def start(self, capacity: int) -> None:
        self.index = PreciseIndex(capacity)
        self.model = PreciseModel(capacity)

    def _endpoint(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from(self.names))

    @rule(data=st.data(), pairs=stores)
    def store(self, data: st.DataObject, pairs: list[tuple[int, int]]) -> None:
        endpoint = self._endpoint(data)
        self.index.store(endpoint, [e for e, _ in pairs], [r for _, r in pairs])
        self.model.store(endpoint, pairs)

    @rule(data=st.data(), engines=st.lists(engine_hashes, max_size=6))
    def remove(self, data: st.DataObject, engines: list[int]) -> None:
        endpoint = self._endpoint(data)
        assert self.index.remove(endpoint, engines) == self.model.remove(endpoint, engines)

    @rule(data=st.data())
    def remove_held(self, data: st.DataObject) -> None:
        endpoint = self._endpoint(data)
        held = list(self.model.blocks.get(endpoint, {}))
        if held:
            engines = data.draw(st.lists(st.sampled_from(held), min_size=1, max_size=4))
            assert self.index.remove(endpoint, engines) == self.model.remove(endpoint, engines)

    @rule(data=st.data(), blocks=st.integers(-1, 14))
    def set_capacity(self, data: st.DataObject, blocks: int) -> None:
        endpoint = self._endpoint(data)
        self.index.set_capacity(endpoint, blocks)
        self.model.set_capacity(endpoint, blocks)

    @rule(data=st.data())
    def clear_endpoint(self, data: st.DataObject) -> None:
        endpoint = self._endpoint(data)
        self.index.clear_endpoint(endpoint)
        self.model.blocks.pop(endpoint, None)

    @rule()
    def clear(self) -> None:
        self.index.clear()
        self.model.blocks.clear()

    @rule(data=st.data(), chain=st.lists(router_hashes, max_size=6))
    def match(self, data: st.DataObject, chain: list[int]) -> None:
        endpoints = data.draw(st.lists(st.sampled_from(self.names + ("unknown",)), max_size=5))
        assert self.index.match(chain, endpoints) == self.model.match(chain, endpoints)

    @invariant()
    def agrees_with_the_model(self) -> None:
        for name in self.names:
            assert self.index.size(name) == self.model.size(name) <= self.model.capacity(name)
            assert self.index.overflow_evictions(name) == self.model.overflow.get(name, 0)
            for engine, router in list(self.model.blocks.get(name, {}).items())[:4]:
                assert self.index.router_hash(name, engine) == router
            for router in EDGE:
                assert self.index.match([router], [name]) == self.model.match([router], [name])
        assert self.index.entries() == sum(self.model.size(name) for name in self.names)
        assert self.index.endpoints() == sorted(n for n in self.names if self.model.size(n))


PreciseIndexMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
TestPreciseIndexMachine = PreciseIndexMachine.TestCase


class WidePreciseIndexMachine(PreciseIndexMachine):
    """The same over 70 endpoints, so that some have no mask bit (ids past 64)."""

    names = tuple(f"e{i}" for i in range(70))

    @rule(pairs=stores)
    def store_everywhere(self, pairs: list[tuple[int, int]]) -> None:
        for endpoint in self.names:
            self.index.store(endpoint, [e for e, _ in pairs], [r for _, r in pairs])
            self.model.store(endpoint, pairs)

    @rule(chain=st.lists(router_hashes, max_size=6))
    def match_everywhere(self, chain: list[int]) -> None:
        assert self.index.match(chain, self.names) == self.model.match(chain, list(self.names))


WidePreciseIndexMachine.TestCase.settings = settings(max_examples=15, stateful_step_count=30, deadline=None)
TestWidePreciseIndexMachine = WidePreciseIndexMachine.TestCase


@pytest.mark.parametrize("endpoint_count", [1, 70])
def test_two_engine_hashes_with_one_router_hash_stay_matched_until_both_go(endpoint_count: int) -> None:
    index = PreciseIndex(default_capacity=100)
    names = [f"e{i}" for i in range(endpoint_count)]
    for name in names:
        index.store(name, [10, 11], [1, 2])
    last = names[-1]  # with 70 endpoints, one without a mask bit
    index.store(last, [20], [1])
    assert index.size(last) == 3
    assert index.remove(last, [10]) == 1
    assert index.match([1, 2], [last]) == {last: 2}
    assert index.remove(last, [20, 20, 99]) == 1
    assert index.match([1, 2], [last]) == {last: 0}
    assert index.router_hash(last, 11) == 2 and index.router_hash(last, 10) is None


def test_storing_a_known_engine_hash_refreshes_it_and_takes_its_new_router_hash() -> None:
    index = PreciseIndex(default_capacity=2)
    index.store("a", [1, 2], [100, 200])  # stored tail first: 2, then 1 (freshest)
    index.store("a", [2], [201])  # refreshed: 1, 2
    assert index.router_hash("a", 2) == 201
    assert index.match([100], ["a"]) == {"a": 1} and index.match([200], ["a"]) == {"a": 0}
    index.store("a", [3], [300])  # 1 is the least recently stored
    assert index.router_hash("a", 1) is None and index.overflow_evictions("a") == 1
    assert index.endpoints() == ["a"]


def test_extreme_hashes_on_both_sides() -> None:
    index = PreciseIndex(default_capacity=10)
    index.store("a", [0, 2**64 - 1], [2**64 - 1, 0])
    assert index.router_hash("a", 0) == 2**64 - 1 and index.router_hash("a", 2**64 - 1) == 0
    assert index.match([2**64 - 1, 0, 5], ["a"]) == {"a": 2}
    assert index.remove("a", [0, 2**64 - 1]) == 2
    assert index.entries() == 0 and index.endpoints() == []


def test_engine_hashes_outside_the_unsigned_range_wrap() -> None:
    index = PreciseIndex(default_capacity=10)
    index.store("a", [-1], [7])
    assert index.router_hash("a", 2**64 - 1) == 7


def test_lengths_must_agree() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        PreciseIndex(10).store("a", [1, 2], [1])
    with pytest.raises(ValueError, match="at least 1"):
        PreciseIndex(0)


def test_growth_and_memory_bound_with_chained_stores() -> None:
    rng = random.Random(3)
    index = PreciseIndex(default_capacity=60_000)
    endpoints = [f"e{i}" for i in range(8)]
    kept: list[tuple[str, list[int], list[int]]] = []
    for i in range(1600):  # 200 000 entries in 125-block events
        engine = [rng.getrandbits(64) for _ in range(125)]
        router = [rng.getrandbits(64) for _ in range(125)]
        index.store(endpoints[i % 8], engine, router)
        kept.append((endpoints[i % 8], engine, router))
    assert index.entries() == 200_000
    assert index.nbytes() <= 100 * index.entries()
    for endpoint, engine, router in rng.sample(kept, 30):
        assert index.match(router, endpoints)[endpoint] == 125
        assert index.router_hash(endpoint, engine[-1]) == router[-1]
    endpoint, engine, router = kept[0]
    assert index.remove(endpoint, engine[:50]) == 50
    assert index.match(router, [endpoint]) == {endpoint: 0}
    assert index.match(router[50:], [endpoint]) == {endpoint: 75}


def test_kernels_are_compiled_when_an_index_is_built() -> None:
    """In a fresh interpreter (this one may have compiled them already): none is left to the first call."""
    script = (
        "from burstsched_plugins.blocktable import kernels\n"
        "from burstsched_plugins.precise_index import PreciseIndex\n"
        "PreciseIndex(default_capacity=10)\n"
        f"print(sorted(name for name in {KERNELS!r} if not getattr(kernels, name).signatures))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=90, check=True
    )
    assert done.stdout.strip() == "[]"
