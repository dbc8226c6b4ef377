"""Replaying a trace through one router config as a discrete-event simulation, in one process.

The router (its real ASGI app: admission, scheduler, plugins, dispatch, pool, KV-event hub), the simulated
replicas (:class:`~burstsched.sim.inprocess.InProcessReplica`) and the client all run on one
:class:`~burstsched.replay.virtual_time.VirtualTimeLoop`. HTTP between them is in-process
(:class:`~burstsched.replay.asgi_io.AsgiUpstream`) and the replicas' KV events go straight to the router's
hub, so nothing waits on a socket and the clock jumps from one event to the next: a replay takes the CPU
time its events cost, not the trace's duration, and gives the same figures on a fast or a slow machine.

What it leaves out: the router's own CPU time (zero virtual time between two events; on a live pool it adds
to every TTFT) and the network. :mod:`burstsched.replay.runner` replays in real time over sockets when
those matter.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import random
import re
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from starlette.types import ASGIApp

from burstsched.admission.clock import LoopClock
from burstsched.config import EndpointConfig, RouterConfig
from burstsched.config.loader import with_tokenizer
from burstsched.front.app import create_app
from burstsched.kvcache import KVEventHub
from burstsched.prefix.kv_events import EventBatch, KVEvent
from burstsched.replay.asgi_io import AsgiUpstream, lifespan
from burstsched.replay.rebuild import rebuild_prompts
from burstsched.replay.runner import ReplayOptions, ReplayResult, completion_body, sim_config, summarize
from burstsched.replay.trace import TracedRequest
from burstsched.replay.virtual_time import run_virtual
from burstsched.sim import SimConfig
from burstsched.sim.inprocess import InProcessReplica
from burstsched.wire.sse import DONE, aiter_data
from burstsched.workloads.replica_state import settled_snapshot, snapshot

_ROUTER = "http://router.replay"


def _url(name: str) -> str:
    return f"http://{name}.replay:8000"


def virtual_config(config: RouterConfig, names: Sequence[str], record_to: Path | None = None) -> RouterConfig:
    """``config`` as the in-process replay runs it: the in-process replicas as its endpoints, events fed in
    process (no ZMQ address), prompts tokenized by a replica; no recording but to ``record_to`` (with the
    decisions), never to the config's own path."""
    kv_events = config.kv_events.model_copy(update={"endpoint_template": None, "replay_template": None})
    recording = config.recording.model_copy(
        update={"enabled": False}
        if record_to is None
        else {"enabled": True, "path": str(record_to), "decisions": True, "include_text": False}
    )
    routed = config.model_copy(
        update={
            "endpoints": [EndpointConfig(url=_url(name), name=name) for name in names],
            "kv_events": kv_events,
            "recording": recording,
            "discovery": config.discovery.model_copy(update={"source": "static"}),
        }
    )
    return with_tokenizer(routed, "remote")


def record_file_name(label: str) -> str:
    """The file a config's replayed router records to, named after its label."""
    return re.sub(r"[^A-Za-z0-9._=,+-]+", "_", label).strip("_") + ".jsonl"


