"""``token-load-scorer``: llm-d's scorer of the prompt tokens each endpoint has in flight.

An endpoint's load is the router's own count of the prompt tokens it must still compute there: the uncached
prefill of the requests it sent there that have not produced their first token (``queued_prefill_tokens``,
llm-d's ``InFlightLoad``), plus what this request would add there, its prompt less that endpoint's prefix
match (llm-d's ``UncachedRequestTokens``). The score is ``1 − min(1, load / queue_threshold_tokens)``: 1.0
with nothing in flight, 0 at or above the threshold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import Field

from burstsched.framework import (
    CycleState,
    EndpointSnapshot,
    PluginContext,
    PluginParameters,
    PrefixMatch,
    SchedRequest,
    uncached_tokens,
)


class TokenLoadParameters(PluginParameters):
    queue_threshold_tokens: int = Field(
        default=4194304, ge=1, description="The in-flight prompt tokens at which an endpoint scores 0."
    )


class TokenLoadScorer:
    """Endpoints with fewer prompt tokens to compute (theirs in flight plus this request's) score higher."""

    Parameters = TokenLoadParameters

    def __init__(self, name: str, parameters: TokenLoadParameters, context: PluginContext) -> None:
        self._name = name
        self._threshold = float(parameters.queue_threshold_tokens)

    @property
    def name(self) -> str:
        return self._name

    def score(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> Mapping[str, float]:
        scores: dict[str, float] = {}
        for endpoint in endpoints:
            own = uncached_tokens(request, state.get(endpoint.name, PrefixMatch)) * request.group_size
            load = endpoint.queued_prefill_tokens + own
            scores[endpoint.name] = 1.0 - min(1.0, load / self._threshold) if load > 0 else 1.0
        return scores
