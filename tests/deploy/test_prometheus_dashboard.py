"""A real Prometheus scrapes a running router; every query of the Grafana dashboard must return data.

Two simulated replicas, a router in front of them, and Debian's ``prometheus`` binary scraping the router
every second, configured as the chart's ServiceMonitor makes the Prometheus Operator configure it: target
labels ``namespace``, ``pod`` and ``endpoint`` (the port's name), with ``honor_labels`` so burstsched's own
``endpoint`` label wins. Traffic comes in two rounds (chat, streaming chat, a burst sharing a prefix, a bad
request, attempts on a failing replica), each waited for in Prometheus, so every counter has increased between
two scrapes and its ``rate`` is not zero. Then each panel's query, with Grafana's variables filled in, goes to
``/api/v1/query`` and must return a series with a finite value; so must the prometheus-adapter rule behind the
chart's HorizontalPodAutoscaler. Skipped where the binary is absent (.ci/run installs it).
"""

from __future__ import annotations

import json
import math
import random
import re
import shutil
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml

from burstsched.config import EndpointConfig, RouterConfig
from burstsched.server.serve import running_router
from burstsched.sim import Faults, SimConfig, SimPool
from burstsched.testing.ports import free_port

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "burstsched-dashboard.json"
ADAPTER_VALUES = REPO / "deploy" / "helm" / "prometheus-adapter-values.yaml"
PROMETHEUS = shutil.which("prometheus")
MODEL = "kv-demo"
RATE_WINDOW = "1m"
TARGET_LABELS = {"namespace": "test", "pod": "burstsched-0", "endpoint": "http"}

pytestmark = [
    pytest.mark.skipif(
        PROMETHEUS is None,
        reason="needs the prometheus binary (Debian package prometheus; .ci/run installs it)",
    ),
    pytest.mark.slow,
    pytest.mark.anyio,
]


def dashboard_queries() -> list[tuple[str, str]]:
    """Every panel query as (panel title, PromQL), Grafana's variables filled in as 'All' selects."""
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v.get("allValue") or ".*" for v in dashboard["templating"]["list"]}
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = re.sub(r"\$__(rate_interval|interval|range)\b", RATE_WINDOW, target["expr"])
            for name, value in variables.items():
                expr = re.sub(rf"\$\{{{name}\}}|\${name}\b", value, expr)
            assert "$" not in expr, expr
            queries.append((panel["title"], expr))
    return queries


class Prometheus:
    """Prometheus' HTTP API."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def query(self, expr: str) -> list[dict[str, Any]]:
        response = await self.client.get("/api/v1/query", params={"query": expr})
        body = response.json()
        assert response.status_code == 200 and body["status"] == "success", (expr, body)
        assert body["data"]["resultType"] == "vector", expr
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    async def finite_values(self, expr: str) -> list[float]:
        values = [float(series["value"][1]) for series in await self.query(expr)]
        return [v for v in values if math.isfinite(v)]


async def eventually(check: Callable[[], Awaitable[bool]], *, within_s: float, what: str) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` after ``within_s`` seconds."""
    try:
        with anyio.fail_after(within_s):
            while not await check():  # noqa: ASYNC110 - polls another process's state
                await anyio.sleep(0.2)
    except TimeoutError:
        pytest.fail(f"not within {within_s} s: {what}")


