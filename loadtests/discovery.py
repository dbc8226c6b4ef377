"""Discovery under streaming load: a replica added and one removed while requests run; nothing may be lost.

    python loadtests/discovery.py [--case kubernetes|dns|both] [--duration 40] [--rate 15]
        [--stream-share 0.7] [--time-scale 0.05] [--out loadtests/reports]

Three simulated replicas ``vllm-0..2`` run from the start, each on its own loopback address (127.0.0.2,
127.0.0.3, 127.0.0.4) and all on the same port, as pods behind a headless Service are: one IP each, one
port. Discovery first lists ``vllm-0`` and ``vllm-1``; at 25 % of the run ``vllm-2`` appears; at 55 %
``vllm-0`` disappears (its process keeps running, as a terminating pod does, so a request sent to it after
it left would be served and counted, not refused).

- ``kubernetes``: ``burstsched serve`` runs as its own process with ``discovery.kind: kubernetes`` and
  ``api_url`` pointed at the fake API server (:mod:`burstsched.testing.fake_kube`) this script serves.
  The Service has one EndpointSlice that is modified as a real one is: the new pod is added to it; the
  leaving pod is first marked ``ready: false, terminating: true``, then dropped from it 2 s later.
- ``dns``: discovery's resolver is injectable only in process (the process resolver reads the system's
  ``/etc/hosts`` and name servers, which a load test does not own), so the router runs in this process
  (``create_app`` + uvicorn, built by ``build_discovery`` from a ``discovery.kind: dns`` config) with a
  resolver that answers the name with the addresses the script sets; it re-resolves every
  ``--dns-interval-ms``.

Open-loop load at ``--rate`` requests/s (Poisson arrivals, seeded), ``--stream-share`` of them streamed.
Each request is recorded: sent, completed (200 and a full body: ``[DONE]`` for a stream), failed with an
error (a non-200 status, or an error event in the stream), lost (no response, or a stream cut without an
error event). Joining: the time from the new replica's appearance in discovery to its appearance in the
router's ``/admin/endpoints``, to ``healthy``, to the first request the replica itself received (its own
request record) and to the first response carrying its name in ``x-burstsched-endpoint``. Leaving: the
replica's request count when it was removed from discovery, when the router dropped it (gone from
``/admin/endpoints``: drained) and at the end, which must equal the count when it was dropped.

Writes ``discovery-<case>.json`` and ``discovery-<case>.md`` under ``--out``; exits 1 if a request was lost,
the new replica served nothing, the removed one received a request after it was drained, or a request sent
after the router had noticed the removal (``draining``, else gone, in ``/admin/endpoints``) went to it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import random
import shlex
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import anyio
import httpx
import yaml

from burstsched.config import RouterConfig, decode_config
from burstsched.discovery import build_discovery
from burstsched.front.app import create_app
from burstsched.server.serve import serving
from burstsched.sim import SimConfig, SimPool
from burstsched.testing.fake_kube import FakeKubeApi
from burstsched.wire.sse import DONE, aiter_data
from burstsched.workloads.router_process import router_process

MODEL = "kv-demo"
SERVICE = "vllm"
DNS_NAME = "vllm-headless.default.svc.cluster.local"
REPLICAS = 3
ADD_AT = 0.25
REMOVE_AT = 0.55
TERMINATING_FOR_S = 2.0
"""Kubernetes: how long the leaving pod stays in the slice as terminating before it is dropped from it."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--case", choices=("kubernetes", "dns", "both"), default="both")
    parser.add_argument("--duration", type=float, default=40.0, help="seconds of load per case")
    parser.add_argument("--rate", type=float, default=15.0, help="requests per second (Poisson)")
    parser.add_argument("--stream-share", type=float, default=0.7)
    parser.add_argument("--time-scale", type=float, default=1.0, help="simulator speed (1: real time)")
    parser.add_argument("--dns-interval-ms", type=float, default=1000.0)
    parser.add_argument("--base-config", type=Path, default=Path("config/default.yaml"))
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("loadtests/reports"))
    return parser.parse_args(argv)


# --- the replicas -------------------------------------------------------------------------------------


def address(index: int) -> str:
    return f"127.0.0.{index + 2}"


