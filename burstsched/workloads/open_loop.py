"""Sending a planned request sequence open loop and recording what each request did.

Each request is sent at its arrival time whatever happened to the ones before (a request may instead be
told to follow an earlier one: it then also waits until that one has finished, as a chat user waits for
the answer before typing the next turn), streamed to its end, and recorded with its client-side TTFT
(sending → the first chunk carrying a choice, i.e. the first token; the first non-empty text is recorded
apart), its usage (``prompt_tokens``,
``prompt_tokens_details.cached_tokens``), every ``x-burstsched-*`` response header and a ``Retry-After``.
A request may carry headers of its own (``headers_of``: its priority, its tenant).
:func:`measured_run` wraps a run in the replicas' counter snapshots, after resetting their prefix caches.
The workloads (document QA, the multi-tenant chat) say what each request's body is.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import httpx

from burstsched.workloads.quiet_gc import quiet_gc
from burstsched.workloads.replica_metrics import ReplicaCounters
from burstsched.workloads.replica_state import reset_prefix_caches, settled_snapshot, snapshot
from burstsched.workloads.router_cpu import router_pids, routers_cpu_seconds
from burstsched.workloads.stream_client import stream_chat
from burstsched.workloads.targets import Dispatch, Endpoints, Route, Target

HEADER_PREFIX = "x-burstsched-"
KEPT_HEADERS = frozenset({"retry-after"})
"""Response headers recorded besides the ``x-burstsched-*`` ones (a refusal's ``Retry-After``)."""
ENDPOINT_HEADER = "x-burstsched-endpoint"
Clock = Callable[[], float]


@dataclass(slots=True)
class RequestRecord:
    """What one request of a sequence did, as the client saw it. Workloads subclass it to add who sent
    the request (keyword-only fields) and list those in :meth:`labels`."""

    index: int
    arrival_s: float
    ready_s: float | None = None
    """When it could be sent: its arrival, or later if the request it follows had not finished by then."""
    sent_s: float | None = None
    status: int | None = None
    ttft_ms: float | None = None
    """Sending to the first token (the first chunk carrying a choice)."""
    first_content_ms: float | None = None
    """Sending to the first non-empty text; later than ``ttft_ms`` when the first tokens decode to none."""
    e2e_ms: float | None = None
    replica: str | None = None
    replica_source: str | None = None
    """Who named ``replica``: ``client`` (client-side routing), ``header`` (the router's
    ``x-burstsched-endpoint``) or ``replicas`` (the request ids the replicas received)."""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and self.ttft_ms is not None

    @property
    def refused(self) -> bool:
        """Answered with an HTTP error status instead of a stream (turned away by the router or replica)."""
        return self.status is not None and self.status != 200

    def labels(self) -> dict[str, Any]:
        """The workload's own fields of the record (for its JSON line)."""
        return {}

    def as_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            **self.labels(),
            "arrival_s": round(self.arrival_s, 6),
            "ready_s": None if self.ready_s is None else round(self.ready_s, 6),
            "sent_s": None if self.sent_s is None else round(self.sent_s, 6),
            "status": self.status,
            "ttft_ms": self.ttft_ms,
            "first_content_ms": self.first_content_ms,
            "e2e_ms": self.e2e_ms,
            "replica": self.replica,
            "replica_source": self.replica_source,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "headers": self.headers,
            "error": self.error,
        }


R = TypeVar("R", bound=RequestRecord)


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
class _Slot:
    """A record, whether its request has finished, and the event its followers wait on."""

    value: RequestRecord
    done: anyio.Event
    finished: bool = False


async def send_chat(
    client: httpx.AsyncClient,
    dispatch: Dispatch,
    body: Mapping[str, Any],
    record: RequestRecord,
    request_id: str,
    clock: Clock,
    headers: Mapping[str, str] | None = None,
) -> None:
    """Stream one chat completion to ``dispatch``, with ``headers`` besides its id, and fill ``record``
    with what came back."""
    try:
        result = await stream_chat(client, dispatch.base_url, dict(body), request_id, clock, headers)
    except (httpx.HTTPError, ValueError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"[:300]
        return
    record.status = result.status
    record.ttft_ms = None if result.ttft_s is None else result.ttft_s * 1000
    record.first_content_ms = None if result.first_content_s is None else result.first_content_s * 1000
    record.e2e_ms = result.e2e_s * 1000
    record.headers = {k: v for k, v in result.headers.items() if _kept(k.lower())}
    record.replica = dispatch.replica or record.headers.get(ENDPOINT_HEADER)
    if record.replica is not None:
        record.replica_source = "client" if dispatch.replica else "header"
    usage = result.usage or {}
    record.prompt_tokens = _int_or_none(usage.get("prompt_tokens"))
    record.completion_tokens = _int_or_none(usage.get("completion_tokens"))
    record.cached_tokens = result.cached_tokens
    if result.error is not None:
        record.error = str(result.error.get("message", result.error))[:300]
    elif result.status == 200 and result.ttft_s is None:
        record.error = "stream ended without a token"


def _kept(header: str) -> bool:
    return header.startswith(HEADER_PREFIX) or header in KEPT_HEADERS


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) else None


