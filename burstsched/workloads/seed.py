"""The seed experiment (workloads.md §1): follow-up affinity of pairs sharing a ~5200-token context.

A pair sends ``C + question 1`` and, once it is complete, ``C + question 2`` through the router under
test, at global concurrency 1, so the replica whose ``vllm:request_success_total`` grew served the
request. The report is about the second request of each pair.
"""

from __future__ import annotations

import statistics
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from burstsched.workloads.contexts import sized_context
from burstsched.workloads.replica_metrics import ReplicaCounters, read_counters
from burstsched.workloads.stats import percentile, ratio
from burstsched.workloads.stream_client import StreamResult, chat_body, stream_chat

QUESTIONS = (
    "\nQuestion: Summarize the observations.",
    "\nQuestion: Which measurements should engineers collect next?",
)


@dataclass(frozen=True, slots=True)
class Replica:
    name: str
    url: str


@dataclass(frozen=True, slots=True)
class Served:
    """One request: who served it, its stream, and its replica's counter deltas."""

    replica: str
    result: StreamResult
    delta: ReplicaCounters


@dataclass(frozen=True, slots=True)
class PairRecord:
    first: Served
    second: Served

    @property
    def returned(self) -> bool:
        return self.first.replica == self.second.replica


@dataclass(frozen=True, slots=True)
class PolicySummary:
    """The seed table's row for one policy."""

    policy: str
    pairs: int
    returned: int
    hit_rate: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    prefill_tokens_mean: float
    warm_ttft_p50_ms: float
    cold_ttft_p50_ms: float
    first_requests_per_replica: dict[str, int]

    def as_json(self) -> dict[str, Any]:
        return {
            "returned": self.returned,
            "pairs": self.pairs,
            "hit_rate": self.hit_rate,
            "ttft_p50_ms": self.ttft_p50_ms,
            "ttft_p95_ms": self.ttft_p95_ms,
            "prefill_tokens_mean": self.prefill_tokens_mean,
            "warm_ttft_p50_ms": self.warm_ttft_p50_ms,
            "cold_ttft_p50_ms": self.cold_ttft_p50_ms,
            "first_requests_per_replica": self.first_requests_per_replica,
        }


class AttributionError(RuntimeError):
    """No replica, or more than one, finished a request sent at concurrency 1."""


async def _snapshot(client: httpx.AsyncClient, replicas: Sequence[Replica]) -> dict[str, ReplicaCounters]:
    return {r.name: await read_counters(client, r.url) for r in replicas}


async def send_attributed(
    client: httpx.AsyncClient,
    router_url: str,
    replicas: Sequence[Replica],
    body: dict[str, Any],
    request_id: str,
) -> Served:
    """Send one request through the router and find the replica that served it from metric deltas."""
    before = await _snapshot(client, replicas)
    result = await stream_chat(client, router_url, body, request_id)
    if result.status != 200 or result.error is not None:
        raise AttributionError(f"request {request_id} failed: {result.status} {result.error}")
    after = await _snapshot(client, replicas)
    deltas = {name: after[name] - before[name] for name in after}
    grown = [name for name, d in deltas.items() if d.requests_finished > 0]
    if len(grown) != 1:
        raise AttributionError(f"request {request_id}: finished on {grown or 'no replica'}")
    return Served(replica=grown[0], result=result, delta=deltas[grown[0]])


async def make_contexts(
    client: httpx.AsyncClient, replica: Replica, model: str, count: int, target_tokens: int, tag: str
) -> list[str]:
    """``count`` fresh contexts of at least ``target_tokens`` tokens as the replica tokenizes them."""

    async def count_tokens(text: str) -> int:
        body = {"model": model, "messages": [{"role": "user", "content": text + QUESTIONS[0]}]}
        response = await client.post(f"{replica.url}/tokenize", json=body)
        response.raise_for_status()
        return int(response.json()["count"])

    return [
        await sized_context(f"{tag}-{i}-{uuid.uuid4().hex[:8]}", target_tokens, i, count_tokens)
        for i in range(count)
    ]


async def run_pairs(
    client: httpx.AsyncClient,
    router_url: str,
    replicas: Sequence[Replica],
    contexts: Sequence[str],
    model: str,
    max_tokens: int = 32,
) -> list[PairRecord]:
    """Run one pair per context through the router, one request at a time."""
    records = []
    for index, context in enumerate(contexts):
        served = []
        for question in QUESTIONS:
            body = chat_body(model, context + question, max_tokens)
            request_id = f"seed-{index}-{uuid.uuid4().hex[:12]}"
            served.append(await send_attributed(client, router_url, replicas, body, request_id))
        records.append(PairRecord(first=served[0], second=served[1]))
    return records


def summarize(policy: str, records: Sequence[PairRecord]) -> PolicySummary:
    """The seed table's row, computed over the second request of each pair."""
    seconds = [r.second for r in records]
    ttfts = [s.result.ttft_s * 1000 for s in seconds if s.result.ttft_s is not None]
    warm = [r.second.result.ttft_s * 1000 for r in records if r.returned and r.second.result.ttft_s]
    cold = [r.second.result.ttft_s * 1000 for r in records if not r.returned and r.second.result.ttft_s]
    firsts: dict[str, int] = {}
    for record in records:
        firsts[record.first.replica] = firsts.get(record.first.replica, 0) + 1
    return PolicySummary(
        policy=policy,
        pairs=len(records),
        returned=sum(r.returned for r in records),
        hit_rate=ratio(
            sum(s.delta.prefix_hits for s in seconds), sum(s.delta.prefix_queries for s in seconds)
        ),
        ttft_p50_ms=percentile(ttfts, 50),
        ttft_p95_ms=percentile(ttfts, 95),
        prefill_tokens_mean=statistics.fmean(s.delta.prefill_computed_tokens for s in seconds)
        if seconds
        else float("nan"),
        warm_ttft_p50_ms=percentile(warm, 50),
        cold_ttft_p50_ms=percentile(cold, 50),
        first_requests_per_replica=dict(sorted(firsts.items())),
    )


def format_table(summaries: Sequence[PolicySummary]) -> str:
    """The seed table, one column per policy."""
    rows: list[tuple[str, ...]] = [("follow-up request", *(s.policy for s in summaries))]

    def ms(value: float) -> str:
        return "-" if value != value else f"{value:.1f}"

    rows.append(
        (
            "returned to the first replica",
            *(f"{s.returned}/{s.pairs} ({100 * s.returned / s.pairs:.1f}%)" for s in summaries),
        )
    )
    rows.append(("prefix token hit rate", *(f"{100 * s.hit_rate:.2f}%" for s in summaries)))
    rows.append(("TTFT p50 / p95 (ms)", *(f"{ms(s.ttft_p50_ms)} / {ms(s.ttft_p95_ms)}" for s in summaries)))
    rows.append(("prefill tokens computed (mean)", *(f"{s.prefill_tokens_mean:.1f}" for s in summaries)))
    rows.append(
        (
            "TTFT p50 warm / cold replica (ms)",
            *(f"{ms(s.warm_ttft_p50_ms)} / {ms(s.cold_ttft_p50_ms)}" for s in summaries),
        )
    )
    rows.append(
        (
            "first requests per replica",
            *("/".join(str(n) for n in s.first_requests_per_replica.values()) for s in summaries),
        )
    )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        lines.append("| " + " | ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) + " |")
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)