def shared_port() -> int:
    """A port free on every replica's loopback address right now."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((address(0), 0))
            port = int(probe.getsockname()[1])
        try:
            for i in range(1, REPLICAS):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
                    other.bind((address(i), port))
        except OSError:
            continue
        return port
    raise RuntimeError("no port free on every replica address")


def replica_pool(port: int, time_scale: float) -> SimPool:
    configs = [
        SimConfig(name=f"vllm-{i}", host=address(i), port=port, time_scale=time_scale, seed=i)
        for i in range(REPLICAS)
    ]
    return SimPool(configs=configs, record_requests=True)


# --- discovery, as each case controls it ----------------------------------------------------------------


def pod_slice(port: int, pods: dict[int, str]) -> dict[str, Any]:
    """The Service's one EndpointSlice; ``pods``: replica index -> ``ready`` or ``terminating``."""
    return {
        "metadata": {
            "name": f"{SERVICE}-x7k2p",
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": SERVICE},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": [
            {
                "addresses": [address(i)],
                "conditions": {
                    "ready": state == "ready",
                    "serving": True,
                    "terminating": state == "terminating",
                },
                "targetRef": {"kind": "Pod", "name": f"vllm-{i}", "namespace": "default"},
            }
            for i, state in sorted(pods.items())
        ],
    }


class Membership(Protocol):
    """What the script does to discovery: ``add`` the third replica, ``remove`` the first."""

    endpoint_names: list[str]

    async def add(self) -> None: ...

    async def remove(self) -> None: ...


class KubeMembership:
    def __init__(self, fake: FakeKubeApi, port: int) -> None:
        self._fake = fake
        self._port = port
        self.endpoint_names = [f"vllm-{i}" for i in range(REPLICAS)]

    async def start(self) -> None:
        await self._fake.put(pod_slice(self._port, {0: "ready", 1: "ready"}))

    async def add(self) -> None:
        await self._fake.put(pod_slice(self._port, {0: "ready", 1: "ready", 2: "ready"}))

    async def remove(self) -> None:
        await self._fake.put(pod_slice(self._port, {0: "terminating", 1: "ready", 2: "ready"}))

    async def forget_terminated(self) -> None:
        await self._fake.put(pod_slice(self._port, {1: "ready", 2: "ready"}))


class DnsMembership:
    """The resolver's answer for the name, set by the script."""

    def __init__(self) -> None:
        self.addresses = [address(0), address(1)]
        self.lookups = 0
        self.endpoint_names = [f"host-{address(i).replace('.', '-')}" for i in range(REPLICAS)]

    async def resolve(self, host: str, port: int) -> list[str]:
        self.lookups += 1
        if host != DNS_NAME:
            raise OSError(f"{host}: unknown name")
        return list(self.addresses)

    async def add(self) -> None:
        self.addresses = [address(0), address(1), address(2)]

    async def remove(self) -> None:
        self.addresses = [address(1), address(2)]


def router_config(base: Path, discovery: dict[str, Any]) -> dict[str, Any]:
    raw = yaml.safe_load(base.read_text()) or {}
    raw["endpoints"] = []
    raw["discovery"] = discovery
    return dict(raw)


@asynccontextmanager
async def kube_router(
    base: Path, fake: FakeKubeApi, port: int
) -> AsyncIterator[tuple[str, FakeKubeApi, str]]:
    """The fake API server here, ``burstsched serve`` in its own process watching it."""
    async with serving(fake.app) as api_url:
        raw = router_config(
            base,
            {
                "kind": "kubernetes",
                "service": SERVICE,
                "namespace": "default",
                "port": port,
                "api_url": api_url,
            },
        )
        with tempfile.TemporaryDirectory(prefix="burstsched-discovery-") as folder:
            path = Path(folder) / "router.yaml"
            path.write_text(yaml.safe_dump(raw))
            async with router_process(path, []) as url:
                yield url, fake, f"burstsched serve --config {path.name} (own process); fake API at {api_url}"
        await fake.drop_watches()


@asynccontextmanager
async def dns_router(
    base: Path, membership: DnsMembership, port: int, interval_ms: float
) -> AsyncIterator[str]:
    """The router in this process, its DNS discovery resolving through ``membership``."""
    raw = router_config(base, {"kind": "dns", "host": DNS_NAME, "port": port, "interval_ms": interval_ms})
    config = load_config_dict(raw)
    discovery = build_discovery(config, resolver=membership.resolve)
    app = create_app(config, rng=random.Random(3), discovery=discovery)
    async with serving(app, limits=config.limits) as url:
        with anyio.fail_after(30):
            async with httpx.AsyncClient(timeout=2.0) as client:
                while (await client.get(f"{url}/ready")).status_code != 200:  # noqa: ASYNC110 - a server
                    await anyio.sleep(0.05)
        yield url


def load_config_dict(raw: dict[str, Any]) -> RouterConfig:
    return decode_config(raw, source="discovery load test")


# --- the load ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class RequestRecord:
    id: int
    stream: bool
    sent_s: float
    outcome: str = "pending"
    """completed, error (an HTTP error or an error event), lost (no response, or a stream cut)."""
    status: int | None = None
    endpoint: str | None = None
    head_s: float | None = None
    done_s: float | None = None
    detail: str = ""


def request_body(rng: random.Random, i: int, stream: bool) -> dict[str, Any]:
    topic = rng.choice(("the cache", "the pool", "a replica", "the queue", "the router"))
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"request {i}: tell me about {topic}, in a few words"}],
        "max_tokens": rng.randint(16, 192),
        "stream": stream,
    }
    return body


