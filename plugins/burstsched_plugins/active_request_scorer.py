"""``active-request-scorer``: llm-d's scorer of the requests each endpoint is serving.

An endpoint's count is the router's own: the requests it sent there that have not finished, plus those the
current admission window placed there (never stale). At or below ``idle_threshold`` an endpoint scores 1.0;
above it, ``(max − count) / max × max_busy_score`` with ``max`` the highest count among the candidates, so the
busiest scores 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import Field

from burstsched.framework import CycleState, EndpointSnapshot, PluginContext, PluginParameters, SchedRequest


class ActiveRequestParameters(PluginParameters):
    idle_threshold: int = Field(
        default=0, ge=0, description="At or below this many active requests an endpoint scores 1.0."
    )
    max_busy_score: float = Field(
        default=1.0, ge=0.0, le=1.0, description="The score of the least busy endpoint above the threshold."
    )


class ActiveRequestScorer:
    """Idle endpoints 1.0; busy ones scaled from ``max_busy_score`` down to 0 by their active requests."""

    Parameters = ActiveRequestParameters

    def __init__(self, name: str, parameters: ActiveRequestParameters, context: PluginContext) -> None:
        self._name = name
        self._idle = parameters.idle_threshold
        self._busy = parameters.max_busy_score

    @property
    def name(self) -> str:
        return self._name

    def score(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> Mapping[str, float]:
        counts = {e.name: e.in_flight + e.pending for e in endpoints}
        highest = max(counts.values(), default=0)
        return {
            name: 1.0 if count <= self._idle else (highest - count) / highest * self._busy
            for name, count in counts.items()
        }
