"""Assignment: one endpoint per group, bounded spill, distinct groups spread."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence, Set

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from burstsched.admission.assign import Limits, Role, Slot, assign, group_cap, window_cap
from burstsched.admission.errors import NoEndpointAvailable
from burstsched.admission.grouping import Group


def make_group(name: str, size: int, prefix: tuple[int, ...] = (1,)) -> Group:
    return Group(members=tuple(f"{name}{i}" for i in range(size)), prefix=prefix)


class LeastLoaded:
    """Ranks endpoints by base load plus what the window placed, with an optional warm endpoint per group.

    Records every call so tests can check what assign told it.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        base: Mapping[str, int] | None = None,
        warm: Mapping[Group, str] | None = None,
    ) -> None:
        self.endpoints = list(endpoints)
        self.base = dict(base or {})
        self.warm = dict(warm or {})
        self.calls: list[tuple[Group, int, dict[str, int], frozenset[str]]] = []

    def __call__(self, group: Group, size: int, pending: Mapping[str, int], used: Set[str]) -> Sequence[str]:
        self.calls.append((group, size, dict(pending), frozenset(used)))

        def key(name: str) -> tuple[bool, int, int]:
            warm = self.warm.get(group) == name
            return (not warm, self.base.get(name, 0) + pending.get(name, 0), self.endpoints.index(name))

        return sorted(self.endpoints, key=key)


def per_endpoint(slots: Mapping[str, Slot], group: Group) -> Counter[str]:
    return Counter(slots[m].endpoint for m in group.members)


def test_a_group_fitting_its_cap_goes_to_one_endpoint_with_one_leader() -> None:
    group = make_group("g", 5)
    slots = assign([group], LeastLoaded(["e1", "e2"], base={"e1": 3}), Limits(max_per_endpoint=8), 2)
    assert per_endpoint(slots, group) == {"e2": 5}
    assert [slots[m].role for m in group.members] == [Role.LEADER] + [Role.MEMBER] * 4
    assert {slots[m].group for m in group.members} == {0}


def test_a_hot_group_spills_past_max_per_endpoint_to_the_next_best() -> None:
    group = make_group("g", 10)
    rank = LeastLoaded(["e1", "e2", "e3"], base={"e1": 0, "e2": 100, "e3": 50})
    slots = assign([group], rank, Limits(max_per_endpoint=4), 3)
    assert per_endpoint(slots, group) == {"e1": 4, "e3": 4, "e2": 2}
    roles = [slots[m].role for m in group.members]
    assert roles == [Role.LEADER] + [Role.MEMBER] * 3 + [Role.SPILL] * 6
    # The second ranking is asked for the rest only, with the first run already counted as pending.
    assert [(size, pending, used) for _, size, pending, used in rank.calls] == [
        (10, {}, frozenset()),
        (6, {"e1": 4}, frozenset({"e1"})),
        (2, {"e1": 4, "e3": 4}, frozenset({"e1", "e3"})),
    ]


def test_a_group_larger_than_all_caps_is_spread_evenly() -> None:
    group = make_group("g", 10)
    slots = assign([group], LeastLoaded(["e1", "e2", "e3"]), Limits(max_per_endpoint=2), 3)
    assert per_endpoint(slots, group) == {"e1": 4, "e2": 3, "e3": 3}


def test_fair_share_spills_a_hot_group_when_the_window_holds_others() -> None:
    hot, other = make_group("h", 6, (1,)), make_group("o", 2, (2,))
    slots = assign(
        [hot, other], LeastLoaded(["e1", "e2"]), Limits(max_per_endpoint=32, fair_share_factor=1.0), 2
    )
    assert group_cap(8, 2, 2, Limits(32, 1.0)) == 4
    assert per_endpoint(slots, hot) == {"e1": 4, "e2": 2}
    assert per_endpoint(slots, other) == {"e2": 2}


def test_a_lone_group_is_not_bound_by_fair_share() -> None:
    group = make_group("g", 8)
    slots = assign([group], LeastLoaded(["e1", "e2", "e3", "e4"]), Limits(32, fair_share_factor=1.0), 4)
    assert per_endpoint(slots, group) == {"e1": 8}


