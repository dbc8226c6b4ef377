"""``lora-affinity-scorer``: llm-d's scorer of where a request's LoRA adapter is, or can be, loaded.

The request's ``model`` names the adapter. From each endpoint's last ``vllm:lora_requests_info`` (the adapters
of its running and waiting requests, and ``max_lora``), as llm-d scores it:

- 1.0: the adapter is running there;
- 0.8: it is not, and the running and waiting adapters together are fewer than ``max_lora`` (room for one
  more);
- 0.6: no room, but the adapter is waiting there (it is next to load);
- 0.0: no room and the adapter is neither running nor waiting there.

A replica serving no adapter reports no ``max_lora``: it scores 0, as in llm-d, so a pool without LoRA is
scored evenly. The scorer has no parameters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from burstsched.framework import CycleState, EndpointSnapshot, PluginContext, PluginParameters, SchedRequest

ACTIVE = 1.0
ROOM = 0.8
WAITING = 0.6
FULL = 0.0


class LoraAffinityParameters(PluginParameters):
    pass


def lora_affinity(adapter: str, endpoint: EndpointSnapshot) -> float:
    """The score of ``endpoint`` for a request to ``adapter``."""
    if adapter in endpoint.running_adapters:
        return ACTIVE
    if len(endpoint.running_adapters) + len(endpoint.waiting_adapters) < endpoint.max_adapters:
        return ROOM
    if adapter in endpoint.waiting_adapters:
        return WAITING
    return FULL


class LoraAffinityScorer:
    """Endpoints running the request's adapter score highest, then those with room to load it."""

    Parameters = LoraAffinityParameters

    def __init__(self, name: str, parameters: LoraAffinityParameters, context: PluginContext) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def score(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> Mapping[str, float]:
        return {e.name: lora_affinity(request.model, e) for e in endpoints}
