"""Per-priority dispatch ceilings: how much of the pool's room a band may use while a higher band waits.

As llm-d's usage limit policies do it: once per release pass the waiting bands (highest first) get one
ceiling each, monotonically non-increasing; a band dispatches only while the pool's saturation is below its
ceiling, and the pass stops at the first band held (so lower bands never overtake it). Held requests stay
queued (their TTL still runs). Here the pool's saturation is the share of the healthy endpoints' room in use
(:meth:`~burstsched.flow.headroom.Room.used`, averaged), re-read as the pass hands out room.

- ``priority-holdback``: fixed ceilings from ``max_ceiling`` (highest band) to ``min_ceiling`` (lowest),
  evenly by rank, or in proportion to the priority values (``domain: value``); a band waiting alone gets
  ``max_ceiling``.
- ``soft-reflective``: band ``i`` of ``N`` has the reflective ceiling ``1 - i x saturation / (N - 1)``
  (the highest band 1.0); a band below it is open; at saturation 1.0 the others are closed; otherwise the
  band is opened on one pass in ``round(saturation / (1 - saturation))``, all such bands on the same passes
  (one shared tick, advanced once per pass that has one).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from burstsched.config.flow_control import CeilingConfig
from burstsched.flow.headroom import Room


def holdback_ceilings(priorities: Sequence[int], config: CeilingConfig) -> list[float]:
    """``priority-holdback``'s ceilings for ``priorities`` (highest first)."""
    n = len(priorities)
    high, low = config.max_ceiling, config.min_ceiling
    if n == 1:
        return [high]
    if config.domain == "value":
        top, bottom = priorities[0], priorities[-1]
        if top == bottom:
            return [high] * n
        return [low + (p - bottom) / (top - bottom) * (high - low) for p in priorities]
    return [high - i * (high - low) / (n - 1) for i in range(n)]


def reflective_ceilings(saturation: float, n: int, open_tick: bool) -> list[float]:
    """``soft-reflective``'s ceilings for ``n`` bands at ``saturation``; ``open_tick``: this pass opens the
    bands at or past their reflective ceiling."""
    if n <= 1:
        return [1.0] * n
    out = [1.0]
    for i in range(1, n):
        if saturation < 1.0 - i * saturation / (n - 1):
            out.append(1.0)
        elif saturation >= 1.0:
            out.append(0.0)
        else:
            out.append(1.0 if open_tick else 0.0)
    return out


def reflective_period(saturation: float) -> int:
    """How many passes a band past its reflective ceiling waits for one open pass."""
    return max(1, round(saturation / (1.0 - saturation + 1e-9)))


def pool_saturation(rooms: Iterable[Room]) -> float:
    """The share of the pool's room in use: the mean of its healthy endpoints' ``rooms`` (1.0 with none)."""
    used = [room.used() for room in rooms]
    return sum(used) / len(used) if used else 1.0


class Ceilings:
    """One policy instance (it keeps the soft-reflective tick)."""

    def __init__(self, config: CeilingConfig) -> None:
        self._config = config
        self._tick = 0

    def compute(self, saturation: float, priorities: Sequence[int]) -> dict[int, float]:
        """Each waiting band's ceiling this pass (``priorities`` highest first)."""
        if not priorities:
            return {}
        if self._config.policy == "priority-holdback":
            ceilings = holdback_ceilings(priorities, self._config)
        else:
            alternating = 1.0 - saturation <= saturation < 1.0
            open_tick = False
            if alternating and len(priorities) > 1:
                self._tick += 1
                open_tick = self._tick % reflective_period(saturation) == 0
            ceilings = reflective_ceilings(saturation, len(priorities), open_tick)
        return dict(zip(priorities, ceilings, strict=True))


class CeilingGate:
    """During one release pass: whether a band may still dispatch, as the pass uses the pool's room."""

    def __init__(self, ceilings: Ceilings, rooms: Sequence[Room], priorities: Sequence[int]) -> None:
        self._rooms = rooms
        self._ceilings = ceilings.compute(pool_saturation(rooms), sorted(priorities, reverse=True))
        self._held: int | None = None

    def allows(self, priority: int) -> bool:
        """Whether ``priority``'s band may dispatch now: the pool's saturation is below its ceiling and no
        higher band was held this pass."""
        if self._held is not None and priority <= self._held:
            return False
        if pool_saturation(self._rooms) >= self._ceilings.get(priority, 1.0):
            self._held = priority
            return False
        return True
