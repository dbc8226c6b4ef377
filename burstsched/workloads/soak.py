"""A soak run: a long, steady load through ``burstsched serve`` on simulated replicas while one replica at a
time is killed and restarted, some clients hang up mid-stream and malformed requests come in; the router
process is sampled all along (RSS, open file descriptors, asyncio tasks, event-loop lag).

The phases, every one bounded in time:

1. start the replicas (``burstsched sim`` processes) and measure their cold capacity (or take it as given);
2. start the router (``burstsched serve``), wait until it sees every replica healthy, send a few priming
   requests, then read its idle baseline (RSS, descriptors, tasks);
3. the load: Poisson arrivals at ``load`` times the capacity for ``duration_s``; every ``kill_every_s`` the
   next replica in turn gets SIGKILL, stays down ``down_s``, and is restarted on its port;
4. the drain: the requests in flight finish (each is bounded by ``request_timeout_s``);
5. the settle: the client's connections closed, wait (at most ``settle_timeout_s``) until the router's
   descriptors and tasks are back to their baseline.

:mod:`burstsched.workloads.soak_report` turns the :class:`SoakResult` into verdicts and a report.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from burstsched.workloads.capacity import Capacity, measure_cold_capacity
from burstsched.workloads.soak_client import FAILURES, Outcome, send_chat, send_malformed
from burstsched.workloads.soak_load import Mix, Planned, RequestPlan
from burstsched.workloads.soak_probe import (
    Buckets,
    ProcessReading,
    RuntimeReading,
    bucket_difference,
    fd_kinds,
    histogram_quantile,
    median,
    parse_runtime,
    read_process,
)
from burstsched.workloads.soak_processes import Child, router_child, running, sim_children

MODEL = "kv-demo"  # the simulator's default served model name
RESTART_MARGIN_S = 15.0
"""A kill is made only if its replica's restart is due this long before the load ends."""
Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class SoakSettings:
    """What a soak run does. ``warmup_s`` None: a tenth of the run, at most 120 s."""

    duration_s: float = 1200.0
    warmup_s: float | None = None
    replicas: int = 3
    time_scale: float = 1.0
    kill_every_s: float = 60.0
    down_s: float = 5.0
    load: float = 0.8
    capacity_rps: float | None = None
    """Requests per second the pool sustains; None: measure its cold capacity first."""
    mix: Mix = field(default_factory=Mix)
    sample_every_s: float = 2.0
    progress_every_s: float = 10.0
    request_timeout_s: float = 120.0
    settle_timeout_s: float = 60.0
    config: Path = Path("config") / "default.yaml"
    max_body_bytes: int = 65536
    """The router's body limit for the run (the config's, replaced), so an oversize request stays small."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.duration_s <= 0 or self.kill_every_s <= 0 or self.down_s < 0 or self.sample_every_s <= 0:
            raise ValueError("duration, kill interval and sample interval must be positive, down time >= 0")
        if self.replicas < 2:
            raise ValueError("a soak with kills needs at least 2 replicas")
        if not 0 < self.load:
            raise ValueError("load must be positive")
        if self.warmup_s is not None and not 0 <= self.warmup_s < self.duration_s:
            raise ValueError("warmup must be within [0, duration)")
        if self.capacity_rps is not None and self.capacity_rps <= 0:
            raise ValueError("capacity must be positive")

    @property
    def warmup(self) -> float:
        return self.warmup_s if self.warmup_s is not None else min(120.0, 0.1 * self.duration_s)

    @property
    def window_s(self) -> float:
        """The width of the early and late windows compared for RSS growth: at most 2 minutes."""
        return min(120.0, (self.duration_s - self.warmup) / 4)

    def as_json(self) -> dict[str, Any]:
        mix = self.mix
        return {
            "duration_s": self.duration_s,
            "warmup_s": self.warmup,
            "window_s": self.window_s,
            "replicas": self.replicas,
            "time_scale": self.time_scale,
            "kill_every_s": self.kill_every_s,
            "down_s": self.down_s,
            "load": self.load,
            "capacity_rps": self.capacity_rps,
            "stream_share": mix.stream_share,
            "disconnect_share": mix.disconnect_share,
            "malformed_share": mix.malformed_share,
            "max_tokens": [mix.max_tokens_min, mix.max_tokens_max],
            "contexts": mix.contexts,
            "sample_every_s": self.sample_every_s,
            "settle_timeout_s": self.settle_timeout_s,
            "config": str(self.config),
            "max_body_bytes": self.max_body_bytes,
            "seed": self.seed,
        }


@dataclass(frozen=True, slots=True)
class KillEvent:
    replica: str
    killed_at_s: float
    restarted_at_s: float
    """When the restarted replica answered its health check (seconds since the load began)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading of the router; ``t_s`` is seconds since the load began (negative before)."""

    t_s: float
    phase: str
    rss_bytes: int
    fds: int
    tasks: float
    lag_p99_s: float | None
    """Over the interval since the previous sample (histogram estimate)."""
    in_flight: int
    sent: int

    def as_json(self) -> dict[str, Any]:
        return {
            "t_s": round(self.t_s, 2),
            "phase": self.phase,
            "rss_bytes": self.rss_bytes,
            "fds": self.fds,
            "tasks": self.tasks,
            "lag_p99_s": self.lag_p99_s,
            "in_flight": self.in_flight,
            "sent": self.sent,
        }


@dataclass(frozen=True, slots=True)
class Baseline:
    """The idle router before the load: median RSS, most descriptors and tasks over a few readings."""

    rss_bytes: int
    fds: int
    tasks: float
    readings: int
    fd_kinds: dict[str, int] = field(default_factory=dict)
    """What the descriptors were, at the last reading (see :func:`~.soak_probe.fd_kinds`)."""


@dataclass
class SoakResult:
    settings: SoakSettings
    capacity_rps: float
    capacity: Capacity | None
    rate_rps: float
    baseline: Baseline
    outcomes: list[Outcome] = field(default_factory=list)
    kills: list[KillEvent] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    load_s: float = 0.0
    drain_s: float = 0.0
    final: Sample | None = None
    settled: bool = False
    settle_s: float = 0.0
    final_fd_kinds: dict[str, int] = field(default_factory=dict)
    lag_load: Buckets = ()
    """The lag histogram's counts over the load (and drain)."""
    router_outcomes: dict[str, float] = field(default_factory=dict)
    """The router's own ``burstsched_requests_total`` by outcome, over the run."""

    @property
    def failures(self) -> int:
        return sum(1 for o in self.outcomes if o.kind in FAILURES)