def request_id(tag: str, index: int) -> str:
    """The ``X-Request-Id`` :func:`run_open_loop` sends with the request at ``index`` of a run ``tag``."""
    return f"{tag}-{index}"


async def run_open_loop(
    client: httpx.AsyncClient,
    route: Route,
    records: Sequence[R],
    body_of: Callable[[R], Mapping[str, Any]],
    *,
    follows: Callable[[R], int | None] | None = None,
    headers_of: Callable[[R], Mapping[str, str]] | None = None,
    tag: str,
    drain_timeout_s: float = 60.0,
    clock: Clock = time.perf_counter,
    progress: ProgressSink | None = None,
    progress_interval_s: float = 0.5,
) -> list[R]:
    """Send each record's request (``body_of``) at its ``arrival_s`` (``records`` in arrival order, each
    ``index`` its position); with ``follows``, a request also waits for the earlier one at the position
    it names to finish; with ``headers_of``, each request also sends the headers it names. Waits for
    all, at most ``drain_timeout_s`` after the last arrival; a request still running or waiting then is
    cancelled and recorded as failed. The collector is kept quiet meanwhile
    (:func:`~burstsched.workloads.quiet_gc.quiet_gc`)."""
    with quiet_gc():
        start = clock()
        last_arrival = records[-1].arrival_s if records else 0.0
        slots = [_Slot(r, anyio.Event()) for r in records]

        async def one(record: R, slot: _Slot) -> None:
            leader = None if follows is None else follows(record)
            if leader is not None and not slots[leader].finished:
                await slots[leader].done.wait()
                record.ready_s = max(record.arrival_s, clock() - start)
            else:
                record.ready_s = record.arrival_s
            record.sent_s = clock() - start
            dispatch = route(record.index)
            try:
                rid = request_id(tag, record.index)
                extra = None if headers_of is None else headers_of(record)
                await send_chat(client, dispatch, body_of(record), record, rid, clock, extra)
                slot.finished = True
            finally:
                slot.done.set()

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
                    for record, slot in zip(records, slots, strict=True):
                        delay = record.arrival_s - (clock() - start)
                        if delay > 0:
                            await anyio.sleep(delay)
                        tg.start_soon(one, record, slot)
                senders.cancel_scope.cancel()
        for slot in slots:
            if not slot.finished:
                slot.value.error = slot.value.error or "not finished within the drain timeout"
        report()
        return list(records)


async def measured_run(
    client: httpx.AsyncClient,
    target: Target,
    endpoints: Endpoints,
    model: str,
    run: Callable[[Route], Awaitable[list[R]]],
) -> tuple[list[R], dict[str, ReplicaCounters], float | None, dict[str, Any] | None]:
    """Reset the replicas' prefix caches, open the target, ``run`` the sequence through it between two
    counter snapshots, close it. Returns the records, each replica's counter deltas, the CPU seconds
    the target's routers spent meanwhile (:mod:`burstsched.workloads.router_cpu`; None for client-side
    routing) and a burstsched router's flow-queue tally (:func:`flow_queue_tally`)."""
    await reset_prefix_caches(client, [url for _, url in endpoints], model=model)
    async with target.open(endpoints) as route:
        routers = await anyio.to_thread.run_sync(router_pids, route)
        cpu_before = None if routers is None else await anyio.to_thread.run_sync(routers_cpu_seconds, routers)
        before = await snapshot(client, endpoints)
        records = await run(route)
        finished = sum(r.ok for r in records)
        after = await settled_snapshot(client, endpoints, before, finished)
        cpu_after = None if routers is None else await anyio.to_thread.run_sync(routers_cpu_seconds, routers)
        queue = None if routers is None else await flow_queue_tally(client, route(0).base_url)
    spent = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    return records, {name: after[name] - before[name] for name in after}, spent, queue


async def flow_queue_tally(client: httpx.AsyncClient, base_url: str) -> dict[str, Any] | None:
    """A burstsched router's flow-control queue since it started, by outcome (requests, longest wait,
    most overtaken: ``GET /admin/queue``'s ``since_start``); None for another router or the queue off."""
    try:
        response = await client.get(f"{base_url}/admin/queue", timeout=5.0)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    tally = response.json().get("since_start")
    return tally if isinstance(tally, dict) else None
