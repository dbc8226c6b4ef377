"""One run of a workload through one target, summed up: the report's row and what it was computed from.

Client-side figures (TTFT, end-to-end latency, throughput, failures, where each request landed) come
from the records; replica-side ones (hit rate, prefill tokens computed) from the replicas' counter
deltas; the ideal hit rate from the workload, which knows what its requests share.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Generic, TypeVar

from burstsched.workloads.open_loop import ENDPOINT_HEADER, RequestRecord
from burstsched.workloads.replica_metrics import ReplicaCounters
from burstsched.workloads.stats import percentile, ratio


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One target at one rate: the report's row."""

    target: str
    rate: float
    requests: int
    completed: int
    failures: int
    """Requests that did not complete, refused ones included."""
    refused: int
    """Requests answered with an HTTP error status instead of a stream."""
    hit_rate: float
    ideal_hit_rate: float
    usage_hit_rate: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    ttft_p99_ms: float
    e2e_p50_ms: float
    e2e_p95_ms: float
    e2e_p99_ms: float
    throughput_rps: float
    output_tokens_per_s: float
    prefill_tokens_mean: float
    requests_per_replica: dict[str, int]
    replica_source: str
    makespan_s: float
    send_lag_p99_ms: float
    cache_bound_hit_rate: float = math.nan
    """The workload's hit rate of even, perfect affinity on the replicas' real (LRU) caches, where it has
    one: a yardstick for placement under the cache's size, not a ceiling."""
    ceiling_hit_rate: float = math.nan
    """The most any router could hit with the replicas' caches together, where the workload has one: a
    clairvoyant cache of all their blocks (see :func:`burstsched.workloads.docqa.ceiling_hits`)."""
    ceiling_cold_share: float = math.nan
    """The share of requests that even the ceiling's clairvoyant cache serves mostly cold (more than half the
    prompt computed). Above 5%, every router's TTFT p95 is a cold prefill's."""
    cold_ttft_p50_ms: float = math.nan
    """TTFT p50 of this run's requests that computed more than half their prompt (from their usage)."""
    burst_ttft_p95_ms: float = math.nan
    """TTFT p95 of the requests that arrived in a burst, where the workload has bursts."""
    other_ttft_p95_ms: float = math.nan
    """TTFT p95 of every other request, where the workload has bursts."""
    cold_moved_share: float = math.nan
    """Share of the completed requests served mostly cold on another replica than their document's (or
    session's) previous request went to (:mod:`burstsched.workloads.placement`); nan where a request's
    replica is unknown."""
    cold_in_place_share: float = math.nan
    """Share served mostly cold on the same replica as that previous request (it had been evicted there)."""
    router_cpu_ms: float = math.nan
    """CPU the target's routers spent per completed request over the run (user + system, from ``/proc``,
    their idle work included); nan for client-side routing."""
    flow_queue: Mapping[str, Any] | None = None
    """A burstsched router's flow-control queue over the run, by outcome (``GET /admin/queue``'s
    ``since_start``: requests, longest wait, most overtaken); None: another router, or the queue off."""
    repeat: int = 1
    """Which pass over the targets at this rate the run was (workloads' ``--repeats``), from 1."""

    @property
    def row_label(self) -> str:
        """The target, and its pass when there were several: ``sglang:cache_aware #2``."""
        return self.target if self.repeat == 1 else f"{self.target} #{self.repeat}"

    @property
    def replica_max_over_mean(self) -> float:
        """The busiest replica's requests over the mean per replica (1.0 = perfectly even)."""
        counts = list(self.requests_per_replica.values())
        return ratio(max(counts), sum(counts) / len(counts)) if counts else math.nan

    def as_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def summarize_run(
    target: str,
    rate: float,
    records: Sequence[RequestRecord],
    deltas: Mapping[str, ReplicaCounters],
    ideal_hit_rate: float,
) -> RunSummary:
    """The row of one run: client-side latencies and usage, replica-side hit rate and prefill."""
    ok = [r for r in records if r.ok]
    ttfts = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    e2es = [r.e2e_ms for r in ok if r.e2e_ms is not None]
    starts = [r.sent_s for r in records if r.sent_s is not None]
    ends = [r.sent_s + r.e2e_ms / 1000 for r in ok if r.sent_s is not None and r.e2e_ms is not None]
    makespan = max(ends) - min(starts) if ends and starts else math.nan
    prompted = [r for r in ok if r.prompt_tokens is not None]
    prompt_tokens = [r.prompt_tokens or 0 for r in prompted]
    cached = [r.cached_tokens for r in prompted if r.cached_tokens is not None]
    per_replica, source = per_replica_counts(records, deltas)
    return RunSummary(
        target=target,
        rate=rate,
        requests=len(records),
        completed=len(ok),
        failures=len(records) - len(ok),
        refused=sum(r.refused for r in records),
        hit_rate=ratio(
            sum(d.prefix_hits for d in deltas.values()), sum(d.prefix_queries for d in deltas.values())
        ),
        ideal_hit_rate=ideal_hit_rate,
        usage_hit_rate=ratio(sum(cached), sum(prompt_tokens)) if len(cached) == len(prompted) else math.nan,
        ttft_p50_ms=percentile(ttfts, 50),
        ttft_p95_ms=percentile(ttfts, 95),
        ttft_p99_ms=percentile(ttfts, 99),
        e2e_p50_ms=percentile(e2es, 50),
        e2e_p95_ms=percentile(e2es, 95),
        e2e_p99_ms=percentile(e2es, 99),
        throughput_rps=ratio(len(ok), makespan),
        output_tokens_per_s=ratio(sum(r.completion_tokens or 0 for r in ok), makespan),
        prefill_tokens_mean=ratio(sum(d.prefill_computed_tokens for d in deltas.values()), len(ok)),
        requests_per_replica=per_replica,
        replica_source=source,
        makespan_s=makespan,
        send_lag_p99_ms=percentile([lag for r in records if (lag := send_lag_ms(r)) is not None], 99),
    )


