"""Placed groups: where each window's groups went, until the prefix index can tell.

A window's placement reaches the prefix index only when a stream's response head comes back from its
replica (the approximate index) or its KV events arrive (the precise one): a few to tens of milliseconds
later, longer while the replica's front end is busy with other traffic. A burst member that reaches
admission in that gap, after its window sealed, finds its prefix warm nowhere; placed as a new cold group,
by load, it went to another replica, which computed the whole prefix again. This table remembers, for
``hold_s`` after each window, which endpoint every group was placed on, so that such a late member joins
its group instead.

Groups are the requests with equal first ``min_shared_blocks`` block hashes (see :mod:`.grouping`), and
block hashes are chained, so one dictionary keyed by a chain's hash at block ``min_shared_blocks - 1`` finds
a request's group, and comparing one hash tells whether it shares the group's first ``n`` blocks.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from burstsched.admission.grouping import shared_blocks


@dataclass(slots=True)
class PlacedGroup:
    """One group of a sealed window: its shared chain, its endpoint, how many requests went there."""

    group_id: str
    prefix: tuple[Hashable, ...]
    endpoint: str
    members: int
    expires_at: float

    def shared_with(self, chain: Sequence[Hashable]) -> int:
        """How many leading blocks ``chain`` shares with the group's prefix."""
        return shared_blocks(self.prefix, chain)


class PlacedGroups:
    """The groups placed in the last ``hold_s`` seconds, by the hash that keys their group."""

    def __init__(self, min_shared_blocks: int, hold_s: float) -> None:
        if min_shared_blocks < 1:
            raise ValueError("min_shared_blocks must be at least 1")
        self._key_at = min_shared_blocks - 1
        self._hold_s = hold_s
        self._groups: dict[Hashable, PlacedGroup] = {}
        self._sweep_at = 64

    @property
    def enabled(self) -> bool:
        return self._hold_s > 0

    def __len__(self) -> int:
        return len(self._groups)

    def record(
        self, group_id: str, prefix: Sequence[Hashable], endpoint: str, members: int, now: float
    ) -> None:
        """Remember that ``members`` requests of the group sharing ``prefix`` went to ``endpoint``; a later
        placement of the same group replaces an earlier one."""
        if self._hold_s <= 0 or len(prefix) <= self._key_at:
            return
        key = prefix[self._key_at]
        self._groups[key] = PlacedGroup(group_id, tuple(prefix), endpoint, members, now + self._hold_s)
        if len(self._groups) >= self._sweep_at:
            self._sweep(now)

    def find(self, chain: Sequence[Hashable], now: float) -> tuple[PlacedGroup, int] | None:
        """The live group ``chain`` belongs to and how many leading blocks it shares with it, if any."""
        if not self._groups or len(chain) <= self._key_at:
            return None
        group = self._groups.get(chain[self._key_at])
        if group is None:
            return None
        if group.expires_at <= now:
            del self._groups[chain[self._key_at]]
            return None
        return group, group.shared_with(chain)

    def clear(self) -> None:
        self._groups.clear()

    def _sweep(self, now: float) -> None:
        """Drop expired groups; the next sweep waits until the table has doubled (amortised O(1))."""
        self._groups = {k: g for k, g in self._groups.items() if g.expires_at > now}
        self._sweep_at = max(64, 2 * len(self._groups))
