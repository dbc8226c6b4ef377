"""Running a document-QA sequence against one target and measuring it.

Open loop: each request is sent at its arrival time whatever happened to the ones before, streamed to its
end, and recorded with its client-side TTFT (sending → first non-empty ``delta.content``), its usage
(``prompt_tokens``, ``prompt_tokens_details.cached_tokens``) and every ``x-burstsched-*`` response header.
The replicas' ``/metrics`` counters before and after the run give the hit rate (Σ Δhits / Σ Δqueries),
the prefill tokens computed and, where no header names the replica, the requests each replica served.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio
import httpx
from prometheus_client.parser import text_string_to_metric_families

from burstsched.workloads.docqa import Corpus, DocQARequest, ideal_hit_rate
from burstsched.workloads.replica_metrics import ReplicaCounters, read_counters
from burstsched.workloads.stats import percentile, ratio
from burstsched.workloads.stream_client import chat_body, stream_chat
from burstsched.workloads.targets import Endpoints, Route, Target

HEADER_PREFIX = "x-burstsched-"
ENDPOINT_HEADER = "x-burstsched-endpoint"
Clock = Callable[[], float]


@dataclass(slots=True)
class RequestRecord:
    """What one request of the sequence did, as the client saw it."""

    index: int
    document: int
    arrival_s: float
    sent_s: float | None = None
    status: int | None = None
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    replica: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and self.ttft_ms is not None

    def as_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "document": self.document,
            "arrival_s": round(self.arrival_s, 6),
            "sent_s": None if self.sent_s is None else round(self.sent_s, 6),
            "status": self.status,
            "ttft_ms": self.ttft_ms,
            "e2e_ms": self.e2e_ms,
            "replica": self.replica,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "headers": self.headers,
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class Progress:
    """Live counts while a sequence runs."""

    sent: int
    done: int
    failed: int
    total: int
    elapsed_s: float


ProgressSink = Callable[[Progress], None]


@dataclass(slots=True)
class RecordSlot:
    """A record and whether its request has finished (for progress and the drain deadline)."""

    value: RequestRecord
    finished: bool = False


async def _send(
    client: httpx.AsyncClient,
    route: Route,
    corpus: Corpus,
    request: DocQARequest,
    record: RequestRecord,
    model: str,
    max_tokens: int,
    tag: str,
    clock: Clock,
) -> None:
    dispatch = route(request.index)
    body = chat_body(model, corpus.prompt(request), max_tokens)
    try:
        result = await stream_chat(client, dispatch.base_url, body, f"{tag}-{request.index}", clock)
    except (httpx.HTTPError, ValueError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"[:300]
        return
    record.status = result.status
    record.ttft_ms = None if result.ttft_s is None else result.ttft_s * 1000
    record.e2e_ms = result.e2e_s * 1000
    record.headers = {k: v for k, v in result.headers.items() if k.lower().startswith(HEADER_PREFIX)}
    record.replica = dispatch.replica or record.headers.get(ENDPOINT_HEADER)
    usage = result.usage or {}
    record.prompt_tokens = _int_or_none(usage.get("prompt_tokens"))
    record.completion_tokens = _int_or_none(usage.get("completion_tokens"))
    record.cached_tokens = result.cached_tokens
    if result.error is not None:
        record.error = str(result.error.get("message", result.error))[:300]
    elif result.status == 200 and result.ttft_s is None:
        record.error = "stream ended without content"


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) else None


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
    """Send every request at its arrival time (open loop); wait for all, at most ``drain_timeout_s`` after
    the last arrival; a request still running then is cancelled and recorded as failed."""
    records = [RequestRecord(r.index, r.document, r.arrival_s) for r in requests]
    start = clock()
    last_arrival = requests[-1].arrival_s if requests else 0.0

    slots = [RecordSlot(r) for r in records]

    async def one(request: DocQARequest, slot: RecordSlot) -> None:
        slot.value.sent_s = clock() - start
        await _send(client, route, corpus, request, slot.value, model, max_tokens, tag, clock)
        slot.finished = True

    def report() -> None:
        if progress is not None:
            done = sum(s.finished for s in slots)
            failed = sum(1 for s in slots if s.finished and not s.value.ok)
            sent = sum(1 for s in slots if s.value.sent_s is not None)
            progress(Progress(sent, done, failed, len(slots), clock() - start))

    async def reporter() -> None:
        while True:
            report()
            await anyio.sleep(progress_interval_s)

    with anyio.move_on_after(last_arrival + drain_timeout_s + 1.0):
        async with anyio.create_task_group() as senders:
            senders.start_soon(reporter)
            async with anyio.create_task_group() as tg:
                for request, slot in zip(requests, slots, strict=True):
                    delay = request.arrival_s - (clock() - start)
                    if delay > 0:
                        await anyio.sleep(delay)
                    tg.start_soon(one, request, slot)
            senders.cancel_scope.cancel()
    for slot in slots:
        if not slot.finished:
            slot.value.error = slot.value.error or "not finished within the drain timeout"
    report()
    return records


# -- replica counters ----------------------------------------------------------------------------------
async def snapshot(client: httpx.AsyncClient, endpoints: Endpoints) -> dict[str, ReplicaCounters]:
    """Every replica's counters, by replica name."""
    return {name: await read_counters(client, url) for name, url in endpoints}


