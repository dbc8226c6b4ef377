"""Pickers: ``max-score-picker``, ``random-picker``, ``weighted-random-picker``.

Each orders all candidates by preference; the first is the pick, the rest are the failover and spill order.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from burstsched.framework import PluginContext, PluginParameters, SchedRequest, ScoredEndpoint


class MaxScoreParameters(PluginParameters):
    tie_break: Literal["least-recent", "random"] = Field(
        default="least-recent",
        description="Among equal totals: the endpoint this picker chose least recently (random among those "
        "never chosen or chosen equally long ago), or a uniformly random one.",
    )
    tie_tolerance: float = Field(default=1e-9, ge=0, description="Totals this close count as equal.")


class MaxScorePicker:
    """Highest total first; ties broken by recency of this picker's own picks, then by the injected RNG.

    So a run of tied decisions (distinct cold prefixes, a burst of equal requests) rotates over the tied
    endpoints instead of repeating one stale pick.
    """

    Parameters = MaxScoreParameters

    def __init__(self, name: str, parameters: MaxScoreParameters, context: PluginContext) -> None:
        self._name = name
        self._rng = context.rng
        self._least_recent = parameters.tie_break == "least-recent"
        self._tolerance = parameters.tie_tolerance
        self._last_pick: dict[str, int] = {}
        self._picks = 0

    @property
    def name(self) -> str:
        return self._name

    def pick(self, request: SchedRequest, candidates: Sequence[ScoredEndpoint]) -> Sequence[ScoredEndpoint]:
        by_total = sorted(candidates, key=lambda s: s.total, reverse=True)
        ranked: list[ScoredEndpoint] = []
        start = 0
        while start < len(by_total):
            top = by_total[start].total
            end = start + 1
            while end < len(by_total) and by_total[end].total >= top - self._tolerance:
                end += 1
            ranked.extend(self._order_ties(by_total[start:end]))
            start = end
        self._picks += 1
        self._last_pick[ranked[0].name] = self._picks
        return ranked

    def _order_ties(self, tied: list[ScoredEndpoint]) -> list[ScoredEndpoint]:
        if len(tied) == 1:
            return tied
        draws = {s.name: self._rng.random() for s in tied}
        if self._least_recent:
            return sorted(tied, key=lambda s: (self._last_pick.get(s.name, 0), draws[s.name]))
        return sorted(tied, key=lambda s: draws[s.name])


class RandomParameters(PluginParameters):
    pass


class RandomPicker:
    """A uniformly random order, ignoring scores."""

    Parameters = RandomParameters

    def __init__(self, name: str, parameters: RandomParameters, context: PluginContext) -> None:
        self._name = name
        self._rng = context.rng

    @property
    def name(self) -> str:
        return self._name

    def pick(self, request: SchedRequest, candidates: Sequence[ScoredEndpoint]) -> Sequence[ScoredEndpoint]:
        ranked = list(candidates)
        self._rng.shuffle(ranked)
        return ranked


class WeightedRandomParameters(PluginParameters):
    pass


class WeightedRandomPicker:
    """A random order drawn with probability proportional to the totals (uniform when all are 0)."""

    Parameters = WeightedRandomParameters

    def __init__(self, name: str, parameters: WeightedRandomParameters, context: PluginContext) -> None:
        self._name = name
        self._rng = context.rng

    @property
    def name(self) -> str:
        return self._name

    def pick(self, request: SchedRequest, candidates: Sequence[ScoredEndpoint]) -> Sequence[ScoredEndpoint]:
        if all(s.total <= 0 for s in candidates):
            ranked = list(candidates)
            self._rng.shuffle(ranked)
            return ranked
        return sorted(candidates, key=lambda s: _weighted_key(self._rng, s.total), reverse=True)


def _weighted_key(rng: random.Random, weight: float) -> float:
    """Efraimidis–Spirakis key ``u^(1/w)``: sorting by it samples without replacement by weight."""
    if weight <= 0:
        return -rng.random()  # after every positive weight, in random order
    return float(rng.random() ** (1.0 / weight))