async def one_request(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], record: RequestRecord, now: Callable[[], float]
) -> None:
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            record.status = response.status_code
            record.endpoint = response.headers.get("x-burstsched-endpoint")
            record.head_s = now()
            if response.status_code != 200:
                record.outcome = "error"
                record.detail = (await response.aread())[:200].decode(errors="replace")
            elif record.stream:
                done = errored = False
                async for data in aiter_data(response.aiter_bytes()):
                    if data == DONE:
                        done = True
                    elif '"error"' in data and "error" in json.loads(data):
                        errored = True
                        record.detail = data[:200]
                record.outcome = "error" if errored else "completed" if done else "lost"
                if record.outcome == "lost":
                    record.detail = "stream ended without [DONE] or an error event"
            else:
                parsed = json.loads(await response.aread())
                record.outcome = "completed" if parsed.get("choices") else "lost"
    except (httpx.HTTPError, ValueError) as exc:
        record.outcome = "lost"
        record.detail = f"{type(exc).__name__}: {exc}"[:200]
    record.done_s = now()


async def open_loop(
    client: httpx.AsyncClient,
    url: str,
    args: argparse.Namespace,
    records: list[RequestRecord],
    now: Callable[[], float],
) -> None:
    """Poisson arrivals for ``args.duration`` seconds; returns once every request has ended."""
    rng = random.Random(args.seed)
    async with anyio.create_task_group() as tg:
        next_at = 0.0
        i = 0
        while True:
            next_at += rng.expovariate(args.rate)
            if next_at >= args.duration:
                break
            await anyio.sleep(max(0.0, next_at - now()))
            stream = rng.random() < args.stream_share
            record = RequestRecord(i, stream, round(now(), 4))
            records.append(record)
            tg.start_soon(one_request, client, url, request_body(rng, i, stream), record, now)
            i += 1


# --- what the router and the replicas show ----------------------------------------------------------------


@dataclass(slots=True)
class Watch:
    """``/admin/endpoints`` and the replicas' own request counts, polled."""

    transitions: list[dict[str, Any]] = field(default_factory=list)
    """Each change of an endpoint's state in ``/admin/endpoints``: t, name, state (``gone`` once absent)."""
    counts: list[list[int]] = field(default_factory=list)
    first_received_s: dict[int, float] = field(default_factory=dict)
    count_at: dict[str, list[int]] = field(default_factory=dict)
    polls: int = 0

    def seen(self, name: str, state: str) -> float | None:
        return next((t["t"] for t in self.transitions if t["name"] == name and t["state"] == state), None)


