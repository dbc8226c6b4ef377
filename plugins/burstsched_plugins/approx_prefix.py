"""``approx-prefix-producer``: per-endpoint prefix matches from past routing decisions (no tokenizer).

At each decision it writes a :class:`PrefixMatch` per endpoint: how many of the request's leading blocks
that endpoint was sent before. At dispatch it records the request's chain for the chosen endpoint. Each
endpoint's index is bounded by its KV capacity (``num_gpu_blocks × block_size`` tokens from
``vllm:cache_config_info``, in blocks of the request's pseudo-tokens), or ``default_capacity_blocks`` until
the endpoint reports one (always, with ``capacity_from_endpoint: false``). A pseudo-token is not an engine
token: once the pool has learned how many engine tokens a pseudo-token comes to on that endpoint (about 1.9
for chat text through vLLM), the capacity is divided by it. Without that the index believed a cache twice the
real one on chat traffic, and sent a
quarter of the requests of a document-QA trace from vLLM "warm" to a replica that had evicted them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from pydantic import Field

from burstsched.framework import (
    CycleState,
    EndpointSnapshot,
    PluginContext,
    PluginParameters,
    PrefixMatch,
    SchedRequest,
)
from burstsched_plugins.prefix_index import PrefixIndex

_CAPACITY_SLACK = 0.02
"""A learned capacity moving by less than this share leaves the index's bound as it is."""


class ApproxPrefixParameters(PluginParameters):
    default_capacity_blocks: int = Field(
        default=31250, ge=1, description="Index bound per endpoint, in blocks, until it reports its capacity."
    )
    capacity_from_endpoint: bool = Field(
        default=True,
        description=(
            "Bound each endpoint's index by the KV capacity it reports; false: default_capacity_blocks "
            "always (llm-d's autoTune: false, e.g. for a tier whose capacity no metric reports)."
        ),
    )
    engine_tokens: bool = Field(
        default=True,
        description=(
            "Size each endpoint's index by its capacity over the engine tokens a pseudo-token comes to there "
            "(learned from its prompt-token counter); false: one engine token a pseudo-token."
        ),
    )


class ApproxPrefixProducer:
    """Producer, dispatch hook and resettable: the approximate prefix index."""

    Parameters = ApproxPrefixParameters
    produces: ClassVar[tuple[type, ...]] = (PrefixMatch,)

    def __init__(self, name: str, parameters: ApproxPrefixParameters, context: PluginContext) -> None:
        self._name = name
        self.index = PrefixIndex(parameters.default_capacity_blocks)
        self._capacities: dict[str, int] = {}
        self._engine_tokens = parameters.engine_tokens
        self._from_endpoint = parameters.capacity_from_endpoint

    @property
    def name(self) -> str:
        return self._name

    def produce(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> None:
        for endpoint in endpoints:
            self._update_capacity(endpoint, request.block_tokens)
        total = len(request.block_hashes)
        index = self.index
        matched = index.match(request.block_hashes, (e.name for e in endpoints))
        for endpoint in endpoints:
            name = endpoint.name
            fill = index.size(name) / index.capacity(name) if name in self._capacities else None
            state.put(name, PrefixMatch(matched[name], total, request.block_tokens, fill=fill))

    def on_dispatch(self, request: SchedRequest, endpoint: EndpointSnapshot) -> None:
        self._update_capacity(endpoint, request.block_tokens)
        if request.block_hashes:
            self.index.add(endpoint.name, request.block_hashes)

    def reset(self) -> None:
        self.index.clear()

    def forget_endpoint(self, endpoint: str) -> None:
        """``endpoint`` went away: its entries expire (a replica that comes back starts cold)."""
        self._capacities.pop(endpoint, None)
        self.index.remove_endpoint(endpoint)

    def _update_capacity(self, endpoint: EndpointSnapshot, block_tokens: int) -> None:
        if not self._from_endpoint:
            return
        blocks = endpoint.capacity_blocks(block_tokens, learned=self._engine_tokens)
        if blocks is None:
            return
        known = self._capacities.get(endpoint.name)
        if known is None or abs(blocks - known) > known * _CAPACITY_SLACK:  # common: (almost) unchanged
            self._capacities[endpoint.name] = blocks
            self.index.set_capacity(endpoint.name, blocks)