class _EventFeed:
    """Each replica's KV-event batches, numbered per replica, handed to the router's hub once it exists."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self._seq: dict[str, int] = {}
        self.hub: KVEventHub | None = None

    def sink(self, name: str) -> Callable[[list[KVEvent]], None]:
        def publish(events: list[KVEvent]) -> None:
            hub = self.hub
            if hub is None or not events:
                return
            seq = self._seq.get(name, 0)
            self._seq[name] = seq + 1
            hub.batch(name, seq, EventBatch(self._now(), tuple(events), 0))

        return publish


async def _send(
    client: AsgiUpstream, url: str, body: bytes, request_id: str, now: Callable[[], float]
) -> tuple[bool, float | None]:
    """Stream one completion through the router; (succeeded, seconds to the first text)."""
    start = now()
    headers = [(b"content-type", b"application/json"), (b"x-request-id", request_id.encode())]
    try:
        response = await client.request("POST", url, headers, body, {})
    except httpx.HTTPError:
        return False, None
    first: float | None = None
    done = False
    try:
        if response.status != 200:
            return False, None
        async for data in aiter_data(response.iter_body()):
            if data == DONE:
                done = True
                continue
            if first is None and any(c.get("text") for c in json.loads(data).get("choices") or []):
                first = now() - start
    except httpx.HTTPError:
        return False, None
    finally:
        await response.aclose()
    return done, first


async def flow_outcomes(client: AsgiUpstream) -> tuple[dict[str, int], float]:
    """Requests the router's flow-control queue held, by how they left it, and the seconds they waited there
    in all, from the router's /metrics."""
    response = await client.request("GET", f"{_ROUTER}/metrics", [], b"", {})
    try:
        if response.status != 200:  # an admin key the replay does not have
            return {}, 0.0
        text = b"".join([chunk async for chunk in response.iter_body()]).decode()
    finally:
        await response.aclose()
    counts: dict[str, int] = {}
    waited = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != "burstsched_flow_queue_wait_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_count") and sample.value:
                outcome = sample.labels["outcome"]
                counts[outcome] = counts.get(outcome, 0) + round(sample.value)
            elif sample.name.endswith("_sum"):
                waited += sample.value
    return dict(sorted(counts.items())), waited


class RecordedPlacement:
    """In place of a router config: each request goes straight to the replica standing for the endpoint it
    was recorded on (the recorded endpoints, sorted by name, are ``sim-0``, ``sim-1``, ...). Its row shows
    what the simulator makes of the recorded placement, apart from any router's decisions."""

    label = "recorded placement"

    @staticmethod
    def replicas(requests: Sequence[TracedRequest]) -> dict[str | None, str]:
        """Recorded endpoint → simulated replica name."""
        names = sorted({r.endpoint for r in requests if r.endpoint is not None})
        mapping: dict[str | None, str] = {name: f"sim-{i}" for i, name in enumerate(names)}
        mapping[None] = "sim-0"
        return mapping


async def replay_virtual(
    label: str,
    config: RouterConfig | RecordedPlacement,
    requests: Sequence[TracedRequest],
    prompts: Sequence[str],
    options: ReplayOptions,
) -> ReplayResult:
    """Replay every request through ``config`` on fresh in-process replicas, on the running virtual loop."""
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    clock = LoopClock()
    names = [f"sim-{i}" for i in range(options.replicas)]
    feed = _EventFeed(loop.time)
    sim = sim_config(options, SimConfig(time_scale=1.0))
    replicas = [
        InProcessReplica(replace(sim, name=n), name=n, clock=clock, event_sink=feed.sink(n)) for n in names
    ]
    apps: dict[str, ASGIApp] = {_url(r.name): r.app for r in replicas}
    endpoints = [(r.name, _url(r.name)) for r in replicas]
    ttfts: dict[int, float] = {}
    ok = 0
    async with AsyncExitStack() as stack:
        for replica in replicas:
            await stack.enter_async_context(replica)
        if isinstance(config, RecordedPlacement):
            placed = config.replicas(requests)
            if len(set(placed.values())) > options.replicas:
                raise ValueError(f"the trace has {len(placed) - 1} endpoints: replay it on as many replicas")
            targets = [f"{_url(placed[r.endpoint])}/v1/completions" for r in requests]
        else:
            record_to = None if options.record_dir is None else options.record_dir / record_file_name(label)
            routed = virtual_config(config, names, record_to)
            rng = random.Random(options.text_seed)  # the pickers' random choices move with the seed too
            app = create_app(
                routed, upstream=AsgiUpstream(apps), clock=loop.time, rng=rng, kv_events_in_process=True
            )
            await stack.enter_async_context(lifespan(app))
            hub = app.state.router.hub
            if hub is not None:
                for name in names:
                    hub.follow_in_process(name)
                feed.hub = hub
            apps[_ROUTER] = app
            targets = [f"{_ROUTER}/v1/completions"] * len(requests)
        mounts = {_url(r.name): httpx.ASGITransport(app=r.app) for r in replicas}
        scrape = await stack.enter_async_context(httpx.AsyncClient(mounts=mounts))
        before = await snapshot(scrape, endpoints)
        client = AsgiUpstream(apps)
        model = sim.served_model_name
        origin = loop.time()

        async def one(index: int) -> None:
            nonlocal ok
            request = requests[index]
            # with recorded placement a request leaves when the live router sent it (after its admission
            # window and flow queue) and its TTFT counts from its arrival, as the recording's does
            held = request.held_ms / 1000.0 / options.speed if isinstance(config, RecordedPlacement) else 0.0
            await asyncio.sleep(max(0.0, origin + request.t / options.speed + held - loop.time()))
            body = json.dumps(completion_body(model, prompts[index], request)).encode()
            succeeded, first = await _send(client, targets[index], body, f"replay-{index}", loop.time)
            ok += succeeded
            if succeeded and first is not None:
                ttfts[index] = (first + held) * 1000.0

        async with asyncio.TaskGroup() as tg:
            for index in range(len(requests)):
                tg.create_task(one(index))
        after = await settled_snapshot(scrape, endpoints, before, ok)
        flow: tuple[dict[str, int], float] = ({}, 0.0)
        if isinstance(config, RouterConfig) and config.flow_control.enabled:
            flow = await flow_outcomes(client)
    result = summarize(label, requests, ok, ttfts, before, after, time.perf_counter() - started)
    result.flow_outcomes, result.flow_wait_s = flow
    return result


