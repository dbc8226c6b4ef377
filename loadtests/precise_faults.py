"""Precise mode under faults: a replica killed and restarted, and an event stream that loses messages.

Two replicas with KV events and replay sockets; the router (``config/precise.yaml``) follows replica 0's
events directly and replica 1's through a relay that can drop messages. Two clients stream document-QA
requests the whole time. Mid-run:

1. the relay drops ``--drop`` consecutive batches of replica 1's stream: the router sees the gap and replays
   it from the replica's replay socket;
2. replica 0 is killed (SIGKILL to its process group) and a new one started on the same ports: requests fail
   over to replica 1, the router drops replica 0's entries (health check, then the new process's sequence
   starting again at 0) and rebuilds them from the new process's events.

Afterwards, at concurrency 1, every prediction is held against the replica's own cached-token count. Reported:
requests sent, completed, failed before the first byte, streams cut with an error event, the router's gap,
replay and reset counters, and whether the predictions after recovery were exact.

    python loadtests/precise_faults.py --backend vllm
    python loadtests/precise_faults.py --backend sim
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import zmq
import zmq.asyncio

from burstsched.config import EndpointConfig, RouterConfig, TokenizerConfig, parse_config_text
from burstsched.server.serve import RunningRouter, running_router
from burstsched.testing.ports import free_port
from burstsched.wire.sse import DONE, data_payloads, json_object
from burstsched.workloads.contexts import context_text

REPO = Path(__file__).resolve().parents[1]


class Relay:
    """Forwards one replica's KV-event stream (SUB → PUB) and drops the next ``n`` batches when told."""

    def __init__(self, context: zmq.asyncio.Context, upstream: str) -> None:
        self._sub = context.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.connect(upstream)
        self._pub = context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        port = self._pub.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self.to_drop = 0
        self.dropped = 0
        self.forwarded = 0

    async def run(self) -> None:
        try:
            while True:
                frames = await self._sub.recv_multipart()
                if self.to_drop > 0:
                    self.to_drop -= 1
                    self.dropped += 1
                    continue
                await self._pub.send_multipart(frames)
                self.forwarded += 1
        finally:
            self._sub.close(linger=0)
            self._pub.close(linger=0)


@dataclass
class Replicas:
    """The two replicas: names, URLs, event and replay addresses, the model, and how to restart one."""

    names: list[str]
    urls: list[str]
    events: list[str]
    replays: list[str]
    model: str
    tokenizer: TokenizerConfig
    restart: Callable[[int], Coroutine[Any, Any, None]]


@asynccontextmanager
async def open_replicas(backend: str, kv_blocks: int) -> AsyncIterator[Replicas]:
    if backend == "vllm":
        from burstsched.testing.tiny_model import ensure_model
        from burstsched.testing.vllm_replica import VllmConfig, VllmPool

        config = VllmConfig(kv_events=True, num_gpu_blocks_override=kv_blocks)
        with VllmPool(2, config) as vllm:

            async def restart_vllm(i: int) -> None:
                await anyio.to_thread.run_sync(lambda: vllm.restart(i))

            yield Replicas(
                vllm.names,
                vllm.urls,
                [r.kv_events_endpoint or "" for r in vllm.replicas],
                [r.kv_replay_endpoint or "" for r in vllm.replicas],
                vllm.model,
                TokenizerConfig(source="local", path=str(ensure_model())),
                restart_vllm,
            )
        return
    from burstsched.sim import SimConfig, SimPool

    ports = [(free_port(), free_port(), free_port()) for _ in range(2)]

    def sim_config(i: int) -> SimConfig:
        http, events, replay = ports[i]
        return SimConfig(
            name=f"sim-{i}",
            port=http,
            time_scale=0.2,
            num_gpu_blocks=kv_blocks,
            # like vLLM, a publisher binds an address with a wildcard host and connects to any other
            kv_events_endpoint=f"tcp://*:{events}",
            kv_events_replay_endpoint=f"tcp://*:{replay}",
        )

    pools = [SimPool(1, sim_config(i)) for i in range(2)]
    for pool in pools:
        await pool.__aenter__()

    async def restart_sim(i: int) -> None:
        await pools[i].__aexit__(None, None, None)  # its process ends: the cache is gone
        pools[i] = SimPool(1, sim_config(i))
        await pools[i].__aenter__()

    try:
        yield Replicas(
            [f"sim-{i}" for i in range(2)],
            [f"http://127.0.0.1:{p[0]}" for p in ports],
            [f"tcp://127.0.0.1:{p[1]}" for p in ports],
            [f"tcp://127.0.0.1:{p[2]}" for p in ports],
            "kv-demo",
            TokenizerConfig(source="remote"),
            restart_sim,
        )
    finally:
        for pool in pools:
            await pool.__aexit__(None, None, None)


@dataclass
class Tally:
    sent: int = 0
    completed: int = 0
    failed: int = 0
    error_events: int = 0
    truncated: int = 0
    by_endpoint: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