async def settled_snapshot(
    client: httpx.AsyncClient,
    endpoints: Endpoints,
    before: Mapping[str, ReplicaCounters],
    finished: int,
    timeout_s: float = 10.0,
) -> dict[str, ReplicaCounters]:
    """Counters once ``finished`` more requests count as finished (they land just after a stream ends),
    or whatever they are after ``timeout_s``."""
    after = await snapshot(client, endpoints)
    with anyio.move_on_after(timeout_s):
        while sum(after[n].requests_finished - before[n].requests_finished for n in after) < finished:
            await anyio.sleep(0.05)
            after = await snapshot(client, endpoints)
    return after


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """A replica's KV-cache geometry from ``vllm:cache_config_info``."""

    block_size: int
    num_gpu_blocks: int


async def read_cache_config(client: httpx.AsyncClient, base_url: str) -> CacheConfig:
    response = await client.get(f"{base_url}/metrics")
    response.raise_for_status()
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name.startswith("vllm:cache_config_info"):
                labels = sample.labels
                return CacheConfig(int(labels["block_size"]), int(labels.get("num_gpu_blocks") or 0))
    raise ValueError(f"{base_url}/metrics has no vllm:cache_config_info")


class ResetError(RuntimeError):
    """A replica would not reset its prefix cache in time."""


async def reset_prefix_caches(
    client: httpx.AsyncClient,
    urls: Sequence[str],
    timeout_s: float = 60.0,
    interval_s: float = 0.2,
    *,
    model: str | None = None,
) -> None:
    """POST ``/reset_prefix_cache`` to each replica until it answers ``{"success": true}`` (vLLM refuses
    while requests hold blocks); :class:`ResetError` after ``timeout_s``.

    With ``model``, one one-token request then goes to each replica: vLLM publishes the reset's
    ``AllBlocksCleared`` event with its next engine step, and an idle engine runs none, so a router that
    follows (or replays) the events would otherwise still believe the replica holds what it held before."""
    for url in urls:
        last = ""
        with anyio.move_on_after(timeout_s):
            while True:
                try:
                    response = await client.post(f"{url}/reset_prefix_cache")
                    last = f"{response.status_code} {response.text[:200]}"
                    if response.status_code == 200 and _success(response):
                        break
                except httpx.HTTPError as exc:
                    last = repr(exc)
                await anyio.sleep(interval_s)
            continue
        raise ResetError(f"{url}: prefix cache not reset after {timeout_s} s (last answer: {last})")
    if model is not None:
        for url in urls:
            body = {"model": model, "prompt": "reset", "max_tokens": 1}
            (await client.post(f"{url}/v1/completions", json=body)).raise_for_status()


def _success(response: httpx.Response) -> bool:
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("success") is True


