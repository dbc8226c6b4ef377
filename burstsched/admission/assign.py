"""Assignment: each group of a window to endpoints (a pure function).

A group goes to the endpoint its ranking puts first. It stays there up to a cap: ``max_per_endpoint``, and,
when the window holds several shared groups (two or more members each), the fair share
``ceil(requests in shared groups / endpoints) x factor``. Lone requests neither trigger nor widen the fair
share: a few unrelated arrivals in the window must not split a hot burst over replicas that would each
compute its prefix again. The rest
spill to the next endpoint of a fresh ranking (which then computes the prefix once as well). Only when every
ranked endpoint holds a full cap of the group does the cap grow, one request per endpoint at a time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from burstsched.admission.errors import NoEndpointAvailable
from burstsched.admission.grouping import Group


class Role(StrEnum):
    """A request's part in its group: the first on its endpoint, one placed with it, a spilled one, a late
    member that joined its group's endpoint after the group's window (:mod:`.placed_groups`), or one
    scheduled alone (bypass)."""

    LEADER = "leader"
    MEMBER = "member"
    SPILL = "spill"
    JOINED = "joined"
    BYPASS = "bypass"


SHARING_ROLES = frozenset({Role.MEMBER, Role.JOINED})
"""Roles of a request sent where its group's first request (the leader) computes their shared prefix: it
computes only what follows that prefix (a member placed with its window's leader, a late member that joined
its group's endpoint)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Caps on how many requests of one group share one endpoint."""

    max_per_endpoint: int
    fair_share_factor: float | None = None

    def __post_init__(self) -> None:
        if self.max_per_endpoint < 1:
            raise ValueError("max_per_endpoint must be at least 1")
        if self.fair_share_factor is not None and self.fair_share_factor <= 0:
            raise ValueError("fair_share_factor must be positive")


@dataclass(frozen=True, slots=True)
class Slot:
    """Where one request goes: its endpoint, its group's index in placement order, and its role."""

    endpoint: str
    group: int
    role: Role


class Rank(Protocol):
    """Endpoints for ``size`` requests of ``group``, best first, given what the window already placed.

    ``pending`` counts requests of this window placed per endpoint so far; ``used`` holds the endpoints this
    group already occupies (rank them as you see fit; assign skips those at their cap). An endpoint left out
    is not a candidate.
    """

    def __call__(
        self, group: Group, size: int, pending: Mapping[str, int], used: Set[str]
    ) -> Sequence[str]: ...


def group_cap(window_size: int, endpoint_count: int, group_count: int, limits: Limits) -> int:
    """The most requests of one group on one endpoint before the group spills."""
    cap = limits.max_per_endpoint
    if limits.fair_share_factor is not None and group_count > 1 and endpoint_count > 0:
        share = math.ceil(math.ceil(window_size / endpoint_count) * limits.fair_share_factor)
        cap = min(cap, max(1, share))
    return cap


def window_cap(groups: Sequence[Group], endpoint_count: int, limits: Limits) -> int:
    """The cap of every group of this window: the fair share counts shared groups only."""
    shared = [group for group in groups if group.size > 1]
    return group_cap(sum(group.size for group in shared), endpoint_count, len(shared), limits)


def assign(groups: Sequence[Group], rank: Rank, limits: Limits, endpoint_count: int) -> dict[str, Slot]:
    """Place every request of ``groups`` (in the order given), returning request id -> slot."""
    cap = window_cap(groups, endpoint_count, limits)
    pending: dict[str, int] = {}
    slots: dict[str, Slot] = {}
    for index, group in enumerate(groups):
        _place_group(index, group, rank, cap, pending, slots)
    return slots


def _place_group(
    index: int, group: Group, rank: Rank, cap: int, pending: dict[str, int], slots: dict[str, Slot]
) -> None:
    here: dict[str, int] = {}
    members = group.members
    placed = 0
    level = cap
    while placed < len(members):
        remaining = len(members) - placed
        ranked = rank(group, remaining, dict(pending), frozenset(here))
        if not ranked:
            raise NoEndpointAvailable(f"no endpoint for a group of {group.size}")
        target = next((name for name in ranked if here.get(name, 0) < level), None)
        while target is None:
            level += 1
            target = next((name for name in ranked if here.get(name, 0) < level), None)
        run = min(remaining, level - here.get(target, 0))
        first_run = placed == 0
        for offset in range(run):
            if first_run:
                role = Role.LEADER if offset == 0 else Role.MEMBER
            else:
                role = Role.SPILL
            slots[members[placed + offset]] = Slot(endpoint=target, group=index, role=role)
        here[target] = here.get(target, 0) + run
        pending[target] = pending.get(target, 0) + run
        placed += run
