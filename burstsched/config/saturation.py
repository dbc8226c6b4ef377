"""The ``saturation:`` section: when an endpoint counts as saturated (``burstsched.framework.Saturation``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SaturationConfig(BaseModel):
    """The router's one definition of a saturated endpoint.

    The ``saturation-filter`` drops saturated endpoints from a decision (fails open: when all are, all stay),
    and admission's warm bypass (``admission.bypass_warm``) skips only endpoints that are not saturated. A
    ``saturation-filter`` whose own parameters set these thresholds (an llm-d ``utilization-detector``
    translates to one) defines them instead; setting both, differently, is refused.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    max_waiting: int = Field(
        default=16,
        ge=1,
        description="An endpoint whose waiting requests (the replica's queue plus what the current admission "
        "window placed there) reach this is saturated.",
    )
    max_kv_usage: float = Field(
        default=0.95,
        gt=0.0,
        le=1.0,
        description="An endpoint whose KV-cache usage (0..1) reaches this is saturated.",
    )
    max_in_flight: int = Field(
        default=256,
        ge=1,
        description="For an endpoint with stale metrics: the router's own in-flight requests plus pending "
        "placements at which it is saturated.",
    )
