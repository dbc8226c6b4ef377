"""Fault runs: streaming load through burstsched while one replica fails (workloads.md, "Fault runs").

    python loadtests/faults.py [--backend sim|vllm] [--replicas N] [--duration S] [--rate R]
                               [--scenarios kill,5xx,stall,metrics-dead] [--json PATH]

Each scenario starts a fresh `burstsched serve` child process in front of the replicas, sends streaming chat
requests (Poisson arrivals at ``--rate`` per second for ``--duration`` seconds) and, ``--fault-at`` of the
way in, breaks one replica:

- ``kill``: SIGKILL to the replica with the most streams in flight (simulator: ``SimPool.kill``; vLLM:
  SIGKILL to the replica's process group);
- ``5xx``: the replica answers every inference request with 503;
- ``stall``: the replica holds every inference response 5 s (vLLM: 10 s) before its first byte;
- ``metrics-dead``: the replica's ``/metrics`` hangs (it keeps serving requests).

On real vLLM the last three go through a small fault-injecting proxy in front of replica 0 (vLLM has no
fault switches); ``kill`` runs last and kills the real process. Per scenario it prints the requests sent,
completed, retried (the router tried more than one endpoint: ``x-burstsched-attempts``), failed before
their first byte (no 200: lost), streams ended with an error event, and streams silently truncated (a 200
stream that ended without ``[DONE]`` or without a ``finish_reason``, and without an error event). Every
scenario is bounded in time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from burstsched.server.serve import serving
from burstsched.wire.sse import DONE, aiter_data, json_object
from burstsched.workloads.router_process import router_process

SCENARIOS = ("5xx", "stall", "metrics-dead", "kill")
STALL_S = 5.0
VLLM_STALL_S = 10.0
Streams = Counter[str]
"""Streams in flight per endpoint (the ``x-burstsched-endpoint`` of their response), live."""
Inject = Callable[[Streams], Awaitable[None]]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sim", "vllm"), default="sim")
    parser.add_argument("--replicas", type=int, default=None, help="default: 3 (sim), 2 (vllm, at most 2)")
    parser.add_argument("--duration", type=float, default=None, help="seconds of load (10 sim, 30 vllm)")
    parser.add_argument("--rate", type=float, default=None, help="requests/s (default 20 sim, 1 vllm)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--fault-at", type=float, default=0.35, help="share of the run before the fault")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--time-scale", type=float, default=1.0, help="simulator speed (1.0: like vLLM)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    vllm = args.backend == "vllm"
    args.replicas = args.replicas or (2 if vllm else 3)
    args.duration = args.duration or (30.0 if vllm else 10.0)
    args.rate = args.rate or (1.0 if vllm else 20.0)
    if vllm and args.replicas > 2:
        parser.error("at most 2 real vLLM replicas (one core each)")
    if args.replicas < 2:
        parser.error("a fault run needs at least 2 replicas")
    unknown = set(args.scenarios.split(",")) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {sorted(unknown)}")
    return args


# --- the client's view of one request -----------------------------------------------------------------


@dataclass(slots=True)
class Outcome:
    """One streamed request as the client saw it."""

    status: int | None = None
    attempts: int = 1
    endpoint: str | None = None
    done: bool = False
    finished: bool = False
    error_event: bool = False
    transport_error: str | None = None
    first_byte: bool = False

    @property
    def kind(self) -> str:
        if self.status != 200:
            return "failed_before_first_byte"
        if self.error_event:
            return "error_event"
        if self.done and self.finished and self.transport_error is None:
            return "completed"
        return "truncated"


async def stream_one(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], request_id: str, streams: Streams
) -> Outcome:
    outcome = Outcome()
    try:
        async with client.stream(
            "POST", f"{url}/v1/chat/completions", json=body, headers={"x-request-id": request_id}
        ) as response:
            outcome.status = response.status_code
            outcome.attempts = int(response.headers.get("x-burstsched-attempts", "1"))
            outcome.endpoint = response.headers.get("x-burstsched-endpoint")
            if response.status_code != 200:
                await response.aread()
                return outcome
            endpoint = outcome.endpoint or "-"
            streams[endpoint] += 1
            try:
                async for data in aiter_data(response.aiter_bytes()):
                    _read_event(data, outcome)
            except httpx.HTTPError as exc:  # cut mid-body: truncated unless an error event came first
                outcome.transport_error = type(exc).__name__
            finally:
                streams[endpoint] -= 1
    except httpx.HTTPError as exc:
        if outcome.status is None:
            outcome.transport_error = type(exc).__name__
        elif outcome.transport_error is None:
            outcome.transport_error = type(exc).__name__
    return outcome


def _read_event(data: str, outcome: Outcome) -> None:
    outcome.first_byte = True
    if data == DONE:
        outcome.done = True
        return
    chunk = json_object(data)
    if chunk is None:
        return
    if "error" in chunk:
        outcome.error_event = True
        return
    for choice in chunk.get("choices") or []:
        if choice.get("finish_reason"):
            outcome.finished = True


@dataclass
class ScenarioResult:
    scenario: str
    backend: str
    sent: int = 0
    completed: int = 0
    retried: int = 0
    failed_before_first_byte: int = 0
    error_event: int = 0
    truncated: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    served_by: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0

    @classmethod
    def of(
        cls, scenario: str, backend: str, outcomes: Sequence[Outcome], duration_s: float
    ) -> ScenarioResult:
        kinds = Counter(o.kind for o in outcomes)
        return cls(
            scenario=scenario,
            backend=backend,
            sent=len(outcomes),
            completed=kinds["completed"],
            retried=sum(1 for o in outcomes if o.attempts > 1),
            failed_before_first_byte=kinds["failed_before_first_byte"],
            error_event=kinds["error_event"],
            truncated=kinds["truncated"],
            statuses=dict(Counter(str(o.status or o.transport_error) for o in outcomes)),
            served_by=dict(Counter(o.endpoint or "-" for o in outcomes)),
            duration_s=round(duration_s, 1),
        )


# --- load ---------------------------------------------------------------------------------------------


def prompts(rng: random.Random, contexts: int = 6) -> list[str]:
    """A few shared contexts (so prefix affinity matters); each request adds its own question."""
    out = []
    for c in range(contexts):
        lines = [f"Context {c}-{rng.getrandbits(32):08x}."]
        for i in range(30):
            lines.append(f"Observation {i}: node-{rng.randrange(200)} logged {rng.randrange(900)} errors.")
        out.append(" ".join(lines))
    return out


async def run_load(
    url: str,
    model: str,
    args: argparse.Namespace,
    inject: Inject,
    rng: random.Random,
) -> tuple[list[Outcome], float]:
    contexts = prompts(rng)
    outcomes: list[Outcome] = []
    streams: Streams = Counter()
    started = time.monotonic()
    fault_at = started + args.duration * args.fault_at
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
    async with (
        httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=5.0), limits=limits) as client,
        anyio.create_task_group() as tg,
    ):

        async def one(i: int) -> None:
            content = f"{rng.choice(contexts)}\nQuestion {i}: summarize."
            body = {
                "model": model,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": args.max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            outcomes.append(await stream_one(client, url, body, f"fault-{i}", streams))

        async def fault() -> None:
            await anyio.sleep_until(_loop_time(fault_at))
            print(f"  t={time.monotonic() - started:.1f}s: injecting the fault", flush=True)
            await inject(streams)

        tg.start_soon(fault)
        i = 0
        next_at = started
        end = started + args.duration
        while True:
            next_at += rng.expovariate(args.rate)
            if next_at >= end:
                break
            await anyio.sleep_until(_loop_time(next_at))
            tg.start_soon(one, i)
            i += 1
    return outcomes, time.monotonic() - started


def _loop_time(monotonic_at: float) -> float:
    """anyio's clock is the event loop's (monotonic on asyncio): convert from time.monotonic()."""
    return anyio.current_time() + (monotonic_at - time.monotonic())


# --- routers and faults ---------------------------------------------------------------------------------


def router_yaml(args: argparse.Namespace) -> str:
    """The recommended config, with a first-byte timeout below the stall (vLLM on busy CPUs: roomier)."""
    vllm = args.backend == "vllm"
    return (
        "pool:\n  scrape_interval_ms: 50\n  staleness_threshold_ms: 500\n  scrape_timeout_ms: 500\n"
        f"  health_check_interval_ms: 500\n  health_check_timeout_ms: {2000 if vllm else 500}\n"
        f"dispatch:\n  max_attempts: {min(3, args.replicas)}\n"
        f"  timeouts:\n    connect_ms: 1000\n    first_byte_ms: {4000 if vllm else 1000}\n"
    )


class FaultProxy:
    """A pass-through proxy in front of one real replica, with the simulator's fault switches."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.fail_status: int | None = None
        self.stall_s = 0.0
        self.metrics_dead = False
        self.released = anyio.Event()
        self.client = httpx.AsyncClient(base_url=upstream, timeout=httpx.Timeout(120.0, connect=5.0))

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._inference, methods=["POST"]),
                Route("/v1/completions", self._inference, methods=["POST"]),
                Route("/metrics", self._metrics),
                Route("/{path:path}", self._plain, methods=["GET", "POST"]),
            ]
        )

    async def _metrics(self, request: Request) -> Response:
        if self.metrics_dead:
            await self.released.wait()  # hangs until the proxy stops
            return Response(status_code=503)
        return await self._plain(request)

    async def _plain(self, request: Request) -> Response:
        try:
            body = await request.body()
        except ClientDisconnect:
            return Response(status_code=499)
        upstream = await self.client.request(request.method, request.url.path, content=body)
        content_type = upstream.headers.get("content-type")
        return Response(upstream.content, upstream.status_code, media_type=content_type)

    async def _inference(self, request: Request) -> Response:
        try:
            body = await request.body()
        except ClientDisconnect:
            return Response(status_code=499)
        if self.stall_s:
            with anyio.move_on_after(self.stall_s):
                await self.released.wait()
            if await request.is_disconnected():  # the router gave up on us: do not load the replica
                return Response(status_code=499)
        if self.fail_status is not None:
            error = {"error": {"message": "injected", "type": "server_error", "param": None, "code": None}}
            return JSONResponse(error, status_code=self.fail_status)
        upstream_request = self.client.build_request(
            "POST", request.url.path, content=body, headers={"content-type": "application/json"}
        )
        upstream = await self.client.send(upstream_request, stream=True)
        if upstream.headers.get("content-type", "").startswith("text/event-stream"):

            async def chunks() -> AsyncIterator[bytes]:
                try:
                    async for chunk in upstream.aiter_raw():
                        yield chunk
                finally:
                    await upstream.aclose()

            return StreamingResponse(chunks(), upstream.status_code, media_type="text/event-stream")
        content = await upstream.aread()
        await upstream.aclose()
        return Response(content, upstream.status_code, media_type=upstream.headers.get("content-type"))

    async def inject(self, scenario: str) -> None:
        if scenario == "5xx":
            self.fail_status = 503
        elif scenario == "stall":
            self.stall_s = VLLM_STALL_S
        else:
            self.metrics_dead = True

    async def aclose(self) -> None:
        self.released.set()
        await self.client.aclose()