def send_lag_ms(record: RequestRecord) -> float | None:
    """How late the load generator sent a request after it could have been sent (None: never sent)."""
    if record.sent_s is None:
        return None
    ready = record.arrival_s if record.ready_s is None else record.ready_s
    return 1000 * (record.sent_s - ready)


def per_replica_counts(
    records: Sequence[RequestRecord], deltas: Mapping[str, ReplicaCounters]
) -> tuple[dict[str, int], str]:
    """Completed requests per replica, and where that came from: the router's header, the client's own
    choice, the request ids the replicas received, or the replicas' counters when none names a replica."""
    named = [r.replica for r in records if r.ok]
    if named and all(name is not None for name in named):
        counts = Counter(name for name in named if name is not None)
        sources = {r.replica_source for r in records if r.ok and r.replica_source is not None}
        if not sources:  # records built without a source (older JSON, tests)
            sources = {"header" if any(ENDPOINT_HEADER in r.headers for r in records) else "client"}
        return {name: counts.get(name, 0) for name in sorted({*deltas, *counts})}, "+".join(sorted(sources))
    return {name: round(d.requests_finished) for name, d in sorted(deltas.items())}, "counters"


R_co = TypeVar("R_co", bound=RequestRecord, covariant=True)


@dataclass(frozen=True, slots=True)
class TargetRun(Generic[R_co]):
    """A target's run: its row, every request's record, and each replica's counter deltas."""

    summary: RunSummary
    records: Sequence[R_co]
    deltas: dict[str, ReplicaCounters]

    def as_json(self) -> dict[str, Any]:
        return {
            "summary": self.summary.as_json(),
            "replica_deltas": {name: asdict(d) for name, d in self.deltas.items()},
            "requests": [r.as_json() for r in self.records],
        }


def as_repeat(run: TargetRun[R_co], repeat: int) -> TargetRun[R_co]:
    """``run`` marked as the ``repeat``-th pass over the targets at its rate."""
    return replace(run, summary=replace(run.summary, repeat=repeat))


def with_router_cpu(summary: RunSummary, router_cpu_s: float | None) -> RunSummary:
    """``summary`` with the routers' CPU per completed request, when there are routers and completions."""
    if router_cpu_s is None or summary.completed == 0:
        return summary
    return replace(summary, router_cpu_ms=1000.0 * router_cpu_s / summary.completed)