class _Live:
    """Counters the load, the sampler and the progress line share."""

    def __init__(self) -> None:
        self.sent = 0
        self.in_flight = 0
        self.phase = "baseline"
        self.runtime: RuntimeReading | None = None


class _Router:
    """Reads the router process: /proc by PID, the runtime families from /metrics."""

    def __init__(self, child: Child, client: httpx.AsyncClient, replicas: list[Child]) -> None:
        self.child = child
        self.client = client
        self._port = _port(child.url)
        self._peers = {_port(r.url): r.name for r in replicas}

    def fd_kinds(self) -> dict[str, int]:
        return fd_kinds(self.child.pid, self._port, self._peers)

    async def read(self) -> tuple[ProcessReading, RuntimeReading]:
        process = read_process(self.child.pid)
        response = await self.client.get(f"{self.child.url}/metrics")
        response.raise_for_status()
        return process, parse_runtime(response.text)

    async def all_healthy(self, names: list[str]) -> bool:
        response = await self.client.get(f"{self.child.url}/metrics")
        healthy = {
            s.labels["endpoint"]
            for f in text_string_to_metric_families(response.text)
            for s in f.samples
            if s.name == "burstsched_endpoint_healthy" and s.value == 1.0
        }
        return set(names) <= healthy


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def router_config_text(config: Path, max_body_bytes: int) -> str:
    """``config`` with its body limit replaced."""
    data = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    data.setdefault("limits", {})["max_body_bytes"] = max_body_bytes
    return yaml.safe_dump(data, sort_keys=False)


async def run_soak(settings: SoakSettings, work: Path, progress: Progress = print) -> SoakResult:
    """Run the soak; ``work`` holds the config and the children's logs. Bounded: every phase has a limit."""
    config = work / "router.yaml"
    config.write_text(router_config_text(settings.config, settings.max_body_bytes), encoding="utf-8")
    plan = RequestPlan(settings.mix, MODEL, random.Random(settings.seed))
    sims = sim_children(settings.replicas, work, time_scale=settings.time_scale, seed=settings.seed)
    endpoints = [(s.name, s.url) for s in sims]
    async with running(sims):
        capacity = None
        capacity_rps = settings.capacity_rps
        if capacity_rps is None:
            with anyio.fail_after(300):
                capacity = await _cold_capacity(endpoints, plan, settings)
            capacity_rps = capacity.requests_per_s
        rate = settings.load * capacity_rps
        progress(f"[soak] capacity {capacity_rps:.2f} req/s: load {settings.load:g} of it = {rate:.2f} req/s")
        router = router_child(config, endpoints, work)
        async with running([router]), httpx.AsyncClient(timeout=10.0) as probe_client:
            probe = _Router(router, probe_client, sims)
            with anyio.fail_after(60):
                await _prime(probe, [name for name, _ in endpoints], plan)
                baseline, first = await _baseline(probe)
            result = SoakResult(settings, capacity_rps, capacity, rate, baseline)
            await _load_and_settle(result, probe, sims, plan, first, progress)
    return result


