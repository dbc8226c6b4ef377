"""``prefix-cache-scorer``: matched blocks over total blocks, contiguous from block 0."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from burstsched.framework import (
    CycleState,
    EndpointSnapshot,
    PluginContext,
    PluginParameters,
    PrefixMatch,
    SchedRequest,
)


class PrefixCacheParameters(PluginParameters):
    pass


class PrefixCacheScorer:
    """Scores each endpoint by the share of the request's blocks it already holds (0 without a match)."""

    Parameters = PrefixCacheParameters
    consumes: ClassVar[tuple[type, ...]] = (PrefixMatch,)

    def __init__(self, name: str, parameters: PrefixCacheParameters, context: PluginContext) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def score(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> Mapping[str, float]:
        scores = {}
        for endpoint in endpoints:
            match = state.get(endpoint.name, PrefixMatch)
            scores[endpoint.name] = match.ratio if match is not None else 0.0
        return scores