def test_distinct_groups_spread_and_warm_groups_go_to_their_replica() -> None:
    groups = [make_group(name, 3, (i,)) for i, name in enumerate("abcd")]
    warm = {groups[2]: "e1"}
    slots = assign(groups, LeastLoaded(["e1", "e2", "e3", "e4"], warm=warm), Limits(8), 4)
    targets = [per_endpoint(slots, g) for g in groups]
    assert all(len(t) == 1 for t in targets)
    assert [next(iter(t)) for t in targets] == ["e1", "e2", "e1", "e3"]


def test_no_ranked_endpoint_raises() -> None:
    def nowhere(group: Group, size: int, pending: Mapping[str, int], used: Set[str]) -> Sequence[str]:
        return []

    with pytest.raises(NoEndpointAvailable):
        assign([make_group("g", 2)], nowhere, Limits(4), 0)


def test_limits_validate() -> None:
    with pytest.raises(ValueError, match="max_per_endpoint"):
        Limits(0)
    with pytest.raises(ValueError, match="fair_share_factor"):
        Limits(4, 0.0)


@st.composite
def windows(draw: st.DrawFn) -> tuple[list[Group], list[str], dict[str, int], Limits]:
    endpoints = [f"e{i}" for i in range(draw(st.integers(1, 5)))]
    sizes = draw(st.lists(st.integers(1, 12), min_size=1, max_size=6))
    groups = [make_group(f"g{i}.", size, (i,)) for i, size in enumerate(sizes)]
    base = {name: draw(st.integers(0, 20)) for name in endpoints}
    factor = draw(st.none() | st.floats(1.0, 3.0))
    return groups, endpoints, base, Limits(draw(st.integers(1, 10)), factor)


@settings(max_examples=200, deadline=None)
@given(window=windows())
def test_assignment_properties(window: tuple[list[Group], list[str], dict[str, int], Limits]) -> None:
    groups, endpoints, base, limits = window
    rank = LeastLoaded(endpoints, base=base)
    slots = assign(groups, rank, limits, len(endpoints))
    cap = window_cap(groups, len(endpoints), limits)

    assert sorted(slots) == sorted(m for g in groups for m in g.members)
    assert all(slot.endpoint in endpoints for slot in slots.values())

    for index, group in enumerate(groups):
        counts = per_endpoint(slots, group)
        # Never past the cap while another endpoint still has room for this group.
        if max(counts.values()) > cap:
            assert all(counts.get(name, 0) >= cap for name in endpoints)
        # Kept together unless it spills; a spill uses no more endpoints than it needs.
        assert len(counts) == min(len(endpoints), math.ceil(group.size / cap))
        roles = Counter(slots[m].role for m in group.members)
        first_run = min(group.size, cap)
        assert roles == Counter(
            {Role.LEADER: 1, Role.MEMBER: first_run - 1, Role.SPILL: group.size - first_run}
        )
        assert all(slots[m].group == index for m in group.members)
    # The ranking was told exactly what this window had placed before each call.
    running: Counter[str] = Counter()
    for i, (group, size, pending, used) in enumerate(rank.calls):
        assert pending == {name: count for name, count in running.items() if count}
        nxt = rank.calls[i + 1] if i + 1 < len(rank.calls) else None
        run = size - nxt[1] if nxt is not None and nxt[0] == group else size
        chunk = group.members[group.size - size : group.size - size + run]
        (target,) = {slots[m].endpoint for m in chunk}
        assert used == {slots[m].endpoint for m in group.members[: group.size - size]}
        running[target] += run
    assert sum(running.values()) == len(slots)


def test_lone_requests_do_not_split_a_hot_burst() -> None:
    """Unrelated single requests in the window neither trigger nor shrink the fair share."""
    burst = make_group("b.", 32, (1,))
    lone = [make_group(f"s{i}.", 1, (10 + i,)) for i in range(3)]
    endpoints = ["e0", "e1", "e2", "e3"]
    slots = assign([burst, *lone], LeastLoaded(endpoints), Limits(32, 2.0), len(endpoints))
    assert len(per_endpoint(slots, burst)) == 1
    two_bursts = [burst, make_group("c.", 32, (2,))]
    slots = assign(two_bursts, LeastLoaded(endpoints), Limits(64, 1.0), len(endpoints))
    assert len(per_endpoint(slots, burst)) == 2  # two hot groups on four endpoints: cap 16 each