def run_config(
    label: str,
    config: RouterConfig | RecordedPlacement,
    requests: Sequence[TracedRequest],
    prompts: Sequence[str],
    options: ReplayOptions,
) -> ReplayResult:
    """:func:`replay_virtual` on a fresh virtual-time loop (a worker process runs one config at a time)."""
    return run_virtual(lambda: replay_virtual(label, config, requests, prompts, options))


def replay_virtual_all(
    configs: Sequence[tuple[str, RouterConfig | RecordedPlacement]],
    requests: Sequence[TracedRequest],
    options: ReplayOptions,
    *,
    jobs: int = 1,
    budget_s: float | None = None,
    progress: bool = True,
) -> tuple[list[ReplayResult], list[str], float]:
    """Replay each config on virtual time, ``jobs`` at a time in worker processes (1: in this process).

    With ``budget_s``, no config starts once the budget cannot fit one more replay as long as the longest so
    far; those not started are returned as skipped. Results come back in the configs' order."""
    prompts = rebuild_prompts(requests, options.text_seed)
    started = time.perf_counter()
    done: dict[int, ReplayResult] = {}
    skipped: list[str] = []
    longest = 0.0

    def over_budget() -> bool:
        return budget_s is not None and bool(done) and time.perf_counter() - started + longest > budget_s

    def finished(index: int, result: ReplayResult) -> None:
        nonlocal longest
        done[index] = result
        longest = max(longest, result.wall_s)
        if progress:
            print(f"replayed {result.label}: {result.wall_s:.1f} s", file=sys.stderr, flush=True)

    if jobs <= 1:
        for index, (label, config) in enumerate(configs):
            if over_budget():
                skipped.append(label)
                continue
            finished(index, run_config(label, config, requests, prompts, options))
    else:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as executor:
            pending: dict[Future[ReplayResult], int] = {}
            queue = list(enumerate(configs))
            while queue or pending:
                while queue and len(pending) < jobs:
                    index, (label, config) = queue.pop(0)
                    if over_budget():
                        skipped.append(label)
                        continue
                    future = executor.submit(run_config, label, config, requests, prompts, options)
                    pending[future] = index
                if not pending:
                    continue
                ready, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in ready:
                    finished(pending.pop(future), future.result())
    return [done[i] for i in sorted(done)], skipped, time.perf_counter() - started