# -- summary -------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RunSummary:
    """One target at one rate: the report's row."""

    target: str
    rate: float
    requests: int
    completed: int
    failures: int
    hit_rate: float
    ideal_hit_rate: float
    usage_hit_rate: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    ttft_p99_ms: float
    throughput_rps: float
    output_tokens_per_s: float
    prefill_tokens_mean: float
    requests_per_replica: dict[str, int]
    replica_source: str
    makespan_s: float
    send_lag_p99_ms: float

    def as_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def summarize(
    target: str,
    rate: float,
    records: Sequence[RequestRecord],
    deltas: Mapping[str, ReplicaCounters],
    corpus: Corpus,
    block_size: int,
) -> RunSummary:
    """The row of one run: client-side latencies and usage, replica-side hit rate and prefill."""
    ok = [r for r in records if r.ok]
    ttfts = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    starts = [r.sent_s for r in records if r.sent_s is not None]
    ends = [r.sent_s + r.e2e_ms / 1000 for r in ok if r.sent_s is not None and r.e2e_ms is not None]
    makespan = max(ends) - min(starts) if ends and starts else math.nan
    prompted = [r for r in ok if r.prompt_tokens is not None]
    prompt_tokens = [r.prompt_tokens or 0 for r in prompted]
    cached = [r.cached_tokens for r in prompted if r.cached_tokens is not None]
    per_replica, source = _per_replica(records, deltas)
    return RunSummary(
        target=target,
        rate=rate,
        requests=len(records),
        completed=len(ok),
        failures=len(records) - len(ok),
        hit_rate=ratio(
            sum(d.prefix_hits for d in deltas.values()), sum(d.prefix_queries for d in deltas.values())
        ),
        ideal_hit_rate=ideal_hit_rate(
            [r.document for r in prompted], corpus.shared_tokens, prompt_tokens, block_size
        ),
        usage_hit_rate=ratio(sum(cached), sum(prompt_tokens)) if len(cached) == len(prompted) else math.nan,
        ttft_p50_ms=percentile(ttfts, 50),
        ttft_p95_ms=percentile(ttfts, 95),
        ttft_p99_ms=percentile(ttfts, 99),
        throughput_rps=ratio(len(ok), makespan),
        output_tokens_per_s=ratio(sum(r.completion_tokens or 0 for r in ok), makespan),
        prefill_tokens_mean=ratio(sum(d.prefill_computed_tokens for d in deltas.values()), len(ok)),
        requests_per_replica=per_replica,
        replica_source=source,
        makespan_s=makespan,
        send_lag_p99_ms=percentile(
            [1000 * (r.sent_s - r.arrival_s) for r in records if r.sent_s is not None], 99
        ),
    )


def _per_replica(
    records: Sequence[RequestRecord], deltas: Mapping[str, ReplicaCounters]
) -> tuple[dict[str, int], str]:
    named = [r.replica for r in records if r.ok]
    if named and all(name is not None for name in named):
        counts = Counter(name for name in named if name is not None)
        source = "header" if any(ENDPOINT_HEADER in r.headers for r in records) else "client"
        return {name: counts.get(name, 0) for name in sorted({*deltas, *counts})}, source
    return {name: round(d.requests_finished) for name, d in sorted(deltas.items())}, "counters"


# -- one target ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TargetRun:
    """A target's run: its row, every request's record, and each replica's counter deltas."""

    summary: RunSummary
    records: list[RequestRecord]
    deltas: dict[str, ReplicaCounters]

    def as_json(self) -> dict[str, Any]:
        return {
            "summary": self.summary.as_json(),
            "replica_deltas": {name: asdict(d) for name, d in self.deltas.items()},
            "requests": [r.as_json() for r in self.records],
        }


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
    drain_timeout_s: float = 60.0,
    progress: ProgressSink | None = None,
    clock: Clock = time.perf_counter,
) -> TargetRun:
    """Reset the replicas' prefix caches, open the target, run the sequence through it, close it."""
    await reset_prefix_caches(client, [url for _, url in endpoints], model=model)
    async with target.open(endpoints) as route:
        before = await snapshot(client, endpoints)
        records = await run_sequence(
            client,
            route,
            corpus,
            requests,
            model,
            max_tokens=max_tokens,
            tag=f"docqa-{target.label}",
            drain_timeout_s=drain_timeout_s,
            clock=clock,
            progress=progress,
        )
        finished = sum(r.ok for r in records)
        after = await settled_snapshot(client, endpoints, before, finished)
    deltas = {name: after[name] - before[name] for name in after}
    return TargetRun(summarize(target.label, rate, records, deltas, corpus, block_size), records, deltas)
