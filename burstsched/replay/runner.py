"""Replaying a trace through one router config on a fresh simulated pool.

Each config gets its own :class:`~burstsched.sim.SimPool` (empty caches) and its own ``burstsched serve``
process (the load generator never shares the router's event loop). Requests leave at their recorded
arrival times × ``time_scale / speed``; the simulator runs ``time_scale`` times real time, so every
latency measured is divided by ``time_scale`` to read in the trace's time. The router's own timings are
not the simulator's: ``admission.window_ms`` is multiplied by ``time_scale`` so a window spans the same
share of the replayed traffic (the router's per-request CPU time is not scaled; keep ``time_scale``
large enough that it stays small against the replayed latencies).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio
import httpx

from burstsched.config import RouterConfig
from burstsched.replay.trace import TracedRequest
from burstsched.sim import CostModel, SimConfig, SimPool
from burstsched.wire.sse import DONE, aiter_data
from burstsched.workloads.pools import event_args
from burstsched.workloads.replica_metrics import ReplicaCounters
from burstsched.workloads.replica_state import settled_snapshot, snapshot
from burstsched.workloads.router_process import router_process
from burstsched.workloads.stats import percentile, ratio

DEFAULT_BLOCK_SIZE = 16
"""vLLM's default KV block size (on GPUs)."""


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    replicas: int = 2
    kv_blocks: int | None = None
    """Blocks of each simulated replica's KV cache (None: the simulator's default)."""
    speed: float = 1.0
    """Arrival-rate multiplier: 2 replays the trace's arrivals twice as fast."""
    time_scale: float = 0.25
    """Simulator time per real second's worth of work (0.25: four times faster than real time)."""
    block_size: int = DEFAULT_BLOCK_SIZE
    """Tokens per KV block of the simulated replicas (the recorded replicas' block size)."""
    max_num_batched_tokens: int | None = None
    """Tokens one engine step computes at most, as on the recorded replicas (None: the simulator's default;
    vLLM on CPU: 2048)."""
    max_num_seqs: int | None = None
    """Sequences running at once at most (None: the simulator's default)."""
    cost: CostModel | None = None
    """The simulator's costs (None: its defaults); :func:`burstsched.replay.calibrate.calibrate` fits them."""
    request_timeout_s: float = 120.0
    text_seed: int = 0
    """Seed of the rebuilt prompts' synthetic words (the sharing structure stays the trace's)."""
    virtual_time: bool = False
    """Replayed in one process on virtual time (:mod:`burstsched.replay.virtual_run`), not over sockets."""
    record_dir: Path | None = None
    """With virtual time: each replayed router records its requests, decisions included, to
    ``record_dir/<label>.jsonl`` (the trace format), to set beside the live recording. Its endpoints,
    groups and decisions are the replay's; its times are the host's clock, not the simulated one (the
    replay's report has the simulated TTFTs)."""


@dataclass(slots=True)
class ReplayResult:
    """One config's replay: figures in the trace's time (latencies already divided by the time scale)."""

    label: str
    requests: int
    ok: int
    hit_rate: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    ttft_p99_ms: float
    prefill_tokens_per_request: float
    requests_per_replica: dict[str, int]
    wall_s: float
    ttfts_ms: list[float] = field(default_factory=list)
    ttft_by_request_ms: list[float | None] = field(default_factory=list)
    """Each trace request's replayed TTFT, in the trace's order (None: it failed or gave no text)."""
    settings: dict[str, Any] = field(default_factory=dict)
    flow_outcomes: dict[str, int] = field(default_factory=dict)
    """With ``flow_control`` on (virtual time): requests the router's queue held, by how they left it
    (``released``, ``expired``, ``cancelled``...; requests that found room went straight through and are not
    counted); its /metrics' ``burstsched_flow_queue_wait_seconds`` counts."""
    flow_wait_s: float = 0.0
    """The seconds those requests waited in the router's queue, in all (the replay's time)."""

    def metric(self, name: str) -> float:
        return float(getattr(self, name))

    def as_json(self, with_samples: bool = False) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in self.__slots__ if k not in ("ttfts_ms", "ttft_by_request_ms")}
        if with_samples:
            data["ttfts_ms"] = self.ttfts_ms
        return data


def sim_config(options: ReplayOptions, base: SimConfig) -> SimConfig:
    """``base`` with the options' replica geometry and costs (those the options leave unset stay)."""
    sim = replace(base, block_size=options.block_size)
    if options.cost is not None:
        sim = replace(sim, cost=options.cost)
    if options.kv_blocks is not None:
        sim = replace(sim, num_gpu_blocks=options.kv_blocks)
    if options.max_num_batched_tokens is not None:
        sim = replace(sim, max_num_batched_tokens=options.max_num_batched_tokens)
    if options.max_num_seqs is not None:
        sim = replace(sim, max_num_seqs=options.max_num_seqs)
    return sim


