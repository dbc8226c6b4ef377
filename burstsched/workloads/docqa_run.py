"""Running a document-QA sequence against one target and measuring it.

Open loop (:mod:`burstsched.workloads.open_loop`): each request is one user message, the document then
its question, sent at its arrival time whatever happened to the ones before. The replicas' ``/metrics``
counters before and after the run give the hit rate (Σ Δhits / Σ Δqueries), the prefill tokens computed
and, where no header names the replica, the requests each replica served.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from burstsched.workloads.docqa import (
    Corpus,
    DocQARequest,
    ceiling_hits,
    ideal_hit_rate,
    partitioned_hits,
)
from burstsched.workloads.open_loop import Clock, Progress, ProgressSink, measured_run, run_open_loop
from burstsched.workloads.open_loop import RequestRecord as BaseRecord
from burstsched.workloads.placement import Received, ReplicaWatch, by_document, cold_placements
from burstsched.workloads.replica_metrics import ReplicaCounters
from burstsched.workloads.replica_state import (
    CacheConfig,
    ResetError,
    read_cache_config,
    reset_prefix_caches,
    settled_snapshot,
    snapshot,
)
from burstsched.workloads.run_summary import RunSummary, TargetRun, summarize_run, with_router_cpu
from burstsched.workloads.stats import mostly_cold, percentile
from burstsched.workloads.stream_client import chat_body
from burstsched.workloads.targets import Endpoints, Route, Target

__all__ = [
    # this workload's own
    "RequestRecord",
    "run_sequence",
    "run_target",
    "summarize",
    # shared with the other workloads, importable from here as before they moved out
    "CacheConfig",
    "Progress",
    "ProgressSink",
    "ResetError",
    "RunSummary",
    "TargetRun",
    "read_cache_config",
    "reset_prefix_caches",
    "settled_snapshot",
    "snapshot",
]


@dataclass(slots=True)
class RequestRecord(BaseRecord):
    """What one request of the sequence did, as the client saw it, which document it asked about and, with
    classes (:mod:`burstsched.workloads.docqa_classes`), its class."""

    document: int = field(kw_only=True)
    request_class: str = field(default="", kw_only=True)

    def labels(self) -> dict[str, Any]:
        if self.request_class:
            return {"document": self.document, "request_class": self.request_class}
        return {"document": self.document}


async def run_sequence(
    client: httpx.AsyncClient,
    route: Route,
    corpus: Corpus,
    requests: Sequence[DocQARequest],
    model: str,
    *,
    max_tokens: int,
    tag: str = "docqa",
    drain_timeout_s: float = 60.0,
    clock: Clock = time.perf_counter,
    progress: ProgressSink | None = None,
    progress_interval_s: float = 0.5,
) -> list[RequestRecord]:
    """Send every request at its arrival time (open loop), with the headers of its class; wait for all, at
    most ``drain_timeout_s`` after the last arrival; a request still running then is cancelled and
    recorded as failed."""
    records = [
        RequestRecord(r.index, r.arrival_s, document=r.document, request_class=r.request_class)
        for r in requests
    ]
    by_index = {r.index: r for r in requests}

    def body_of(record: RequestRecord) -> dict[str, Any]:
        return chat_body(model, corpus.prompt(by_index[record.index]), max_tokens)

    def headers_of(record: RequestRecord) -> dict[str, str]:
        return dict(by_index[record.index].headers)

    return await run_open_loop(
        client,
        route,
        records,
        body_of,
        headers_of=headers_of,
        tag=tag,
        drain_timeout_s=drain_timeout_s,
        clock=clock,
        progress=progress,
        progress_interval_s=progress_interval_s,
    )


# -- summary -------------------------------------------------------------------------------------------
def summarize(
    target: str,
    rate: float,
    records: Sequence[RequestRecord],
    deltas: Mapping[str, ReplicaCounters],
    corpus: Corpus,
    block_size: int,
    partition: tuple[int, int] | None = None,
) -> RunSummary:
    """The row of one run; its ideal is perfect document affinity over the completed requests, and with
    ``partition`` (replicas, KV blocks each) its LRU affinity is that affinity on LRU caches of that size,
    and its ceiling a clairvoyant cache of all their blocks."""
    prompted = [r for r in records if r.ok and r.prompt_tokens is not None]
    documents = [r.document for r in prompted]
    prompts = [r.prompt_tokens or 0 for r in prompted]
    summary = summarize_run(
        target, rate, records, deltas, ideal_hit_rate(documents, corpus.shared_tokens, prompts, block_size)
    )
    placements = cold_placements(records, by_document)
    summary = replace(summary, cold_moved_share=placements.moved, cold_in_place_share=placements.in_place)
    if partition is None or sum(prompts) == 0:
        return summary
    replicas, capacity_blocks = partition
    hits = partitioned_hits(
        documents,
        corpus.shared_tokens,
        prompts,
        block_size,
        replicas=replicas,
        capacity_blocks=capacity_blocks,
    )
    ceiling = ceiling_hits(
        documents, corpus.shared_tokens, prompts, block_size, cache_blocks=replicas * capacity_blocks
    )
    cold = [
        r.ttft_ms
        for r in prompted
        if r.ttft_ms is not None
        and r.cached_tokens is not None
        and mostly_cold(r.prompt_tokens, r.cached_tokens)
    ]
    ceiling_cold = sum(mostly_cold(p, h) for p, h in zip(prompts, ceiling, strict=True))
    return replace(
        summary,
        cache_bound_hit_rate=sum(hits) / sum(prompts),
        ceiling_hit_rate=sum(ceiling) / sum(prompts),
        ceiling_cold_share=ceiling_cold / len(prompts),
        cold_ttft_p50_ms=percentile(cold, 50) if cold else math.nan,
    )


# -- one target ----------------------------------------------------------------------------------------
async def run_target(
    client: httpx.AsyncClient,
    target: Target,
    endpoints: Endpoints,
    corpus: Corpus,
    requests: Sequence[DocQARequest],
    model: str,
    *,
    rate: float,
    max_tokens: int,
    block_size: int,
    partition: tuple[int, int] | None = None,
    drain_timeout_s: float = 60.0,
    progress: ProgressSink | None = None,
    clock: Clock = time.perf_counter,
    received: Received | None = None,
) -> TargetRun[RequestRecord]:
    """Reset the replicas' prefix caches, open the target, run the sequence through it, close it.

    ``partition``: (replicas, KV blocks each), for the summary's LRU affinity. ``received``: the ids each
    replica received (:mod:`burstsched.workloads.placement`), to name the replica of the requests whose
    router does not."""
    tag = f"docqa-{target.label}"

    async def run(route: Route) -> list[RequestRecord]:
        return await run_sequence(
            client,
            route,
            corpus,
            requests,
            model,
            max_tokens=max_tokens,
            tag=tag,
            drain_timeout_s=drain_timeout_s,
            clock=clock,
            progress=progress,
        )

    watch = ReplicaWatch(received)
    records, deltas, router_cpu_s, queue = await measured_run(client, target, endpoints, model, run)
    watch.name(records, tag, [name for name, _ in endpoints])
    summary = with_router_cpu(
        summarize(target.label, rate, records, deltas, corpus, block_size, partition), router_cpu_s
    )
    if queue is not None:
        summary = replace(summary, flow_queue=queue)
    return TargetRun(summary, records, deltas)
