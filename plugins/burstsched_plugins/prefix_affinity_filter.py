"""``prefix-cache-affinity-filter``: llm-d's filter that keeps a request on the endpoints holding its prefix.

An endpoint is sticky when its prefix match (the producer's :class:`PrefixMatch`, matched over total blocks)
reaches ``affinity_threshold``. The filter keeps only the sticky endpoints, unless:

- fewer than two candidates, or a threshold of 0: every candidate is kept;
- with probability ``exploration_probability`` (the injected RNG) it keeps every candidate, to seed caches
  elsewhere;
- no endpoint is sticky: every candidate is kept;
- the load gate (``max_ttft_penalty_ms`` above 0, and some endpoint not sticky): each endpoint's time to
  first token is estimated as ``queued_prefill_tokens / peak_prefill_throughput`` seconds (the prompt
  tokens the router has in flight there, llm-d's ``InFlightLoad``); when the best sticky endpoint's exceeds
  the best other one's by more than ``max_ttft_penalty_ms``, stickiness breaks and every candidate is kept;
- the in-flight tokens gate (``max_tokens_in_flight_penalty`` above 0, an earlier llm-d's gate): likewise when
  the best sticky endpoint's in-flight prompt tokens exceed the best other one's by more than it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import Field

from burstsched.framework import (
    CycleState,
    EndpointSnapshot,
    PluginContext,
    PluginParameters,
    PrefixMatch,
    SchedRequest,
)


class PrefixAffinityParameters(PluginParameters):
    affinity_threshold: float = Field(
        default=0.8,
        le=1.0,
        description="The prefix match (matched/total blocks) that makes an endpoint sticky.",
    )
    exploration_probability: float = Field(
        default=0.0, ge=0.0, le=1.0, description="How often the filter keeps every candidate regardless."
    )
    max_ttft_penalty_ms: float = Field(
        default=18000.0,
        ge=0.0,
        description="How much slower (estimated TTFT) the best sticky endpoint may be than the best other "
        "one before stickiness breaks; 0: always stick.",
    )
    max_tokens_in_flight_penalty: int = Field(
        default=0,
        ge=0,
        description="How many more prompt tokens in flight the best sticky endpoint may have than the best "
        "other one before stickiness breaks; 0: no such gate.",
    )
    peak_prefill_throughput: float = Field(
        default=15928.0,
        gt=0.0,
        description="Prompt tokens per second an endpoint computes, for the TTFT estimate.",
    )


class PrefixAffinityFilter:
    """Keeps the endpoints holding at least ``affinity_threshold`` of the prompt, unless they are too slow."""

    Parameters = PrefixAffinityParameters

    def __init__(self, name: str, parameters: PrefixAffinityParameters, context: PluginContext) -> None:
        self._name = name
        self._threshold = parameters.affinity_threshold
        self._explore = parameters.exploration_probability
        self._penalty_ms = parameters.max_ttft_penalty_ms
        self._throughput = parameters.peak_prefill_throughput
        self._token_penalty = parameters.max_tokens_in_flight_penalty
        self._rng: random.Random = context.rng

    @property
    def name(self) -> str:
        return self._name

    def filter(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> Sequence[EndpointSnapshot]:
        if len(endpoints) <= 1 or self._threshold <= 0:
            return endpoints
        if self._explore > 0 and self._rng.random() < self._explore:
            return endpoints
        sticky: list[EndpointSnapshot] = []
        others: list[EndpointSnapshot] = []
        for endpoint in endpoints:
            match = state.get(endpoint.name, PrefixMatch)
            ratio = match.ratio if match is not None else 0.0
            (sticky if ratio >= self._threshold else others).append(endpoint)
        if not sticky:
            return endpoints
        if not others:
            return sticky
        extra_tokens = _least_tokens(sticky) - _least_tokens(others)
        if self._penalty_ms > 0 and extra_tokens / self._throughput * 1000.0 > self._penalty_ms:
            return endpoints
        if self._token_penalty > 0 and extra_tokens > self._token_penalty:
            return endpoints
        return sticky


def _least_tokens(endpoints: Sequence[EndpointSnapshot]) -> int:
    return min(e.queued_prefill_tokens for e in endpoints)