def replay_config(config: RouterConfig, options: ReplayOptions) -> RouterConfig:
    """The config as the replay runs it: no recording, no endpoints, the window scaled to the sim's time."""
    admission = config.admission.model_copy(
        update={"window_ms": config.admission.window_ms * options.time_scale}
    )
    recording = config.recording.model_copy(update={"enabled": False})
    return config.model_copy(update={"endpoints": [], "admission": admission, "recording": recording})


def completion_body(model: str, prompt: str, request: TracedRequest) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": request.output_budget,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def _send(
    client: httpx.AsyncClient, base_url: str, body: dict[str, Any], request_id: str
) -> tuple[bool, float | None]:
    """Stream one completion; (succeeded, seconds to the first text)."""
    start = time.perf_counter()
    first: float | None = None
    headers = {"x-request-id": request_id}
    async with client.stream("POST", f"{base_url}/v1/completions", json=body, headers=headers) as response:
        if response.status_code != 200:
            await response.aread()
            return False, None
        done = False
        async for data in aiter_data(response.aiter_bytes()):
            if data == DONE:
                done = True
                continue
            if first is None and any(c.get("text") for c in json.loads(data).get("choices") or []):
                first = time.perf_counter() - start
        return done, first


async def replay_one(
    label: str,
    config: RouterConfig,
    requests: Sequence[TracedRequest],
    prompts: Sequence[str],
    options: ReplayOptions,
) -> ReplayResult:
    """Replay every request through ``config`` on a fresh simulated pool."""
    events = "tcp://127.0.0.1:*"
    sim = sim_config(
        options,
        SimConfig(time_scale=options.time_scale, kv_events_endpoint=events, kv_events_replay_endpoint=events),
    )
    scale = options.time_scale
    started = time.perf_counter()
    ttfts: dict[int, float] = {}
    ok = 0
    async with SimPool(options.replicas, sim) as pool:
        endpoints = list(zip(pool.names, pool.urls, strict=True))
        args = event_args(pool.names, pool.kv_events_endpoints, pool.kv_events_replay_endpoints)
        args += ["--tokenizer", "remote"]
        with tempfile.TemporaryDirectory(prefix="burstsched-replay-") as tmp:
            path = Path(tmp) / "config.yaml"
            path.write_text(json.dumps(replay_config(config, options).model_dump(mode="json")))
            async with router_process(path, endpoints, extra_args=args) as base_url:
                limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
                timeout = httpx.Timeout(options.request_timeout_s, connect=10.0)
                async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
                    before = await snapshot(client, endpoints)
                    origin = anyio.current_time()

                    async def one(index: int) -> None:
                        nonlocal ok
                        request = requests[index]
                        await anyio.sleep_until(origin + request.t * scale / options.speed)
                        body = completion_body(sim.served_model_name, prompts[index], request)
                        try:
                            succeeded, first = await _send(client, base_url, body, f"replay-{index}")
                        except httpx.HTTPError:
                            return
                        ok += succeeded
                        if succeeded and first is not None:
                            ttfts[index] = first / scale * 1000.0

                    async with anyio.create_task_group() as tg:
                        for index in range(len(requests)):
                            tg.start_soon(one, index)
                    after = await settled_snapshot(client, endpoints, before, ok)
    return summarize(label, requests, ok, ttfts, before, after, time.perf_counter() - started)


def summarize(
    label: str,
    requests: Sequence[TracedRequest],
    ok: int,
    ttfts_ms: Mapping[int, float],
    before: Mapping[str, ReplicaCounters],
    after: Mapping[str, ReplicaCounters],
    wall_s: float,
) -> ReplayResult:
    """One replay's figures from its client-side TTFTs (by the request's index in the trace) and the replicas'
    counters before and after."""
    latencies = list(ttfts_ms.values())
    diff = {name: after[name] - before[name] for name in after}
    queries = sum(d.prefix_queries for d in diff.values())
    hits = sum(d.prefix_hits for d in diff.values())
    computed = sum(d.prefill_computed_tokens for d in diff.values())
    return ReplayResult(
        label=label,
        requests=len(requests),
        ok=ok,
        hit_rate=ratio(hits, queries),
        ttft_p50_ms=percentile(latencies, 50),
        ttft_p95_ms=percentile(latencies, 95),
        ttft_p99_ms=percentile(latencies, 99),
        prefill_tokens_per_request=ratio(computed, ok),
        requests_per_replica={name: round(d.requests_finished) for name, d in diff.items()},
        wall_s=wall_s,
        ttfts_ms=sorted(latencies),
        ttft_by_request_ms=[ttfts_ms.get(i) for i in range(len(requests))],
    )