async def stream_one(client: httpx.AsyncClient, body: dict[str, Any], tally: Tally) -> None:
    tally.sent += 1
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                tally.failed += 1
                tally.errors.append(f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
                return
            endpoint = response.headers.get("x-burstsched-endpoint", "?")
            events = data_payloads(await response.aread())
    except httpx.HTTPError as exc:
        tally.failed += 1
        tally.errors.append(f"{type(exc).__name__}: {exc}")
        return
    if any("error" in (json_object(data) or {}) for data in events):
        tally.error_events += 1
    elif not events or events[-1] != DONE:
        tally.truncated += 1
    else:
        tally.completed += 1
        tally.by_endpoint[endpoint] = tally.by_endpoint.get(endpoint, 0) + 1


def router_config(replicas: Replicas, relay_address: str) -> RouterConfig:
    config = parse_config_text((REPO / "config" / "precise.yaml").read_text())
    events = [replicas.events[0], relay_address]
    endpoints = [
        EndpointConfig(name=n, url=u, kv_events=e, kv_events_replay=r)
        for n, u, e, r in zip(replicas.names, replicas.urls, events, replicas.replays, strict=True)
    ]
    return config.model_copy(update={"endpoints": endpoints, "tokenizer": replicas.tokenizer})


def counter(metrics: str, prefix: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in metrics.splitlines():
        if line.startswith(prefix):
            name, _, value = line.rpartition(" ")
            out[name[len(prefix) :]] = float(value)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    documents = [context_text(f"faults-{args.seed}-{d}", args.doc_lines, d) for d in range(args.docs)]
    context = zmq.asyncio.Context()
    tally = Tally()
    timeline: list[tuple[float, str]] = []
    async with open_replicas(args.backend, args.kv_blocks) as replicas:
        relay = Relay(context, replicas.events[1])
        async with anyio.create_task_group() as relay_group:
            relay_group.start_soon(relay.run)
            router: RunningRouter
            async with running_router(router_config(replicas, relay.address)) as router:
                async with httpx.AsyncClient(base_url=router.url, timeout=120) as client:
                    started = time.monotonic()
                    stop = anyio.Event()

                    def body(i: int) -> dict[str, Any]:
                        doc = documents[min(int(rng.paretovariate(1.0)) - 1, args.docs - 1)]
                        return {
                            "model": replicas.model,
                            "messages": [{"role": "user", "content": f"{doc}\nQuestion {i}?"}],
                            "max_tokens": 8,
                            "stream": True,
                            "stream_options": {"include_usage": True},
                        }

                    async def client_loop(worker: int) -> None:
                        i = worker
                        while not stop.is_set():
                            await stream_one(client, body(i), tally)
                            i += 2

                    async def faults() -> None:
                        await anyio.sleep(args.phase_s)
                        relay.to_drop = args.drop
                        timeline.append(
                            (time.monotonic() - started, f"relay drops {args.drop} batches of replica 1")
                        )
                        await anyio.sleep(args.phase_s)
                        timeline.append((time.monotonic() - started, "replica 0 killed"))
                        await replicas.restart(0)
                        timeline.append((time.monotonic() - started, "replica 0 restarted and healthy"))
                        await anyio.sleep(args.phase_s)
                        stop.set()

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(client_loop, 0)
                        tg.start_soon(client_loop, 1)
                        tg.start_soon(faults)
                    print(f"load phase done after {time.monotonic() - started:.0f} s", file=sys.stderr)

                    # recovery: concurrency 1, every prediction against the replica's own count
                    exact = 0
                    checks = []
                    await asyncio.sleep(1.0)
                    for i in range(args.check_requests):
                        request = body(10_000 + i) | {"stream": False}
                        request.pop("stream_options")
                        response = await client.post("/v1/chat/completions", json=request)
                        response.raise_for_status()
                        usage = response.json()["usage"]
                        actual = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
                        index = response.headers["x-burstsched-prefix-index"]
                        predicted = int(response.headers.get("x-burstsched-predicted-cached-tokens", "-1"))
                        exact += index == "precise" and predicted == actual
                        checks.append((response.headers["x-burstsched-endpoint"], index, predicted, actual))
                    metrics = (await client.get("/metrics")).text
            relay_group.cancel_scope.cancel()
    context.term()
    return {
        "backend": args.backend,
        "timeline": timeline,
        "sent": tally.sent,
        "completed": tally.completed,
        "failed": tally.failed,
        "error_events": tally.error_events,
        "truncated": tally.truncated,
        "by_endpoint": tally.by_endpoint,
        "errors": tally.errors[:10],
        "relay_dropped": relay.dropped,
        "gaps": counter(metrics, "burstsched_kv_event_gaps_total"),
        "replays": counter(metrics, "burstsched_kv_event_replays_total"),
        "resets": counter(metrics, "burstsched_kv_stream_resets_total"),
        "decisions": counter(metrics, "burstsched_prefix_decisions_total"),
        "recovery_checks": len(checks),
        "recovery_exact": exact,
        "recovery": checks,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sim", "vllm"), default="sim")
    parser.add_argument("--kv-blocks", type=int, default=None)
    parser.add_argument("--docs", type=int, default=20)
    parser.add_argument("--doc-lines", type=int, default=40)
    parser.add_argument("--drop", type=int, default=5, help="batches of replica 1's stream the relay drops")
    parser.add_argument("--phase-s", type=float, default=15.0, help="seconds between the faults")
    parser.add_argument("--check-requests", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.kv_blocks is None:
        args.kv_blocks = 160 if args.backend == "vllm" else 600
    result = asyncio.run(run(args))
    print(json.dumps({k: v for k, v in result.items() if k != "recovery"}, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return 0 if result["failed"] == 0 and result["truncated"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
