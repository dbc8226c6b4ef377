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