async def _cold_capacity(
    endpoints: list[tuple[str, str]], plan: RequestPlan, settings: SoakSettings
) -> Capacity:
    prompts = plan.calibration_prompts(len(endpoints) * 4)
    async with httpx.AsyncClient(timeout=60.0) as client:
        return await measure_cold_capacity(
            client, endpoints, MODEL, prompts, settings.mix.mean_max_tokens, warmup=1
        )


async def _prime(probe: _Router, names: list[str], plan: RequestPlan) -> None:
    """Wait until the router sees every replica healthy, then send each a few requests through it."""
    while not await probe.all_healthy(names):  # noqa: ASYNC110 - polls another process
        await anyio.sleep(0.1)
    async with httpx.AsyncClient(timeout=30.0) as client:
        for i in range(2 * len(names)):
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"Priming request {i}: say something."}],
                "max_tokens": 4,
                "stream": i % 2 == 0,
            }
            outcome = await send_chat(
                client, probe.child.url, body, f"soak-prime-{i}", clock=anyio.current_time
            )
            if outcome.kind != "completed":
                raise RuntimeError(
                    f"a priming request failed: {outcome.kind} {outcome.status} {outcome.detail}"
                )


async def _baseline(
    probe: _Router, readings: int = 5, every_s: float = 0.5
) -> tuple[Baseline, RuntimeReading]:
    rss: list[int] = []
    fds: list[int] = []
    tasks: list[float] = []
    runtime: RuntimeReading | None = None
    for i in range(readings):
        if i:
            await anyio.sleep(every_s)
        process, runtime = await probe.read()
        rss.append(process.rss_bytes)
        fds.append(process.fds)
        tasks.append(runtime.tasks)
    assert runtime is not None
    baseline = Baseline(int(median(rss) or 0), max(fds), max(tasks), readings, probe.fd_kinds())
    return baseline, runtime


async def _load_and_settle(
    result: SoakResult,
    probe: _Router,
    sims: list[Child],
    plan: RequestPlan,
    first: RuntimeReading,
    progress: Progress,
) -> None:
    settings = result.settings
    live = _Live()
    live.runtime = first
    start = anyio.current_time()
    end = start + settings.duration_s

    def since_start() -> float:
        return anyio.current_time() - start

    async with anyio.create_task_group() as watchers:
        watchers.start_soon(_sampler, result, probe, live, since_start)
        watchers.start_soon(_progress, result, live, since_start, progress)
        killer_done = anyio.Event()
        watchers.start_soon(_killer, result, sims, start, end, since_start, progress, killer_done)
        live.phase = "load"
        limits = httpx.Limits(max_connections=2048, max_keepalive_connections=256)
        timeout = httpx.Timeout(settings.request_timeout_s, connect=10.0)
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
            await _arrivals(result, client, probe.child.url, plan, live, start, end, since_start)
        result.drain_s = since_start() - result.load_s
        _, drained = await probe.read()
        result.lag_load = bucket_difference(drained.lag, first.lag)
        await killer_done.wait()  # a replica killed near the end is back before the settle
        live.phase = "settle"
        last = await _settle(result, probe, live, since_start)
        result.router_outcomes = {k: v - first.requests.get(k, 0.0) for k, v in sorted(last.requests.items())}
        watchers.cancel_scope.cancel()


async def _arrivals(
    result: SoakResult,
    client: httpx.AsyncClient,
    url: str,
    plan: RequestPlan,
    live: _Live,
    start: float,
    end: float,
    since_start: Callable[[], float],
) -> None:
    """Poisson arrivals until ``end``; returns once every request sent has its outcome."""
    settings = result.settings
    rng = random.Random(f"{settings.seed}:arrivals")

    async def one(planned: Planned) -> None:
        live.in_flight += 1
        started = since_start()
        outcome: Outcome | None = None
        try:
            with anyio.move_on_after(settings.request_timeout_s):
                outcome = await _send(client, url, planned, settings.max_body_bytes, since_start)
            if outcome is None:
                kind = f"malformed:{planned.malformed}" if planned.malformed else "stream"
                if planned.body is not None and not planned.body.get("stream"):
                    kind = "json"
                detail = f"no end within {settings.request_timeout_s:g} s"
                outcome = Outcome(kind, "lost", detail=detail, started_s=started, ended_s=since_start())
            result.outcomes.append(outcome)
        finally:
            live.in_flight -= 1

    async with anyio.create_task_group() as tg:
        next_at = start
        while True:
            next_at += rng.expovariate(result.rate_rps)
            if next_at >= end:
                break
            await anyio.sleep_until(next_at)
            tg.start_soon(one, plan.next())
            live.sent += 1
        result.load_s = since_start()
        live.phase = "drain"


