"""The compact core under the prefix indexes: chunked freeing of dropped endpoints, argument checks."""

from __future__ import annotations

import pytest
from burstsched_plugins.blocktable import BlockTable, as_keys


def test_a_dropped_endpoint_vanishes_at_once_and_is_freed_one_chunk_per_call() -> None:
    table = BlockTable(10_000, with_values=False, drain_chunk=100)
    table.touch("a", list(range(1000)))
    table.touch("b", [5, 6])
    table.drop_endpoint("a")
    assert table.size("a") == 0 and table.entries() == 2 and table.pending_drain() == 900
    assert table.match([0, 1], ["a", "b"]) == {"a": 0, "b": 0}
    table.touch("a", [0, 1])  # back under a fresh id while its old entries are still being freed
    assert table.pending_drain() == 800
    assert table.match([0, 1, 2], ["a"]) == {"a": 2}
    for _ in range(8):
        table.remove("b", [99])
    assert table.pending_drain() == 0
    assert table.entries() == 4 and table.endpoints() == ["a", "b"]


def test_keys_wrap_modulo_two_to_the_64() -> None:
    assert as_keys([-1, 0, 2**64 - 1]).tolist() == [2**64 - 1, 0, 2**64 - 1]


def test_values_go_with_tables_that_store_them_only() -> None:
    with pytest.raises(ValueError, match="pass values"):
        BlockTable(4, with_values=True).touch("a", [1])
    with pytest.raises(ValueError, match="pass no values"):
        BlockTable(4, with_values=False).touch("a", [1], [2])
    with pytest.raises(ValueError, match="differ in length"):
        BlockTable(4, with_values=True).touch("a", [1], [2, 3])
    with pytest.raises(ValueError, match="drain_chunk"):
        BlockTable(4, with_values=True, drain_chunk=0)


def test_clear_swaps_storage_at_once_and_returns_the_old_arrays_over_later_calls() -> None:
    table = BlockTable(1_000_000, with_values=False)
    table.touch("a", list(range(500_000)))
    held = table.nbytes()
    table.clear()
    assert table.entries() == 0 and table.match([0], ["a"]) == {"a": 0}
    fresh = BlockTable(1_000_000, with_values=False, warm=False).nbytes()
    assert table.nbytes() > held // 2  # most of the old arrays are still waiting
    for key in range(10):
        table.touch("b", [key])
    assert table.nbytes() < fresh + 2**20


def test_repeated_lookups_see_endpoints_come_and_go_and_lists_change() -> None:
    """match keeps the ids of the endpoint lists it was asked about, touch and match the last tuple's keys:
    neither may outlive an endpoint's id or a list's contents."""
    table = BlockTable(100, with_values=False)
    chain = (1, 2, 3)
    assert table.match(chain, ["a", "b"]) == {"a": 0, "b": 0}  # neither known yet
    table.touch("b", chain)
    assert table.match(chain, ["a", "b"]) == {"a": 0, "b": 3}
    table.touch("a", chain[:1])
    assert table.match(chain, ["a", "b"]) == {"a": 1, "b": 3}
    table.drop_endpoint("b")
    table.touch("c", chain)  # may take b's freed id
    assert table.match(chain, ["a", "b"]) == {"a": 1, "b": 0}
    assert table.match(chain, ["c", "a"]) == {"c": 3, "a": 1}
    keys = [7, 8]
    table.touch("a", keys)
    keys[1] = 9  # a list is read again on every call
    assert table.match(keys, ["a"]) == {"a": 1}
    assert table.match((7, 8), ["a"]) == {"a": 2}


def test_a_chain_within_its_endpoints_capacity_evicts_nothing_and_one_past_it_evicts_the_oldest() -> None:
    table = BlockTable(4, with_values=False)
    assert table.touch("a", (1, 2, 3)) == 0
    assert table.touch("a", (1, 2, 3)) == 0  # refreshed, not grown
    assert table.touch("a", (1, 2, 3, 4, 5)) == 1
    assert table.size("a") == 4
    assert table.match((1, 2, 3, 4, 5), ["a"]) == {"a": 4}  # the chain's tail went: it was touched first
