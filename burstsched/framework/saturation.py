"""What "saturated" means for an endpoint: the router's one definition.

The ``saturation-filter`` drops saturated endpoints from a decision, and admission lets a warm request skip
the window only for an endpoint that is not saturated; both read the same :class:`Saturation` (the config's
``saturation:`` section, or the filter's own parameters when a config sets them, as a translated llm-d
``utilization-detector`` does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from burstsched.framework.plugins import Plugin
from burstsched.framework.types import EndpointSnapshot


@dataclass(frozen=True, slots=True)
class Saturation:
    """The thresholds at which an endpoint counts as saturated (see :meth:`saturated`)."""

    max_waiting: int = 16
    max_kv_usage: float = 0.95
    max_in_flight: int = 256

    def __post_init__(self) -> None:
        if self.max_waiting < 1 or self.max_in_flight < 1:
            raise ValueError("max_waiting and max_in_flight must be at least 1")
        if not 0.0 < self.max_kv_usage <= 1.0:
            raise ValueError("max_kv_usage must be in (0, 1]")

    def saturated(self, endpoint: EndpointSnapshot) -> bool:
        """Its waiting queue plus this window's pending placements reach ``max_waiting``, or its KV-cache
        usage reaches ``max_kv_usage``; with stale metrics, the router's own in-flight requests plus pending
        ones reach ``max_in_flight``. Health is not part of it (the health filter's business)."""
        if endpoint.stale:
            return endpoint.in_flight + endpoint.pending >= self.max_in_flight
        waiting = endpoint.waiting + endpoint.pending
        return waiting >= self.max_waiting or endpoint.kv_usage >= self.max_kv_usage


@runtime_checkable
class SaturationDetector(Plugin, Protocol):
    """A plugin that judges saturation (the ``saturation-filter``): the scheduler answers "is this endpoint
    saturated?" with its profile's detector's :class:`Saturation`, so admission and the filter agree."""

    @property
    def saturation(self) -> Saturation: ...
