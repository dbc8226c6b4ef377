"""``health-filter``: keeps healthy endpoints (and, optionally, only those with fresh metrics).

Fails open: when no endpoint passes, all of them are kept.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from burstsched.framework import CycleState, EndpointSnapshot, PluginContext, PluginParameters, SchedRequest


class HealthFilterParameters(PluginParameters):
    drop_stale: bool = Field(
        default=False,
        description="Also drop endpoints whose metrics are stale. Off: stale endpoints stay, and the load "
        "scorers fall back to the router's own in-flight counts.",
    )


class HealthFilter:
    """Drops unhealthy (and, with ``drop_stale``, stale) endpoints, never all of them."""

    Parameters = HealthFilterParameters

    def __init__(self, name: str, parameters: HealthFilterParameters, context: PluginContext) -> None:
        self._name = name
        self._drop_stale = parameters.drop_stale

    @property
    def name(self) -> str:
        return self._name

    def filter(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> Sequence[EndpointSnapshot]:
        kept = [e for e in endpoints if e.healthy and not (self._drop_stale and e.stale)]
        return kept if kept else list(endpoints)
