"""Group placement on the scheduler: each group of a sealed window ranked as one request of its size.

For every group the scheduler gets one :class:`SchedRequest` carrying the group's shared prefix as its chain
and the group's (remaining) size as ``group_size``, over snapshots whose ``pending`` holds what this window
already placed on each endpoint. The pure :func:`assign` decides how many members each ranked endpoint takes.

The producers run once per group: the group's rankings for its spills reuse their results (what a producer
knows of a prefix does not depend on how many requests share it), and a request alone in its group reuses
those of admission's bypass check (:class:`Produced`) when the scheduler learned nothing since (no dispatch,
reset, forgotten endpoint or new profile; KV events that reached the precise index meanwhile, at most one
window ago, are not seen).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass

from burstsched.admission.assign import Limits, Role, assign
from burstsched.admission.errors import NoEndpointAvailable
from burstsched.admission.grouping import Group, group_requests
from burstsched.framework import CycleState, Decision, EndpointSnapshot, PrefixMatch, SchedRequest
from burstsched.scheduling import Decider

Snapshots = Callable[[str], Sequence[EndpointSnapshot]]
"""The endpoints serving a model, as the scheduler should see them now."""


@dataclass(frozen=True, slots=True)
class Produced:
    """The producers' results for ``request`` on the endpoints ``names``, at the scheduler's
    ``state_version`` ``version`` (taken by admission's bypass check)."""

    request: SchedRequest
    names: tuple[str, ...]
    state: CycleState
    version: int


@dataclass(frozen=True, slots=True)
class Placed:
    """One request's placement: its decision (chosen endpoint first, then the failover order) and group."""

    decision: Decision
    group: int
    role: Role
    group_size: int
    shared_blocks: int


class GroupPlacer:
    """Places the requests of one window: groups them, ranks each group on the scheduler, assigns them."""

    def __init__(
        self, scheduler: Decider, snapshots: Snapshots, *, min_shared_blocks: int, limits: Limits
    ) -> None:
        self._scheduler = scheduler
        self._snapshots = snapshots
        self._min_shared_blocks = min_shared_blocks
        self._limits = limits

    def place(
        self,
        requests: Sequence[tuple[str, SchedRequest]],
        produced: Mapping[str, Produced] | None = None,
    ) -> dict[str, Placed]:
        """Place ``(ticket, request)`` pairs; groups are numbered in placement order across models.

        ``produced``: producers' results already taken for some requests, by ticket (used while current)."""
        by_model: dict[str, list[tuple[str, SchedRequest]]] = {}
        for ticket, request in requests:
            by_model.setdefault(request.model, []).append((ticket, request))
        placed: dict[str, Placed] = {}
        for model in sorted(by_model):
            placed.update(
                self._place_model(
                    by_model[model], self._snapshots(model), produced or {}, first_group=len(placed)
                )
            )
        return placed

    def _place_model(
        self,
        requests: list[tuple[str, SchedRequest]],
        endpoints: Sequence[EndpointSnapshot],
        produced: Mapping[str, Produced],
        first_group: int,
    ) -> dict[str, Placed]:
        if not endpoints:
            raise NoEndpointAvailable(f"no endpoint serves model {requests[0][1].model!r}")
        by_ticket = dict(requests)
        groups = group_requests(
            ((ticket, request.block_hashes) for ticket, request in requests), self._min_shared_blocks
        )
        calls: dict[Group, list[tuple[int, Decision]]] = {}
        loaded = {
            e.name: (0, e) for e in endpoints
        }  # snapshots with this window's pending, rebuilt on change
        names = tuple(e.name for e in endpoints)
        states: dict[Group, CycleState] = {}  # each group's producers' results, for all its rankings

        def rank(group: Group, size: int, pending: Mapping[str, int], used: Set[str]) -> Sequence[str]:
            leader = by_ticket[group.members[0]]
            prefix = leader.block_hashes[: group.shared_blocks]
            as_one = dataclasses.replace(leader, block_hashes=prefix, group_size=size)
            for e in endpoints:
                added = pending.get(e.name, 0)
                if loaded[e.name][0] != added:
                    loaded[e.name] = (added, dataclasses.replace(e, pending=e.pending + added))
            state = states.get(group)
            if state is None:
                state = self._produced(group, produced, names)
                if state is None:
                    state = self._scheduler.produce(as_one, endpoints)
                states[group] = state
            decision = self._scheduler.schedule(
                as_one, [snapshot for _, snapshot in loaded.values()], produced=state
            )
            calls.setdefault(group, []).append((size, decision))
            return [scored.name for scored in decision.ranked]

        slots = assign(groups, rank, self._limits, len(endpoints))
        placed: dict[str, Placed] = {}
        for index, group in enumerate(groups):
            for position, ticket in enumerate(group.members):
                slot = slots[ticket]
                decision = _decision_at(calls[group], group.size - position)
                placed[ticket] = Placed(
                    decision=first(decision, slot.endpoint),
                    group=first_group + index,
                    role=slot.role,
                    group_size=group.size,
                    shared_blocks=group.shared_blocks,
                )
        return placed

    def _produced(
        self, group: Group, produced: Mapping[str, Produced], names: tuple[str, ...]
    ) -> CycleState | None:
        """The bypass check's results for a request alone in its group, while the scheduler learned nothing
        since and the endpoints are the same."""
        if group.size != 1:
            return None
        taken = produced.get(group.members[0])
        if taken is None or taken.names != names or taken.version != self._scheduler.state_version:
            return None
        return taken.state


def _decision_at(calls: list[tuple[int, Decision]], remaining: int) -> Decision:
    """The ranking that placed the member with ``remaining`` members left (itself included)."""
    chosen = calls[0][1]
    for size, decision in calls:
        if size >= remaining:
            chosen = decision
    return chosen


def first(decision: Decision, endpoint: str) -> Decision:
    """The decision reordered so ``endpoint`` comes first, the others kept in their order."""
    if decision.ranked[0].name == endpoint:
        return decision
    head = [s for s in decision.ranked if s.name == endpoint]
    return Decision((*head, *(s for s in decision.ranked if s.name != endpoint)), decision.matches)


def warm_blocks(produced: CycleState, endpoints: Sequence[EndpointSnapshot]) -> dict[str, int]:
    """Leading blocks of the request each endpoint holds, from the producers' state (0 if none says)."""
    matches = {e.name: produced.get(e.name, PrefixMatch) for e in endpoints}
    return {name: match.matched_blocks if match is not None else 0 for name, match in matches.items()}
