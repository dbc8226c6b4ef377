"""``saturation-filter``: drops endpoints that are saturated, so a warm prefix stops pulling load there.

The prefix scorer outweighs the relative queue scorer, so without this filter a warm replica keeps
taking its prefix's requests however long its queue grows. An endpoint is saturated when its waiting
queue plus what the current admission window already placed there reaches ``max_waiting``, or its
KV-cache usage reaches ``max_kv_usage``. An endpoint with stale metrics is judged by the router's own
in-flight count against ``max_in_flight``. Fails open: when every endpoint is saturated, all stay.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from burstsched.framework import CycleState, EndpointSnapshot, PluginContext, PluginParameters, SchedRequest


class SaturationFilterParameters(PluginParameters):
    max_waiting: int = Field(
        default=16,
        ge=1,
        description="Waiting requests (the replica's queue plus this window's pending placements) at which "
        "an endpoint counts as saturated.",
    )
    max_kv_usage: float = Field(
        default=0.95, gt=0.0, le=1.0, description="KV-cache usage (0..1) at which an endpoint is saturated."
    )
    max_in_flight: int = Field(
        default=256,
        ge=1,
        description="For an endpoint with stale metrics: the router's own in-flight requests plus pending "
        "placements at which it counts as saturated.",
    )


class SaturationFilter:
    """Keeps endpoints below the saturation thresholds, never dropping all of them."""

    Parameters = SaturationFilterParameters

    def __init__(self, name: str, parameters: SaturationFilterParameters, context: PluginContext) -> None:
        self._name = name
        self._p = parameters

    @property
    def name(self) -> str:
        return self._name

    def saturated(self, endpoint: EndpointSnapshot) -> bool:
        p = self._p
        if endpoint.stale:
            return endpoint.in_flight + endpoint.pending >= p.max_in_flight
        return endpoint.waiting + endpoint.pending >= p.max_waiting or endpoint.kv_usage >= p.max_kv_usage

    def filter(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> Sequence[EndpointSnapshot]:
        kept = [e for e in endpoints if not self.saturated(e)]
        return kept if kept else list(endpoints)