async def _kill_group(pgids: Sequence[int], index: int) -> None:
    """SIGKILL a replica's whole process group (it was started as a session leader)."""
    os.killpg(pgids[index], signal.SIGKILL)


async def _kill_busiest(
    names: Sequence[str], kill: Callable[[int], Awaitable[None]], streams: Streams
) -> None:
    """Kill the replica with the most streams in flight (waiting up to 5 s for one to have any)."""
    with anyio.move_on_after(5):
        while not any(streams[name] > 0 for name in names):  # noqa: ASYNC110 - the load updates it
            await anyio.sleep(0.02)
    victim = max(names, key=lambda name: streams[name])
    print(f"  killing {victim} with {streams[victim]} stream(s) in flight", flush=True)
    await kill(names.index(victim))


async def _ignore_streams(inject: Callable[[], Awaitable[None]], streams: Streams) -> None:
    await inject()


@asynccontextmanager
async def fault_proxy(upstream: str) -> AsyncIterator[tuple[FaultProxy, str]]:
    proxy = FaultProxy(upstream)
    try:
        async with serving(proxy.app()) as url:
            try:
                yield proxy, url
            finally:
                proxy.released.set()
    finally:
        await proxy.aclose()


async def run_scenario(
    scenario: str,
    args: argparse.Namespace,
    endpoints: list[tuple[str, str]],
    model: str,
    inject: Inject,
    config: Path,
) -> ScenarioResult:
    rng = random.Random(f"{args.seed}:{scenario}")
    print(f"scenario {scenario} ({args.backend}, {len(endpoints)} replicas):", flush=True)
    bound = args.duration + 150
    with anyio.fail_after(bound):
        async with router_process(config, endpoints) as url:
            outcomes, took = await run_load(url, model, args, inject, rng)
    result = ScenarioResult.of(scenario, args.backend, outcomes, took)
    print(f"  {result.statuses} served by {result.served_by}", flush=True)
    return result


