"""``saturation-filter``: drops endpoints that are saturated, so a warm prefix stops pulling load there.

The prefix scorer outweighs the relative queue scorer, so without this filter a warm replica keeps
taking its prefix's requests however long its queue grows. What "saturated" means is the router's one
definition (:class:`~burstsched.framework.Saturation`, the config's ``saturation:`` section), which
admission's warm bypass uses too; thresholds set in this plugin's parameters (as an llm-d
``utilization-detector`` translates to) replace the section's, for the filter and admission alike. Fails
open: when every endpoint is saturated, all stay.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pydantic import Field

from burstsched.framework import (
    CycleState,
    EndpointSnapshot,
    PluginContext,
    PluginParameters,
    Saturation,
    SchedRequest,
)


class SaturationFilterParameters(PluginParameters):
    max_waiting: int | None = Field(
        default=None,
        ge=1,
        description="Waiting requests (the replica's queue plus this window's pending placements) at which "
        "an endpoint counts as saturated. Default: saturation.max_waiting; set here, it replaces it.",
    )
    max_kv_usage: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="KV-cache usage (0..1) at which an endpoint is saturated. Default: "
        "saturation.max_kv_usage; set here, it replaces it.",
    )
    max_in_flight: int | None = Field(
        default=None,
        ge=1,
        description="For an endpoint with stale metrics: the router's own in-flight requests plus pending "
        "placements at which it counts as saturated. Default: saturation.max_in_flight; set here, it "
        "replaces it.",
    )


class SaturationFilter:
    """Keeps endpoints below the saturation thresholds, never dropping all of them."""

    Parameters = SaturationFilterParameters

    def __init__(self, name: str, parameters: SaturationFilterParameters, context: PluginContext) -> None:
        self._name = name
        given = {k: v for k, v in parameters.model_dump().items() if v is not None}
        self._saturation = dataclasses.replace(context.saturation, **given)

    @property
    def name(self) -> str:
        return self._name

    @property
    def saturation(self) -> Saturation:
        """The thresholds this filter applies: the router's, or those its parameters set."""
        return self._saturation

    def saturated(self, endpoint: EndpointSnapshot) -> bool:
        return self._saturation.saturated(endpoint)

    def filter(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> Sequence[EndpointSnapshot]:
        saturated = self._saturation.saturated
        kept = [e for e in endpoints if not saturated(e)]
        return kept if kept else list(endpoints)