async def _send(
    client: httpx.AsyncClient, url: str, planned: Planned, max_body_bytes: int, clock: Callable[[], float]
) -> Outcome:
    request_id = f"soak-{planned.index}"
    if planned.malformed is not None:
        return await send_malformed(
            client, url, planned.malformed, MODEL, max_body_bytes, request_id, clock=clock
        )
    assert planned.body is not None
    return await send_chat(client, url, planned.body, request_id, clock=clock, cut_after=planned.cut_after)


async def _sampler(result: SoakResult, probe: _Router, live: _Live, since_start: Callable[[], float]) -> None:
    every = result.settings.sample_every_s
    while True:
        await anyio.sleep(every)
        previous = live.runtime
        process, runtime = await probe.read()
        lag_p99 = None
        if previous is not None:
            lag_p99 = histogram_quantile(0.99, bucket_difference(runtime.lag, previous.lag))
        live.runtime = runtime
        result.samples.append(
            Sample(
                since_start(),
                live.phase,
                process.rss_bytes,
                process.fds,
                runtime.tasks,
                lag_p99,
                live.in_flight,
                live.sent,
            )
        )


async def _progress(
    result: SoakResult, live: _Live, since_start: Callable[[], float], progress: Progress
) -> None:
    every = result.settings.progress_every_s
    while True:
        await anyio.sleep(every)
        kinds = [o.kind for o in result.outcomes]
        last = result.samples[-1] if result.samples else None
        runtime = ""
        if last is not None:
            lag = f"{last.lag_p99_s * 1e3:.1f}ms" if last.lag_p99_s is not None else "-"
            runtime = (
                f" rss={last.rss_bytes / 2**20:.1f}MiB fds={last.fds} tasks={last.tasks:.0f} lag_p99={lag}"
            )
        progress(
            f"[soak] t={since_start():.0f}s/{result.settings.duration_s:.0f}s {live.phase} sent={live.sent} "
            f"done={len(kinds)} in_flight={live.in_flight} lost={kinds.count('lost')} "
            f"bad_shape={kinds.count('bad_shape')} kills={len(result.kills)}{runtime}"
        )


async def _killer(
    result: SoakResult,
    sims: list[Child],
    start: float,
    end: float,
    since_start: Callable[[], float],
    progress: Progress,
    done: anyio.Event,
) -> None:
    """SIGKILL the next replica every ``kill_every_s``; restart it on its port ``down_s`` later. A kill whose
    restart would not be back well before the load ends is not made."""
    settings = result.settings
    try:
        k = 1
        while True:
            at = start + k * settings.kill_every_s
            if at + settings.down_s + RESTART_MARGIN_S > end:
                return
            await anyio.sleep_until(at)
            victim = sims[(k - 1) % len(sims)]
            killed_at = since_start()
            await victim.kill()
            progress(f"[soak] t={killed_at:.0f}s: SIGKILL {victim.name} (pid {victim.pid})")
            await anyio.sleep(settings.down_s)
            await victim.start(timeout_s=30.0)
            result.kills.append(KillEvent(victim.name, killed_at, since_start()))
            progress(f"[soak] t={since_start():.0f}s: {victim.name} restarted (pid {victim.pid})")
            k += 1
    finally:
        done.set()


async def _settle(
    result: SoakResult, probe: _Router, live: _Live, since_start: Callable[[], float]
) -> RuntimeReading:
    """Read the router every second until its descriptors and tasks are back to the baseline (bounded);
    returns the last reading."""
    began = since_start()
    baseline = result.baseline
    process, runtime = await probe.read()
    with anyio.move_on_after(result.settings.settle_timeout_s):
        while True:
            result.final = Sample(
                since_start(), "settle", process.rss_bytes, process.fds, runtime.tasks, None, 0, live.sent
            )
            if process.fds <= baseline.fds and runtime.tasks <= baseline.tasks:
                result.settled = True
                break
            await anyio.sleep(1.0)
            process, runtime = await probe.read()
    result.settle_s = since_start() - began
    result.final_fd_kinds = probe.fd_kinds()
    return runtime
