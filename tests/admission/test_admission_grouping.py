"""Grouping: requests sharing enough leading blocks form one group, deterministically."""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from burstsched.admission.grouping import Group, group_requests


def chained(*blocks: int) -> tuple[int, ...]:
    """Chain raw blocks the way the hasher does: block i's hash stands for blocks 0..i."""
    return tuple(hash(("chain", *blocks[: i + 1])) for i in range(len(blocks)))


def shared(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_identical_prompts_group() -> None:
    chain = chained(1, 2, 3, 4, 5, 6)
    groups = group_requests([("a", chain), ("b", chain), ("c", chain)], min_shared_blocks=4)
    assert groups == [Group(members=("a", "b", "c"), prefix=chain)]
    assert groups[0].shared_blocks == 6


def test_shared_system_prompt_with_different_tails_groups() -> None:
    system = (1, 2, 3, 4)
    requests = [("a", chained(*system, 10, 11)), ("b", chained(*system, 20)), ("c", chained(*system, 30, 31))]
    groups = group_requests(requests, min_shared_blocks=4)
    assert len(groups) == 1
    assert sorted(groups[0].members) == ["a", "b", "c"]
    assert groups[0].prefix == chained(*system)


def test_distinct_prefixes_do_not_group() -> None:
    requests = [("a", chained(1, 2, 3, 4, 5)), ("b", chained(6, 7, 8, 9)), ("c", chained(1, 9, 9, 9))]
    groups = group_requests(requests, min_shared_blocks=2)
    assert [g.members for g in groups] == [("a",), ("b",), ("c",)]
    assert groups[0].prefix == chained(1, 2, 3, 4, 5)


@pytest.mark.parametrize(("threshold", "grouped"), [(2, True), (3, True), (4, False)])
def test_min_shared_blocks_threshold(threshold: int, grouped: bool) -> None:
    requests = [("a", chained(1, 2, 3, 4, 5)), ("b", chained(1, 2, 3, 7, 8))]
    groups = group_requests(requests, min_shared_blocks=threshold)
    assert (len(groups) == 1) is grouped
    if grouped:
        assert groups[0].shared_blocks == 3


def test_short_identical_prompts_stay_apart_below_threshold() -> None:
    chain = chained(1)
    groups = group_requests([("a", chain), ("b", chain), ("c", ())], min_shared_blocks=2)
    assert [g.members for g in groups] == [("a",), ("b",), ("c",)]


def test_longer_shared_prefixes_are_placed_first() -> None:
    requests = [
        ("s1", chained(1, 2, 3)),
        ("s2", chained(1, 2, 3)),
        ("s3", chained(1, 2, 3)),
        ("l1", chained(5, 6, 7, 8, 9)),
        ("l2", chained(5, 6, 7, 8, 9, 10)),
        ("lone", chained(4, 4, 4, 4, 4, 4, 4, 4)),
    ]
    groups = group_requests(requests, min_shared_blocks=2)
    assert [g.members for g in groups] == [("l1", "l2"), ("s1", "s2", "s3"), ("lone",)]
    assert [g.shared_blocks for g in groups] == [5, 3, 8]


def test_members_of_a_longer_sub_prefix_stay_adjacent() -> None:
    system = (1, 2)
    requests = [
        ("a", chained(*system, 10, 11)),
        ("b", chained(*system, 20, 21)),
        ("c", chained(*system, 10, 11)),
        ("d", chained(*system, 20, 22)),
        ("e", chained(*system, 20, 21)),
    ]
    (group,) = group_requests(requests, min_shared_blocks=2)
    assert group.members == ("b", "e", "d", "a", "c")


def test_rejects_duplicate_ids_and_bad_threshold() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        group_requests([("a", chained(1)), ("a", chained(2))], min_shared_blocks=1)
    with pytest.raises(ValueError, match="min_shared_blocks"):
        group_requests([], min_shared_blocks=0)


# A few raw block values and short chains, so that requests share prefixes often.
raw_chains = st.lists(st.integers(min_value=0, max_value=2), max_size=7).map(lambda blocks: chained(*blocks))
requests_strategy = st.lists(raw_chains, max_size=14).map(
    lambda chains: [(f"r{i:02d}", chain) for i, chain in enumerate(chains)]
)


@settings(max_examples=150, deadline=None)
@given(
    requests=requests_strategy, threshold=st.integers(min_value=1, max_value=4), seed=st.integers(0, 2**16)
)
def test_grouping_properties(requests: list[tuple[str, tuple[int, ...]]], threshold: int, seed: int) -> None:
    groups = group_requests(requests, threshold)
    chains = dict(requests)

    members = [m for g in groups for m in g.members]
    assert sorted(members) == sorted(chains)

    where = {m: i for i, g in enumerate(groups) for m in g.members}
    for a in chains:
        for b in chains:
            if a != b:
                assert (where[a] == where[b]) == (shared(chains[a], chains[b]) >= threshold)

    for group in groups:
        lcp = min((shared(chains[group.members[0]], chains[m]) for m in group.members), default=0)
        assert group.prefix == chains[group.members[0]][:lcp]
        assert group.size == 1 or group.shared_blocks >= threshold

    keys = [(g.size == 1, -g.shared_blocks, -g.size, min(g.members)) for g in groups]
    assert keys == sorted(keys)

    shuffled = list(requests)
    random.Random(seed).shuffle(shuffled)
    assert group_requests(shuffled, threshold) == groups
