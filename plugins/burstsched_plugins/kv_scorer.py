"""``kv-utilization-scorer``: ``1 − kv_usage``; more free KV cache scores higher.

When any candidate's metrics are stale every candidate scores 1.0: the scorer abstains rather than compare a
fresh figure with an old one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from burstsched.framework import CycleState, EndpointSnapshot, PluginContext, PluginParameters, SchedRequest


class KvUtilizationParameters(PluginParameters):
    pass


class KvUtilizationScorer:
    """Scores free KV-cache share, from ``vllm:kv_cache_usage_perc``."""

    Parameters = KvUtilizationParameters

    def __init__(self, name: str, parameters: KvUtilizationParameters, context: PluginContext) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def score(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> Mapping[str, float]:
        if any(e.stale for e in endpoints):
            return {e.name: 1.0 for e in endpoints}
        return {e.name: 1.0 - e.kv_usage for e in endpoints}