async def sim_scenarios(args: argparse.Namespace, config: Path) -> list[ScenarioResult]:
    from burstsched.sim import Faults, SimConfig, SimPool

    results = []
    sim_config = SimConfig(time_scale=args.time_scale)
    for scenario in args.scenarios.split(","):
        async with SimPool(args.replicas, sim_config) as pool:
            faults = {
                "5xx": Faults(error_rate=1.0, error_status=503),
                "stall": Faults(stall_before_first_byte_s=STALL_S),
                "metrics-dead": Faults(metrics_dead=True),
            }
            inject: Inject = (
                partial(_kill_busiest, pool.names, pool.akill)
                if scenario == "kill"
                else partial(_ignore_streams, partial(pool.aset_faults, 0, faults[scenario]))
            )
            endpoints = list(zip(pool.names, pool.urls, strict=True))
            model = sim_config.served_model_name
            results.append(await run_scenario(scenario, args, endpoints, model, inject, config))
    return results


async def vllm_scenarios(args: argparse.Namespace, config: Path) -> list[ScenarioResult]:
    from burstsched.testing.real_vllm import real_vllm_pool

    results = []
    order = [s for s in SCENARIOS if s in args.scenarios.split(",")]  # kill last: it ends a replica
    async with real_vllm_pool(args.replicas) as pool:
        endpoints = list(pool.endpoints)
        for scenario in order:
            if scenario == "kill":
                pids = [replica.pid for replica in pool.replicas]
                kill = partial(_kill_busiest, pool.names, partial(_kill_group, pids))
                results.append(await run_scenario(scenario, args, endpoints, pool.model, kill, config))
                continue
            async with AsyncExitStack() as stack:
                proxy, proxy_url = await stack.enter_async_context(fault_proxy(endpoints[0][1]))
                proxied = [(endpoints[0][0], proxy_url), *endpoints[1:]]

                inject = partial(_ignore_streams, partial(proxy.inject, scenario))
                results.append(await run_scenario(scenario, args, proxied, pool.model, inject, config))
    return results


def print_table(results: Sequence[ScenarioResult]) -> None:
    header: tuple[str, ...] = ("scenario", "backend", "sent", "completed", "retried", "lost<1st byte")
    header += ("error event", "truncated")
    rows = [
        (
            r.scenario,
            r.backend,
            r.sent,
            r.completed,
            r.retried,
            r.failed_before_first_byte,
            r.error_event,
            r.truncated,
        )
        for r in results
    ]
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows, strict=True)]
    for row in (header, *rows):
        print("  ".join(str(x).rjust(w) for x, w in zip(row, widths, strict=True)))


async def main_async(args: argparse.Namespace) -> list[ScenarioResult]:
    with tempfile.TemporaryDirectory(prefix="burstsched-faults-") as tmp:
        config = Path(tmp) / "router.yaml"
        config.write_text(router_yaml(args), encoding="utf-8")
        if args.backend == "sim":
            return await sim_scenarios(args, config)
        return await vllm_scenarios(args, config)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results = anyio.run(main_async, args)
    print()
    print_table(results)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n", encoding="utf-8")
    bad = [r for r in results if r.failed_before_first_byte or r.truncated or not r.sent]
    if bad:
        print(f"FAILED: lost or truncated requests in {[r.scenario for r in bad]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