async def watch_router(
    client: httpx.AsyncClient, url: str, watch: Watch, now: Callable[[], float], stop: anyio.Event
) -> None:
    states: dict[str, str] = {}
    while not stop.is_set():
        try:
            body = (await client.get(f"{url}/admin/endpoints", timeout=2.0)).json()
        except (httpx.HTTPError, ValueError):
            await anyio.sleep(0.02)
            continue
        t = round(now(), 4)
        current = {e["name"]: e["state"] for e in body["endpoints"]}
        in_flight = {e["name"]: e["in_flight"] for e in body["endpoints"]}
        for name, state in current.items():
            if states.get(name) != state:
                watch.transitions.append({"t": t, "name": name, "state": state, "in_flight": in_flight[name]})
        for name in set(states) - set(current):
            watch.transitions.append({"t": t, "name": name, "state": "gone"})
        states = current
        watch.polls += 1
        await anyio.sleep(0.02)


async def watch_replicas(pool: SimPool, watch: Watch, now: Callable[[], float], stop: anyio.Event) -> None:
    while not stop.is_set():
        counts = [len(pool.requests(i)) for i in range(REPLICAS)]
        t = round(now(), 4)
        for i, count in enumerate(counts):
            if count and i not in watch.first_received_s:
                watch.first_received_s[i] = t
        watch.counts.append(counts)
        await anyio.sleep(0.01)


def discovery_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("burstsched_discovery_") and "_created" not in line:
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


# --- one case ----------------------------------------------------------------------------------------------


async def run_case(case: str, args: argparse.Namespace) -> dict[str, Any]:
    port = shared_port()
    records: list[RequestRecord] = []
    watch = Watch()
    events: dict[str, float] = {}
    membership: Membership
    async with replica_pool(port, args.time_scale) as pool:
        router: AbstractAsyncContextManager[Any]
        if case == "kubernetes":
            fake = FakeKubeApi()
            kube = KubeMembership(fake, port)
            await kube.start()
            membership = kube
            router = kube_router(args.base_config, fake, port)
        else:
            dns = DnsMembership()
            membership = dns
            router = dns_router(args.base_config, dns, port, args.dns_interval_ms)
        async with router as started:
            url = started[0] if isinstance(started, tuple) else started
            setup = started[2] if isinstance(started, tuple) else "router in this process (injected resolver)"
            limits = httpx.Limits(max_connections=400, max_keepalive_connections=100)
            async with httpx.AsyncClient(timeout=60.0, limits=limits) as client:
                t0 = time.perf_counter()

                def now() -> float:
                    return time.perf_counter() - t0

                stop = anyio.Event()
                old = membership.endpoint_names[0]

                async def script() -> None:
                    await anyio.sleep(ADD_AT * args.duration)
                    events["added"] = round(now(), 4)
                    watch.count_at["added"] = [len(pool.requests(i)) for i in range(REPLICAS)]
                    await membership.add()
                    await anyio.sleep(max(0.0, REMOVE_AT * args.duration - now()))
                    events["removed"] = round(now(), 4)
                    watch.count_at["removed"] = [len(pool.requests(i)) for i in range(REPLICAS)]
                    await membership.remove()
                    with anyio.fail_after(30):
                        while watch.seen(old, "gone") is None:  # noqa: ASYNC110 - the watcher's state
                            await anyio.sleep(0.005)
                    events["drained"] = round(now(), 4)
                    watch.count_at["drained"] = [len(pool.requests(i)) for i in range(REPLICAS)]
                    if isinstance(membership, KubeMembership):
                        await anyio.sleep(TERMINATING_FOR_S)
                        events["dropped_from_slice"] = round(now(), 4)
                        await membership.forget_terminated()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(watch_router, client, url, watch, now, stop)
                    tg.start_soon(watch_replicas, pool, watch, now, stop)
                    with anyio.fail_after(args.duration + 60):
                        async with anyio.create_task_group() as load:
                            load.start_soon(script)
                            await open_loop(client, url, args, records, now)
                    events["load_over"] = round(now(), 4)
                    await anyio.sleep(0.2)  # a last poll of both after the last response
                    stop.set()
                watch.count_at["end"] = [len(pool.requests(i)) for i in range(REPLICAS)]
                metrics = discovery_metrics((await client.get(f"{url}/metrics")).text)
                final = (await client.get(f"{url}/admin/endpoints")).json()
    return summarize(case, setup, args, records, watch, events, membership, metrics, final)


