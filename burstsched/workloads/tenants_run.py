"""Running a multi-tenant chat sequence against one target and measuring it.

Open loop (:mod:`burstsched.workloads.open_loop`): each turn goes to ``/v1/chat/completions`` (streamed,
with usage, temperature 0) at its arrival time, or once the same user's previous turn has ended if that
is later (a user reads the answer before typing the next question). The ideal hit rate is perfect
affinity with an infinite cache over the completed requests' prompts, as the serving tokenizer renders
them (:func:`burstsched.workloads.tenants.ideal_hit_rate`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from burstsched.workloads.open_loop import Clock, ProgressSink, measured_run, run_open_loop
from burstsched.workloads.open_loop import RequestRecord as BaseRecord
from burstsched.workloads.placement import Received, ReplicaWatch, by_session, cold_placements
from burstsched.workloads.replica_metrics import ReplicaCounters
from burstsched.workloads.run_summary import RunSummary, TargetRun, summarize_run, with_router_cpu
from burstsched.workloads.stats import percentile
from burstsched.workloads.targets import Endpoints, Route, Target
from burstsched.workloads.tenants import ChatTurn, Tenants, ideal_hit_rate


@dataclass(slots=True)
class TurnRecord(BaseRecord):
    """What one turn did, as the client saw it, and whose turn it was."""

    tenant: int = field(kw_only=True)
    user: int = field(kw_only=True)
    turn: int = field(kw_only=True)
    burst: int | None = field(default=None, kw_only=True)

    @property
    def in_burst(self) -> bool:
        """Arrived in a burst: a burst user's first turn (their later turns come as any user's do)."""
        return self.burst is not None and self.turn == 1

    @property
    def waited(self) -> bool:
        """Sent after its arrival time because the user's previous turn had not ended yet."""
        return self.ready_s is not None and self.ready_s > self.arrival_s

    def labels(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "user": self.user, "turn": self.turn, "burst": self.burst}


def chat_request(model: str, messages: Sequence[Mapping[str, str]], max_tokens: int) -> dict[str, Any]:
    """A turn's body: the whole conversation, streamed with usage, greedy, exactly ``max_tokens`` out."""
    return {
        "model": model,
        "messages": [dict(m) for m in messages],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def records_of(requests: Sequence[ChatTurn]) -> list[TurnRecord]:
    return [
        TurnRecord(r.index, r.arrival_s, tenant=r.tenant, user=r.user, turn=r.turn, burst=r.burst)
        for r in requests
    ]


def summarize(
    target: str,
    rate: float,
    records: Sequence[TurnRecord],
    deltas: Mapping[str, ReplicaCounters],
    prompt_tokens: Sequence[Sequence[int]],
    block_size: int,
) -> RunSummary:
    """The row of one run; ``prompt_tokens[i]`` is request ``i``'s prompt as the replicas tokenize it."""
    completed = [prompt_tokens[r.index] for r in sorted(records, key=lambda r: r.index) if r.ok]
    summary = summarize_run(target, rate, records, deltas, ideal_hit_rate(completed, block_size))
    arrived_in_burst = [r.ttft_ms for r in records if r.ok and r.in_burst and r.ttft_ms is not None]
    others = [r.ttft_ms for r in records if r.ok and not r.in_burst and r.ttft_ms is not None]
    placements = cold_placements(records, by_session)
    return replace(
        summary,
        burst_ttft_p95_ms=percentile(arrived_in_burst, 95),
        other_ttft_p95_ms=percentile(others, 95),
        cold_moved_share=placements.moved,
        cold_in_place_share=placements.in_place,
    )


async def run_target(
    client: httpx.AsyncClient,
    target: Target,
    endpoints: Endpoints,
    tenants: Tenants,
    requests: Sequence[ChatTurn],
    prompt_tokens: Sequence[Sequence[int]],
    model: str,
    *,
    rate: float,
    max_tokens: int,
    block_size: int,
    drain_timeout_s: float = 60.0,
    progress: ProgressSink | None = None,
    clock: Clock = time.perf_counter,
    received: Received | None = None,
) -> TargetRun[TurnRecord]:
    """Reset the replicas' prefix caches, open the target, run the sequence through it, close it.

    ``received``: the ids each replica received (:mod:`burstsched.workloads.placement`), to name the
    replica of the requests whose router does not."""
    by_index = {r.index: r for r in requests}
    tag = f"tenants-{target.label}"

    def body_of(record: TurnRecord) -> dict[str, Any]:
        return chat_request(model, tenants.messages(by_index[record.index]), max_tokens)

    def follows(record: TurnRecord) -> int | None:
        return by_index[record.index].follows

    async def run(route: Route) -> list[TurnRecord]:
        return await run_open_loop(
            client,
            route,
            records_of(requests),
            body_of,
            follows=follows,
            tag=tag,
            drain_timeout_s=drain_timeout_s,
            clock=clock,
            progress=progress,
        )

    watch = ReplicaWatch(received)
    records, deltas, router_cpu_s, queue = await measured_run(client, target, endpoints, model, run)
    watch.name(records, tag, [name for name, _ in endpoints])
    summary = with_router_cpu(
        summarize(target.label, rate, records, deltas, prompt_tokens, block_size), router_cpu_s
    )
    if queue is not None:
        summary = replace(summary, flow_queue=queue)
    return TargetRun(summary, records, deltas)