@asynccontextmanager
async def running_prometheus(router_url: str, tmp: Path) -> AsyncIterator[Prometheus]:
    """Start ``prometheus`` on a free 127.0.0.1 port scraping the router; stop it (by its PID) on exit."""
    assert PROMETHEUS is not None
    port = free_port()
    scrape = {
        "job_name": "burstsched",
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "metrics_path": "/metrics",
        "honor_labels": True,
        "static_configs": [{"targets": [router_url.removeprefix("http://")], "labels": TARGET_LABELS}],
    }
    config = tmp / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": [scrape]}))
    log_path = tmp / "prometheus.log"
    command = [
        PROMETHEUS,
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with log_path.open("wb") as log:
        process = await anyio.open_process(command, stdin=None, stdout=log, stderr=log)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:

            async def ready() -> bool:
                if process.returncode is not None:
                    pytest.fail(f"prometheus exited {process.returncode}: {log_path.read_text()[-2000:]}")
                try:
                    return (await client.get("/-/ready")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(ready, within_s=30, what="prometheus ready")
            yield Prometheus(client)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            with anyio.move_on_after(15, shield=True):
                await process.wait()
            if process.returncode is None:
                process.kill()
                with anyio.move_on_after(5, shield=True):
                    await process.wait()
        await process.aclose()


def _chat(content: str, **extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


def _context(rng: random.Random) -> str:
    """A shared context of a few thousand characters, new each call."""
    facts = " ".join(
        f"Fact {i}: node-{rng.randrange(300)} served {rng.randrange(900)} requests." for i in range(60)
    )
    return f"Context {uuid.UUID(int=rng.getrandbits(128))}. {facts}"


async def _router_counter(client: httpx.AsyncClient, family: str, **labels: str) -> float:
    """The sum of a counter's samples with these labels, read from the router's own /metrics."""
    text = (await client.get("/metrics")).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(f"{family}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def _failed_attempts(client: httpx.AsyncClient) -> float:
    total = await _router_counter(client, "burstsched_upstream_attempts_total")
    return total - await _router_counter(client, "burstsched_upstream_attempts_total", result="ok")


async def send_round(client: httpx.AsyncClient, pool: SimPool, rng: random.Random) -> None:
    """Chat, streaming chat, a concurrent burst on one new context, a bad request, a failing replica."""
    context = _context(rng)
    served = await client.post("/v1/chat/completions", json=_chat(f"{context}\nFirst question?"))
    assert served.status_code == 200, served.text

    async def burst_member(i: int) -> None:
        response = await client.post("/v1/chat/completions", json=_chat(f"{context}\nQuestion {i}?"))
        assert response.status_code == 200, response.text

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(burst_member, i)
    for i in range(3):
        payload = _chat(f"{_context(rng)}\nStream {i}?", stream=True)
        async with client.stream("POST", "/v1/chat/completions", json=payload) as stream:
            assert stream.status_code == 200
            assert "[DONE]" in "".join([chunk async for chunk in stream.aiter_text()])
    bad = await client.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert bad.status_code == 400

    # replica 0 answers 500 to everything until a dispatch to it has failed (the router retries elsewhere)
    await pool.aset_faults(0, Faults(error_rate=1.0, error_status=500))
    try:
        before = await _failed_attempts(client)
        for i in range(20):
            response = await client.post("/v1/chat/completions", json=_chat(f"{_context(rng)}\nRetry {i}?"))
            assert response.status_code == 200, response.text
            if await _failed_attempts(client) > before:
                break
        else:
            pytest.fail("no dispatch reached the failing replica in 20 requests")
    finally:
        await pool.aset_faults(0, Faults())


async def test_every_dashboard_query_returns_data_from_a_real_prometheus(tmp_path: Path) -> None:
    queries = dashboard_queries()
    assert len(queries) >= 20
    async with SimPool(2, SimConfig(time_scale=0.02)) as pool:
        endpoints = [EndpointConfig(name=n, url=u) for n, u in zip(pool.names, pool.urls, strict=True)]
        config = RouterConfig(endpoints=endpoints)  # the built-in defaults: config/default.yaml
        async with (
            running_router(config, rng=random.Random(7)) as router,
            httpx.AsyncClient(base_url=router.url, timeout=30) as client,
            running_prometheus(router.url, tmp_path) as prometheus,
        ):

            async def target_up() -> bool:
                return await prometheus.finite_values('up{job="burstsched"} == 1') == [1.0]

            await eventually(target_up, within_s=30, what="the router scraped and up")
            rng = random.Random(11)
            for round_ in range(2):
                await send_round(client, pool, rng)
                served = await _router_counter(client, "burstsched_requests_total")

                async def scraped(served: float = served) -> bool:
                    return any(
                        v >= served for v in await prometheus.finite_values("sum(burstsched_requests_total)")
                    )

                await eventually(scraped, within_s=30, what=f"round {round_}'s requests in Prometheus")

            async def answered(expr: str) -> bool:
                return bool(await prometheus.finite_values(expr))

            missing: list[tuple[str, str]] = []
            for title, expr in queries:
                try:
                    with anyio.fail_after(15):
                        while not await answered(expr):  # noqa: ASYNC110 - waits on Prometheus' scrapes
                            await anyio.sleep(0.25)
                except TimeoutError:
                    missing.append((title, expr))
            assert missing == [], missing

            # the dashboard's endpoint variable lists the replicas (honor_labels kept burstsched's `endpoint`)
            response = await prometheus.client.get(
                "/api/v1/label/endpoint/values", params={"match[]": "burstsched_endpoint_healthy"}
            )
            assert sorted(response.json()["data"]) == sorted(pool.names)

            # the custom metric the chart's HorizontalPodAutoscaler reads, as prometheus-adapter computes it
            (rule,) = yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"]
            assert await prometheus.query(rule["seriesQuery"])
            series = rule["name"]["matches"].strip("^$")
            matchers = ",".join(f'{k}="{TARGET_LABELS[k]}"' for k in ("namespace", "pod"))
            adapter_query = (
                rule["metricsQuery"]
                .replace("<<.Series>>", series)
                .replace("<<.LabelMatchers>>", matchers)
                .replace("<<.GroupBy>>", "pod")
            )
            (per_pod,) = await prometheus.query(adapter_query)
            assert per_pod["metric"] == {"pod": TARGET_LABELS["pod"]}
            assert float(per_pod["value"][1]) >= 0