def summarize(
    case: str,
    setup: str,
    args: argparse.Namespace,
    records: list[RequestRecord],
    watch: Watch,
    events: dict[str, float],
    membership: Membership,
    metrics: dict[str, float],
    final: dict[str, Any],
) -> dict[str, Any]:
    names = membership.endpoint_names
    new, old = names[2], names[0]
    outcomes = {k: sum(r.outcome == k for r in records) for k in ("completed", "error", "lost", "pending")}
    added, removed, drained = events["added"], events["removed"], events["drained"]
    first_header = min(
        (r.head_s for r in records if r.endpoint == new and r.head_s is not None), default=None
    )
    first_done = min(
        (
            r.done_s
            for r in records
            if r.endpoint == new and r.outcome == "completed" and r.done_s is not None
        ),
        default=None,
    )

    def since_added(t: float | None) -> float | None:
        return None if t is None else round(t - added, 4)

    draining_at = watch.seen(old, "draining")
    noticed = draining_at if draining_at is not None else drained

    def in_flight_on_old(at: float) -> list[RequestRecord]:
        return [r for r in records if r.endpoint == old and r.sent_s <= at and (r.done_s or 0) > at]

    in_flight_old = in_flight_on_old(removed)
    in_flight_noticed = in_flight_on_old(noticed)
    after_removal_old = [r for r in records if r.endpoint == old and r.sent_s > removed]
    after_noticed_old = [r for r in records if r.endpoint == old and r.sent_s > noticed]
    by_endpoint: dict[str, int] = {}
    for r in records:
        by_endpoint[r.endpoint or "-"] = by_endpoint.get(r.endpoint or "-", 0) + 1
    joining = {
        "in_admin_endpoints_s": since_added(watch.seen(new, "joining") or watch.seen(new, "healthy")),
        "healthy_s": since_added(watch.seen(new, "healthy")),
        "first_request_received_by_replica_s": since_added(watch.first_received_s.get(2)),
        "first_response_head_with_its_name_s": since_added(first_header),
        "first_completed_request_s": since_added(first_done),
        "requests_it_received_by_the_end": watch.count_at["end"][2],
    }
    leaving: dict[str, Any] = {
        "router_noticed_s": round(noticed - removed, 4),
        "draining_seen_s": None if draining_at is None else round(draining_at - removed, 4),
        "drained_s": round(drained - removed, 4),
        "in_flight_on_it_at_removal": len(in_flight_old),
        "in_flight_outcomes": {
            k: sum(r.outcome == k for r in in_flight_old) for k in ("completed", "error", "lost")
        },
        "in_flight_on_it_when_the_router_noticed": len(in_flight_noticed),
        "in_flight_outcomes_when_the_router_noticed": {
            k: sum(r.outcome == k for r in in_flight_noticed) for k in ("completed", "error", "lost")
        },
        "requests_sent_after_removal_routed_to_it": len(after_removal_old),
        "requests_sent_after_the_router_noticed_routed_to_it": len(after_noticed_old),
        "its_request_count_at_removal": watch.count_at["removed"][0],
        "its_request_count_when_drained": watch.count_at["drained"][0],
        "its_request_count_at_end": watch.count_at["end"][0],
    }
    ok = (
        outcomes["lost"] == 0
        and outcomes["pending"] == 0
        and watch.count_at["end"][2] > 0
        and watch.count_at["drained"][0] == watch.count_at["end"][0]
        and not after_noticed_old
    )
    return {
        "case": case,
        "ok": ok,
        "setup": setup,
        "parameters": {
            "duration_s": args.duration,
            "rate_per_s": args.rate,
            "stream_share": args.stream_share,
            "time_scale": args.time_scale,
            "dns_interval_ms": args.dns_interval_ms if case == "dns" else None,
            "seed": args.seed,
        },
        "events_s": events,
        "requests": {"sent": len(records), **outcomes},
        "by_endpoint": dict(sorted(by_endpoint.items())),
        "latency_s": latency(records),
        "joining_since_added": joining,
        "leaving_since_removed": leaving,
        "transitions": watch.transitions,
        "admin_polls": watch.polls,
        "final_endpoints": final,
        "discovery_metrics": metrics,
        "problems": [asdict(r) for r in records if r.outcome != "completed"][:20],
    }


def latency(records: list[RequestRecord]) -> dict[str, float | None]:
    done = sorted(r.done_s - r.sent_s for r in records if r.outcome == "completed" and r.done_s is not None)
    if not done:
        return {"p50": None, "p99": None, "max": None}

    def at(q: float) -> float:
        return round(done[min(len(done) - 1, int(q * len(done)))], 4)

    return {"p50": at(0.5), "p99": at(0.99), "max": round(done[-1], 4)}


