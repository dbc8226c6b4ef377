"""``approx-prefix-producer``: per-endpoint prefix matches from past routing decisions (no tokenizer).

At each decision it writes a :class:`PrefixMatch` per endpoint: how many of the request's leading blocks
that endpoint was sent before. At dispatch it records the request's chain for the chosen endpoint. Each
endpoint's index is bounded by its KV capacity (``num_gpu_blocks × block_size`` tokens from
``vllm:cache_config_info``, in blocks of the request's pseudo-tokens), or ``default_capacity_blocks`` until
the endpoint reports one.
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


class ApproxPrefixParameters(PluginParameters):
    default_capacity_blocks: int = Field(
        default=31250, ge=1, description="Index bound per endpoint, in blocks, until it reports its capacity."
    )


class ApproxPrefixProducer:
    """Producer, dispatch hook and resettable: the approximate prefix index."""

    Parameters = ApproxPrefixParameters
    produces: ClassVar[tuple[type, ...]] = (PrefixMatch,)

    def __init__(self, name: str, parameters: ApproxPrefixParameters, context: PluginContext) -> None:
        self._name = name
        self.index = PrefixIndex(parameters.default_capacity_blocks)
        self._capacities: dict[str, int] = {}

    @property
    def name(self) -> str:
        return self._name

    def produce(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> None:
        for endpoint in endpoints:
            self._update_capacity(endpoint, request.block_tokens)
        total = len(request.block_hashes)
        matched = self.index.match(request.block_hashes, (e.name for e in endpoints))
        for endpoint in endpoints:
            state.put(endpoint.name, PrefixMatch(matched[endpoint.name], total, request.block_tokens))

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
        tokens = endpoint.capacity_tokens
        if tokens is None:
            return
        blocks = tokens // block_tokens
        if self._capacities.get(endpoint.name) != blocks:  # the common case: unchanged since last time
            self._capacities[endpoint.name] = blocks
            self.index.set_capacity(endpoint.name, blocks)
