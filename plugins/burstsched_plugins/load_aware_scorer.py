"""``load-aware-scorer``: llm-d's scorer of each endpoint's waiting queue, in [0, 0.5].

``0.5`` with no request waiting, ``0.5 × (1 − waiting / threshold)`` below ``threshold``, 0 at or above it.
``waiting`` is the replica's scraped ``vllm:num_requests_waiting``; when an endpoint's metrics are stale it
counts as empty, as in llm-d, where missing metrics leave every endpoint at 0.5.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import Field

from burstsched.framework import CycleState, EndpointSnapshot, PluginContext, PluginParameters, SchedRequest


class LoadAwareParameters(PluginParameters):
    threshold: int = Field(default=128, ge=1, description="The queue depth at which the score reaches 0.")


class LoadAwareScorer:
    """Half a point for an empty queue, falling linearly to 0 at ``threshold`` waiting requests."""

    Parameters = LoadAwareParameters

    def __init__(self, name: str, parameters: LoadAwareParameters, context: PluginContext) -> None:
        self._name = name
        self._threshold = parameters.threshold

    @property
    def name(self) -> str:
        return self._name

    def score(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> Mapping[str, float]:
        scores: dict[str, float] = {}
        for e in endpoints:
            waiting = 0 if e.stale else e.waiting
            scores[e.name] = 0.5 * max(0.0, 1.0 - waiting / self._threshold)
        return scores
