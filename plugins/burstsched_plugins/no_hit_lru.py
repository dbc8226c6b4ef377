"""``no-hit-lru-scorer``: llm-d's spreading of cold requests, least recently used endpoint first.

A request is cold when no endpoint holds any block of its prefix (no producer's :class:`PrefixMatch` has a
matched block). A warm request scores 0.5 everywhere, leaving placement to the prefix scorer. A cold one
ranks the candidates: endpoints that never took a cold request first (in candidate order), then those that
did, the least recently used first; rank ``r`` of ``n`` scores ``1 − r / (n − 1)`` (1.0 for a lone
candidate). When a cold request is dispatched, its endpoint becomes the most recently used. At most
``lru_size`` endpoints are remembered.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

from pydantic import Field

from burstsched.framework import (
    CycleState,
    EndpointSnapshot,
    PluginContext,
    PluginParameters,
    PrefixMatch,
    SchedRequest,
)

_PENDING_LIMIT = 4096  # cold verdicts kept for requests scored but not dispatched yet


class NoHitLruParameters(PluginParameters):
    lru_size: int = Field(default=1024, ge=1, description="The most endpoints remembered in the LRU.")


class NoHitLruScorer:
    """Scores cold requests by how long ago each endpoint last took one; warm requests 0.5 everywhere."""

    Parameters = NoHitLruParameters

    def __init__(self, name: str, parameters: NoHitLruParameters, context: PluginContext) -> None:
        self._name = name
        self._size = parameters.lru_size
        self._lru: OrderedDict[str, None] = OrderedDict()  # oldest first
        self._cold: OrderedDict[str, bool] = OrderedDict()

    @property
    def name(self) -> str:
        return self._name

    def score(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> Mapping[str, float]:
        cold = not any(
            (match := state.get(e.name, PrefixMatch)) is not None and match.matched_blocks > 0
            for e in endpoints
        )
        self._cold[request.request_id] = cold
        while len(self._cold) > _PENDING_LIMIT:
            self._cold.popitem(last=False)
        if not cold:
            return dict.fromkeys((e.name for e in endpoints), 0.5)
        if len(endpoints) == 1:
            return {endpoints[0].name: 1.0}
        position = {name: i for i, name in enumerate(self._lru)}
        never = [e.name for e in endpoints if e.name not in position]
        used = [e.name for e in endpoints if e.name in position]
        last = len(endpoints) - 1
        scores = {name: 1.0 - i / last for i, name in enumerate(never)}
        for name in used:
            scores[name] = max(0.0, 1.0 - (len(never) + position[name]) / last)
        return scores

    def on_dispatch(self, request: SchedRequest, endpoint: EndpointSnapshot) -> None:
        if not self._cold.pop(request.request_id, False):
            return
        self._lru.pop(endpoint.name, None)
        self._lru[endpoint.name] = None
        while len(self._lru) > self._size:
            self._lru.popitem(last=False)

    def forget_endpoint(self, endpoint: str) -> None:
        self._lru.pop(endpoint, None)

    def reset(self) -> None:
        self._lru.clear()
        self._cold.clear()
