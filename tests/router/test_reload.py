"""Live config: ``POST /admin/reload``, SIGHUP and the file watch swap a new config in between requests.

In-process routers (real uvicorn on 127.0.0.1) read their config from a file through the same source
``burstsched serve`` uses; the SIGHUP and file-watch paths run ``burstsched serve`` as a subprocess, stopped
by its PID.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import anyio
import httpx
import pytest

from burstsched.config import parse_config_text
from burstsched.framework import PluginContext, PluginRegistry
from burstsched.scheduling import PreviousPlugins, build_scheduler
from burstsched.server.reload import config_source
from burstsched.server.serve import RunningRouter, running_router
from burstsched.server.workers import WORKER_HEADER
from burstsched.testing.ports import free_port
from burstsched.testing.replicas import MODEL, Replica, sim_replicas

from .helpers import eventually, metric, until_serving

REPO = Path(__file__).resolve().parents[2]

POOL = """
pool:
  scrape_interval_ms: 20
  staleness_threshold_ms: 2000
  health_check_interval_ms: 100
"""

CONTEXT = " ".join(
    f"Observation {i}: service-{i % 7} on node-{i % 13} reported {i} errors." for i in range(120)
)
"""A shared context of ~7 KB: dozens of prefix blocks."""


def config_text(
    replicas: Sequence[Replica],
    *,
    prefix_weight: float = 3,
    admission: str = "admission:\n  enabled: false\n",
    extra: str = "",
) -> str:
    endpoints = "".join(f"  - name: {r.name}\n    url: {r.url}\n" for r in replicas)
    return (
        (f"endpoints:\n{endpoints}" if replicas else "endpoints: []\n") + f"{POOL}{admission}"
        "plugins:\n"
        "  - type: approx-prefix-producer\n"
        "  - type: health-filter\n"
        "  - type: prefix-cache-scorer\n"
        "  - type: queue-scorer\n"
        "  - type: kv-utilization-scorer\n"
        "  - type: max-score-picker\n"
        "profile:\n"
        "  plugins:\n"
        "    - plugin_ref: approx-prefix-producer\n"
        "    - plugin_ref: health-filter\n"
        "    - plugin_ref: prefix-cache-scorer\n"
        f"      weight: {prefix_weight}\n"
        "    - plugin_ref: queue-scorer\n"
        "      weight: 2\n"
        "    - plugin_ref: kv-utilization-scorer\n"
        "      weight: 2\n"
        "  picker: max-score-picker\n" + extra
    )


def chat(content: str) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4}


@asynccontextmanager
async def router_from(path: Path) -> AsyncIterator[tuple[RunningRouter, httpx.AsyncClient]]:
    source = config_source(path)
    async with running_router(source(), config_source=source) as router:
        async with httpx.AsyncClient(base_url=router.url, timeout=30) as client:

            async def ready() -> bool:
                statuses = (await client.get("/admin/endpoints")).json()["endpoints"]
                return bool(statuses) and all(s["state"] == "healthy" for s in statuses)

            await eventually(ready)
            yield router, client


async def reload(client: httpx.AsyncClient, expected: int = 200) -> dict[str, object]:
    response = await client.post("/admin/reload")
    assert response.status_code == expected, response.text
    body: dict[str, object] = response.json()
    return body


@pytest.mark.anyio
async def test_a_weight_change_flips_the_decision_and_the_prefix_index_stays_warm(tmp_path: Path) -> None:
    async with sim_replicas(2) as replicas:
        path = tmp_path / "router.yaml"
        path.write_text(config_text(replicas, prefix_weight=3))
        async with router_from(path) as (router, client):
            producer = router.app.state.router.scheduler.profile.producers[0]
            first = await client.post("/v1/chat/completions", json=chat(CONTEXT + " Q: one?"))
            assert first.status_code == 200
            warm = first.headers["x-burstsched-endpoint"]
            follow = await client.post("/v1/chat/completions", json=chat(CONTEXT + " Q: two?"))
            assert follow.headers["x-burstsched-endpoint"] == warm  # the prefix weighs 3

            path.write_text(config_text(replicas, prefix_weight=0))
            outcome = await reload(client)
            assert outcome["outcome"] == "applied"
            assert "approx-prefix-producer" in outcome["reused_plugins"]  # type: ignore[operator]
            assert router.app.state.router.scheduler.profile.producers[0] is producer
            # weight 0: queue and KV tie, the picker takes the endpoint it chose least recently
            cold = await client.post("/v1/chat/completions", json=chat(CONTEXT + " Q: three?"))
            assert cold.status_code == 200
            assert cold.headers["x-burstsched-endpoint"] != warm

            path.write_text(config_text(replicas, prefix_weight=3))
            assert (await reload(client))["outcome"] == "applied"
            back = await client.post("/v1/chat/completions", json=chat(CONTEXT + " Q: four?"))
            assert back.headers["x-burstsched-endpoint"] == warm
            matched, total = back.headers["x-burstsched-prefix-blocks"].split("/")
            assert int(matched) > 0 and int(total) > 0  # the index kept what it learned before the reloads

            metrics = (await client.get("/metrics")).text
            assert metric(metrics, "burstsched_config_reloads_total", outcome="applied") == 2


@pytest.mark.anyio
async def test_endpoints_join_and_leave_by_reload(tmp_path: Path) -> None:
    async with sim_replicas(2) as (a, b):
        path = tmp_path / "router.yaml"
        path.write_text(config_text([a]))
        async with router_from(path) as (router, client):
            path.write_text(config_text([a, b]))
            outcome = await reload(client)
            assert outcome["endpoints_added"] == [b.name] and outcome["endpoints_removed"] == []

            async def both_healthy() -> bool:
                states = {
                    s["name"]: s["state"] for s in (await client.get("/admin/endpoints")).json()["endpoints"]
                }
                return states == {a.name: "healthy", b.name: "healthy"}

            await eventually(both_healthy)

            path.write_text(config_text([b]))
            outcome = await reload(client)
            assert outcome["endpoints_removed"] == [a.name]

            async def only_b() -> bool:
                names = [s["name"] for s in (await client.get("/admin/endpoints")).json()["endpoints"]]
                return names == [b.name]

            await eventually(only_b)
            before = len(a.requests)
            for i in range(4):
                response = await client.post("/v1/chat/completions", json=chat(f"question {i}"))
                assert response.status_code == 200
                assert response.headers["x-burstsched-endpoint"] == b.name
            assert len(a.requests) == before


@pytest.mark.anyio
async def test_an_invalid_config_is_refused_naming_the_field_and_the_old_one_serves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with sim_replicas(2) as replicas:
        path = tmp_path / "router.yaml"
        path.write_text(config_text(replicas))
        async with router_from(path) as (router, client):
            profile = router.app.state.router.scheduler.profile
            good = config_text(replicas)
            path.write_text(good.replace("type: queue-scorer", "type: no-such-scorer"))
            outcome = await reload(client, expected=422)
            assert outcome["outcome"] == "refused"
            fields = [i["field"] for i in outcome["issues"]]  # type: ignore[attr-defined]
            assert fields == ["plugins[3].type"]
            assert "plugins[3].type" in caplog.text

            path.write_text(good.replace("weight: 2", "weight: -1", 1))
            outcome = await reload(client, expected=422)
            assert [i["field"] for i in outcome["issues"]] == ["profile.plugins[3].weight"]  # type: ignore[attr-defined]

            path.write_text("endpoints: [")
            assert (await reload(client, expected=422))["outcome"] == "refused"

            assert router.app.state.router.scheduler.profile is profile
            response = await client.post("/v1/chat/completions", json=chat("still served"))
            assert response.status_code == 200
            metrics = (await client.get("/metrics")).text
            assert metric(metrics, "burstsched_config_reloads_total", outcome="refused") == 3
            assert metric(metrics, "burstsched_config_reloads_total", outcome="applied") == 0


@pytest.mark.anyio
async def test_the_admission_window_changes_live_and_restart_only_fields_are_named(tmp_path: Path) -> None:
    async with sim_replicas(2) as replicas:
        path = tmp_path / "router.yaml"
        path.write_text(config_text(replicas))
        async with router_from(path) as (router, client):
            assert (await client.post("/v1/chat/completions", json=chat(CONTEXT + " a"))).status_code == 200
            windowed = "admission:\n  enabled: true\n  window_ms: 5\n"
            path.write_text(
                config_text(replicas, admission=windowed, extra="limits:\n  max_header_bytes: 9000\n")
            )
            outcome = await reload(client)
            assert outcome["outcome"] == "applied"
            assert outcome["restart_required"] == ["limits.max_header_bytes"]
            assert router.app.state.router.config.admission.enabled
            # a new prompt long enough to group, cold everywhere: it waits in a window as its group's leader
            response = await client.post("/v1/chat/completions", json=chat("Fresh. " + CONTEXT))
            assert response.status_code == 200
            metrics = (await client.get("/metrics")).text
            assert metric(metrics, "burstsched_admission_wait_seconds_count", role="leader") == 1
            assert metric(metrics, "burstsched_admission_wait_seconds_count", role="bypass") == 1

            assert (await reload(client))["outcome"] == "unchanged"  # the same file again


@pytest.mark.anyio
async def test_a_router_without_a_config_source_refuses_reload() -> None:
    async with sim_replicas(1) as replicas:
        source = config_source(
            REPO / "config" / "prefix-aware.yaml", endpoints=[f"{replicas[0].name}={replicas[0].url}"]
        )
        async with running_router(source()) as router:
            async with httpx.AsyncClient(base_url=router.url, timeout=10) as client:
                assert (await reload(client, expected=422))["outcome"] == "refused"


@asynccontextmanager
async def serve_process(
    path: Path, *extra: str
) -> AsyncIterator[tuple[subprocess.Popen[bytes], httpx.AsyncClient]]:
    port = free_port()
    args = [sys.executable, "-m", "burstsched", "serve", "--config", str(path), "--port", str(port), *extra]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: ASYNC220
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            await until_serving(proc, client)
            yield proc, client
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                await anyio.to_thread.run_sync(lambda: proc.wait(timeout=20))
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


async def wait_reloads(client: httpx.AsyncClient, outcome: str, count: int) -> None:
    async def seen() -> bool:
        text = (await client.get("/metrics")).text
        return metric(text, "burstsched_config_reloads_total", outcome=outcome) >= count

    await eventually(seen, within_s=15, poll=0.05)


@pytest.mark.anyio
async def test_sighup_reloads_a_serve_process(tmp_path: Path) -> None:
    async with sim_replicas(2) as (a, b):
        path = tmp_path / "router.yaml"
        path.write_text(config_text([a]))
        async with serve_process(path) as (proc, client):
            path.write_text(config_text([a, b]))
            proc.send_signal(signal.SIGHUP)
            await wait_reloads(client, "applied", 1)

            async def b_serves() -> bool:
                names = {s["name"] for s in (await client.get("/admin/endpoints")).json()["endpoints"]}
                return names == {a.name, b.name}

            await eventually(b_serves)
            path.write_text("plugins: 7\n")
            proc.send_signal(signal.SIGHUP)
            await wait_reloads(client, "refused", 1)
            response = await client.post("/v1/chat/completions", json=chat("after a refused reload"))
            assert response.status_code == 200
            assert proc.poll() is None


@pytest.mark.anyio
async def test_the_file_watch_reloads_a_changed_file(tmp_path: Path) -> None:
    async with sim_replicas(2) as (a, b):
        path = tmp_path / "router.yaml"
        path.write_text(config_text([a]))
        async with serve_process(path, "--reload-poll", "0.1") as (proc, client):
            path.write_text(config_text([a, b]))
            await wait_reloads(client, "applied", 1)
            text = (await client.get("/metrics")).text
            assert metric(text, "burstsched_config_reloads_total", outcome="refused") == 0


def test_the_builder_reuses_unchanged_plugins_and_rebuilds_changed_ones() -> None:
    registry = PluginRegistry.discover()
    context = PluginContext(rng=random.Random(0))
    first = parse_config_text(config_text([]))
    old = build_scheduler(first, registry, context)
    plugins = {p.name: p for p in old.profile.plugins}

    reweighted = parse_config_text(config_text([], prefix_weight=0))
    previous = PreviousPlugins(first.plugins, plugins)
    new = build_scheduler(reweighted, registry, context, previous=previous)
    assert {p.name for p in new.profile.plugins} == set(plugins)
    assert all(p is plugins[p.name] for p in new.profile.plugins)  # weights live in the profile
    assert [s.weight for s in new.profile.scorers] == [0, 2, 2]

    tuned = config_text([]).replace(
        "  - type: approx-prefix-producer\n",
        "  - type: approx-prefix-producer\n    parameters:\n      default_capacity_blocks: 1000\n",
    )
    previous = PreviousPlugins(first.plugins, plugins)
    rebuilt = build_scheduler(parse_config_text(tuned), registry, context, previous=previous)
    producer = rebuilt.profile.producers[0]
    assert producer is not plugins["approx-prefix-producer"]
    assert "approx-prefix-producer" not in previous.reused and "queue-scorer" in previous.reused


@pytest.mark.anyio
async def test_the_parent_of_workers_forwards_sighup_to_each(tmp_path: Path) -> None:
    async with sim_replicas(2) as (a, b):
        path = tmp_path / "router.yaml"
        path.write_text(config_text([a]))
        async with serve_process(path, "--workers", "2") as (proc, client):  # one worker serving
            url = str(client.base_url)
            applied: set[str] = set()

            async def both_applied() -> bool:
                # a new connection each time: the kernel spreads them over the workers' sockets
                async with httpx.AsyncClient(base_url=url, timeout=5) as fresh:
                    response = await fresh.get("/metrics")
                if metric(response.text, "burstsched_config_reloads_total", outcome="applied") >= 1:
                    applied.add(response.headers[WORKER_HEADER])
                return applied == {"0", "1"}

            # at once: a worker still starting gets the SIGHUP once it serves
            path.write_text(config_text([a, b]))
            proc.send_signal(signal.SIGHUP)
            await eventually(both_applied, within_s=30, poll=0.02)
            assert proc.poll() is None


@pytest.mark.anyio
async def test_adding_a_kv_event_consumer_is_refused(tmp_path: Path) -> None:
    async with sim_replicas(1) as replicas:
        path = tmp_path / "router.yaml"
        path.write_text(config_text(replicas))
        async with router_from(path) as (router, client):
            profile = router.app.state.router.scheduler.profile
            precise = config_text(replicas).replace(
                "  - type: approx-prefix-producer\n", "  - type: precise-prefix-producer\n"
            )
            path.write_text(
                precise.replace("plugin_ref: approx-prefix-producer", "plugin_ref: precise-prefix-producer")
            )
            outcome = await reload(client, expected=422)
            issues = outcome["issues"]
            assert isinstance(issues, list) and [i["field"] for i in issues] == ["plugins[0]"]
            assert "KV events" in issues[0]["message"]
            assert router.app.state.router.scheduler.profile is profile
