"""``queue-scorer``: fewer queued requests score higher (min-max normalised over the candidates).

An endpoint's queue is ``waiting + in_flight + pending + group_size``: the replica's waiting requests, the
router's own in-flight requests there, the load the current admission window placed there, and the
requests being placed now. When any candidate's metrics are stale the waiting counts are left out for all of
them, so the comparison stays on one footing: the router's own counts, which are never stale.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from burstsched.framework import CycleState, EndpointSnapshot, PluginContext, PluginParameters, SchedRequest


class QueueParameters(PluginParameters):
    pass


class QueueScorer:
    """``(max_q − q) / (max_q − min_q)``; 1.0 for every endpoint when all queues are equal."""

    Parameters = QueueParameters

    def __init__(self, name: str, parameters: QueueParameters, context: PluginContext) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def score(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> Mapping[str, float]:
        if not endpoints:
            return {}
        use_waiting = not any(e.stale for e in endpoints)
        queues = {
            e.name: (e.waiting if use_waiting else 0) + e.in_flight + e.pending + request.group_size
            for e in endpoints
        }
        low, high = min(queues.values()), max(queues.values())
        if high == low:
            return dict.fromkeys(queues, 1.0)
        return {name: (high - q) / (high - low) for name, q in queues.items()}
