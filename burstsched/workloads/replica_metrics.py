"""The few counters of a vLLM replica's ``/metrics`` that workloads diff before and after a request."""

from __future__ import annotations

from dataclasses import dataclass, fields

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True, slots=True)
class ReplicaCounters:
    """Cumulative counters of one replica (sums over label sets)."""

    requests_finished: float = 0.0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    prefill_computed_tokens: float = 0.0
    prompt_tokens: float = 0.0

    def __sub__(self, other: ReplicaCounters) -> ReplicaCounters:
        return ReplicaCounters(
            **{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)}
        )


# metric family name (as the parser reports it) and sample name → field
_SAMPLES: dict[str, str] = {
    "vllm:request_success_total": "requests_finished",
    "vllm:prefix_cache_queries_total": "prefix_queries",
    "vllm:prefix_cache_hits_total": "prefix_hits",
    "vllm:request_prefill_kv_computed_tokens_sum": "prefill_computed_tokens",
    "vllm:prompt_tokens_total": "prompt_tokens",
}


def parse_counters(text: str) -> ReplicaCounters:
    """Sum the counters workloads need out of a Prometheus exposition."""
    totals = dict.fromkeys(_SAMPLES.values(), 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            field = _SAMPLES.get(sample.name)
            if field is not None:
                totals[field] += sample.value
    return ReplicaCounters(**totals)


async def read_counters(client: httpx.AsyncClient, base_url: str) -> ReplicaCounters:
    """Scrape one replica's counters."""
    response = await client.get(f"{base_url}/metrics")
    response.raise_for_status()
    return parse_counters(response.text)