def markdown(result: dict[str, Any], command: str) -> str:
    r, j, lv = result["requests"], result["joining_since_added"], result["leaving_since_removed"]
    p, ev = result["parameters"], result["events_s"]
    lines = [
        f"# Discovery under load: {result['case']}",
        "",
        f"Command: `{command}`",
        "",
        f"Setup: {result['setup']}. Three simulated replicas on 127.0.0.2-4, one shared port; "
        f"{p['rate_per_s']} req/s Poisson for {p['duration_s']} s, "
        f"{int(p['stream_share'] * 100)} % streamed, "
        f"simulator time scale {p['time_scale']}"
        + (f", DNS re-resolved every {p['dns_interval_ms']:.0f} ms" if p["dns_interval_ms"] else "")
        + ".",
        "",
        f"Result: **{'PASS' if result['ok'] else 'FAIL'}**",
        "",
        "| sent | completed | error | lost |",
        "|---:|---:|---:|---:|",
        f"| {r['sent']} | {r['completed']} | {r['error']} | {r['lost']} |",
        "",
        f"Events (s from the start of the load): added {ev['added']}, removed {ev['removed']}, "
        f"drained {ev['drained']}"
        + (f", dropped from the slice {ev['dropped_from_slice']}" if "dropped_from_slice" in ev else "")
        + f". Requests by endpoint (header): {result['by_endpoint']}. "
        f"Latency of completed requests p50 {result['latency_s']['p50']} s, "
        f"p99 {result['latency_s']['p99']} s.",
        "",
        "New replica, seconds after it appeared in discovery:",
        "",
        "| in /admin/endpoints | healthy | first request it received | first response naming it "
        "| first completed |",
        "|---:|---:|---:|---:|---:|",
        f"| {j['in_admin_endpoints_s']} | {j['healthy_s']} | {j['first_request_received_by_replica_s']} "
        f"| {j['first_response_head_with_its_name_s']} | {j['first_completed_request_s']} |",
        "",
        f"It received {j['requests_it_received_by_the_end']} requests by the end.",
        "",
        "Removed replica:",
        "",
        f"- draining seen {lv['draining_seen_s']} s and drained (gone from /admin/endpoints) "
        f"{lv['drained_s']} s after it left discovery;",
        f"- the router noticed {lv['router_noticed_s']} s after (draining seen, else gone);",
        f"- {lv['in_flight_on_it_at_removal']} requests were in flight on it at removal: "
        f"{lv['in_flight_outcomes']}; {lv['in_flight_on_it_when_the_router_noticed']} "
        "when the router noticed: "
        f"{lv['in_flight_outcomes_when_the_router_noticed']};",
        f"- requests routed to it that were sent after its removal from discovery: "
        f"{lv['requests_sent_after_removal_routed_to_it']} (before the router noticed), after the router "
        f"noticed: {lv['requests_sent_after_the_router_noticed_routed_to_it']};",
        f"- its own request count: {lv['its_request_count_at_removal']} at removal, "
        f"{lv['its_request_count_when_drained']} when drained, {lv['its_request_count_at_end']} at the end.",
        "",
        f"Router discovery metrics at the end: `{result['discovery_metrics']}`",
        "",
    ]
    if result["problems"]:
        lines += [
            "Requests not completed (first 20):",
            "",
            "```",
            *map(json.dumps, result["problems"]),
            "```",
            "",
        ]
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> bool:
    command = "python loadtests/discovery.py " + shlex.join(sys.argv[1:])
    cases = ("kubernetes", "dns") if args.case == "both" else (args.case,)
    args.out.mkdir(parents=True, exist_ok=True)
    all_ok = True
    for case in cases:
        result = await run_case(case, args)
        result["command"] = command
        (args.out / f"discovery-{case}.json").write_text(json.dumps(result, indent=2) + "\n")
        (args.out / f"discovery-{case}.md").write_text(markdown(result, command))
        print(markdown(result, command))
        all_ok = all_ok and bool(result["ok"])
    return all_ok


if __name__ == "__main__":
    sys.exit(0 if anyio.run(main, parse_args()) else 1)
