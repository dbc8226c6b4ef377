"""``burstsched epp`` behind a real Envoy (llm-d's standalone mode: ext_proc + an ORIGINAL_DST cluster that
reads ``x-gateway-destination-endpoint``), in front of simulated replicas, all on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest

from burstsched.config import RouterConfig
from burstsched.epp.service import RunningEpp, running_epp
from burstsched.epp.wire import endpoint_address
from burstsched.sim import SimPool
from burstsched.workloads.gateway import DESTINATION, EnvoyMode, RunningEnvoy, envoy
from tests.epp.gateway_requests import burst_landings, chat, each_api, words
from tests.router.helpers import eventually, router_config

REPO = Path(__file__).resolve().parents[2]
FULL_DUPLEX = EnvoyMode()
BUFFERED = EnvoyMode(request_body="BUFFERED", response_body="NONE")

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


def _config(sims: SimPool, yaml_name: str = "prefix-aware.yaml", **updates: object) -> RouterConfig:
    pool = list(zip(sims.names, sims.urls, strict=True))[:2]
    return router_config(pool, (REPO / "config" / yaml_name).read_text(), **updates)


@asynccontextmanager
async def gateway(
    sims: SimPool, envoy_path: Path, workdir: Path, mode: EnvoyMode = FULL_DUPLEX, **config: object
) -> AsyncIterator[tuple[RunningEpp, RunningEnvoy, httpx.AsyncClient]]:
    async with running_epp(_config(sims, **config), rng=random.Random(3)) as epp:  # type: ignore[arg-type]
        with envoy(envoy_path, epp.port, mode, workdir) as gw:
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
                yield epp, gw, client


def _destinations(sims: SimPool, index: int) -> list[str]:
    """The destination header each request recorded by replica ``index`` carried when it arrived."""
    return [r.headers.get(DESTINATION, "") for r in sims.requests(index)]


@pytest.mark.parametrize("mode", [FULL_DUPLEX, BUFFERED], ids=["full-duplex", "buffered"])
async def test_chat_and_completions_streamed_and_not(
    sims: SimPool, envoy_path: Path, workdir: Path, mode: EnvoyMode
) -> None:
    """Each API, streamed and whole, passes through intact; the replica named in the response got it, with
    the picker's destination header naming itself and nothing else."""
    async with gateway(sims, envoy_path, workdir, mode) as (_, _, client):
        with anyio.fail_after(60):
            served = await each_api(client)
    for index, name in enumerate(sims.names[:2]):
        assert _destinations(sims, index) == [endpoint_address(sims.urls[index])] * served.count(name)
    assert sims.requests(2) == []


@pytest.mark.parametrize("mode", [FULL_DUPLEX, BUFFERED], ids=["full-duplex", "buffered"])
async def test_a_200_kb_prompt_arrives_whole(
    sims: SimPool, envoy_path: Path, workdir: Path, mode: EnvoyMode
) -> None:
    """The replica counts the same prompt tokens through the gateway as when sent the body directly."""
    content = words(random.Random(5), 200_000)
    body = chat(content, max_tokens=1)
    assert len(json.dumps(body)) > 200_000
    async with gateway(sims, envoy_path, workdir, mode) as (_, _, client):
        with anyio.fail_after(60):
            via = await client.post("/v1/chat/completions", json=body)
            assert via.status_code == 200, via.text
            async with httpx.AsyncClient(timeout=30) as direct_client:
                direct = await direct_client.post(sims.urls[2] + "/v1/chat/completions", json=body)
    assert direct.status_code == 200, direct.text
    tokens = direct.json()["usage"]["prompt_tokens"]
    assert tokens > 5_000
    assert via.json()["usage"]["prompt_tokens"] == tokens


async def test_a_burst_sharing_a_new_prefix_lands_on_one_replica(
    sims: SimPool, envoy_path: Path, workdir: Path
) -> None:
    """Burst admission through the gateway: each burst of 8 sharing a new prefix goes to one replica, and the
    bursts of different prefixes do not all pile on one."""
    async with gateway(sims, envoy_path, workdir, yaml_name="default.yaml") as (_, _, client):
        with anyio.fail_after(60):
            landed = await burst_landings(client, random.Random(11))
    assert all(len(s) == 1 for s in landed), landed
    assert len(set().union(*landed)) == 2, landed


async def test_a_cancelled_stream_releases_its_endpoint(
    sims: SimPool, envoy_path: Path, workdir: Path
) -> None:
    """A client that goes away mid-stream: the picker's stream ends and the pool no longer counts it."""
    async with gateway(sims, envoy_path, workdir) as (epp, _, client):
        with anyio.fail_after(60):
            body = chat("Tell a long story.", max_tokens=2000, stream=True)
            async with client.stream("POST", "/v1/chat/completions", json=body) as stream:
                assert stream.status_code == 200
                chunks = stream.aiter_raw()
                await anext(chunks)
                name = stream.headers["x-burstsched-endpoint"]
                assert epp.router.pool.snapshot(name).in_flight == 1
            # leaving the block closes the connection before the stream's end

            async def released() -> bool:
                return epp.router.pool.snapshot(name).in_flight == 0

            await eventually(released, within_s=10)
            assert len(sims.requests(sims.names.index(name))) == 1


async def test_a_client_destination_header_is_never_obeyed(
    sims: SimPool, envoy_path: Path, workdir: Path
) -> None:
    """A client naming the decoy replica (not in the pool) in the destination header: the request still goes
    where the picker says, and the replica sees only the picker's value."""
    decoy = endpoint_address(sims.urls[2])
    for mode in (FULL_DUPLEX, BUFFERED, EnvoyMode(strip_destination=False)):
        async with gateway(sims, envoy_path, workdir, mode) as (_, _, client):
            with anyio.fail_after(30):
                for i in range(4):
                    response = await client.post(
                        "/v1/chat/completions", json=chat(f"steer {i}"), headers={DESTINATION: decoy}
                    )
                    assert response.status_code == 200, response.text
                    assert response.headers["x-burstsched-endpoint"] in sims.names[:2]
    assert sims.requests(2) == []
    for index in (0, 1):
        assert set(_destinations(sims, index)) <= {endpoint_address(sims.urls[index])}


async def test_no_ready_endpoint_is_503(sims: SimPool, envoy_path: Path, workdir: Path) -> None:
    """Immediate responses in OpenAI's error shape: 503 when no endpoint of the pool is healthy (and the
    metrics port's /ready says 503 too, while /health stays 200)."""
    async with (
        running_epp(_config(sims), rng=random.Random(3), metrics_port=0) as epp,
        httpx.AsyncClient(timeout=10) as probe,
    ):
        ready_url = f"http://127.0.0.1:{epp.metrics_port}/ready"
        assert (await probe.get(ready_url)).status_code == 200
        with envoy(envoy_path, epp.port, FULL_DUPLEX, workdir) as gw:
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
                with anyio.fail_after(30):
                    await sims.akill(0)
                    await sims.akill(1)

                    async def none_healthy() -> bool:
                        return epp.router.pool.healthy_count() == 0

                    await eventually(none_healthy, within_s=10)
                    response = await client.post("/v1/chat/completions", json=chat("anyone?"))
                    not_ready = await probe.get(ready_url)
                    alive = await probe.get(ready_url.replace("/ready", "/health"))
    assert (not_ready.status_code, alive.status_code) == (503, 200)
    assert response.status_code == 503
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["type"] and "no healthy endpoint" in error["message"]


async def test_admission_shedding_is_429(sims: SimPool, envoy_path: Path, workdir: Path) -> None:
    """Admission's queue holds one request: the others of a burst are shed with 429 and Retry-After."""
    config = _config(sims, "burst.yaml")
    admission = config.admission.model_copy(update={"queue_limit": 1, "window_ms": 300, "bypass_warm": False})
    async with running_epp(config.model_copy(update={"admission": admission})) as epp:
        with envoy(envoy_path, epp.port, FULL_DUPLEX, workdir) as gw:
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
                context = words(random.Random(2), 4_000)  # long enough to wait in the window
                with anyio.fail_after(30):
                    responses = await asyncio.gather(
                        *(client.post("/v1/chat/completions", json=chat(f"{context} {i}")) for i in range(4))
                    )
    statuses = sorted(r.status_code for r in responses)
    assert statuses[0] == 200 and statuses[-1] == 429, statuses
    shed = next(r for r in responses if r.status_code == 429)
    assert shed.headers["retry-after"] == "1"
    assert shed.json()["error"]["type"]


def _sample(page: str, name: str) -> float:
    """The value of one sample line of a Prometheus page (0 when absent)."""
    for line in page.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _ok(page: str, endpoints: set[str]) -> float:
    return sum(_sample(page, f'burstsched_requests_total{{endpoint="{n}",outcome="ok"}}') for n in endpoints)


@pytest.mark.parametrize(
    ("mode", "body_seen"), [(FULL_DUPLEX, True), (BUFFERED, False)], ids=["full-duplex", "buffered"]
)
async def test_the_metrics_port_counts_what_the_picker_sees(
    sims: SimPool, envoy_path: Path, workdir: Path, mode: EnvoyMode, body_seen: bool
) -> None:
    """``GET /metrics`` on the picker's metrics port: the requests by endpoint and outcome, and, where the
    gateway sends the response body, a stream's time to first token and every response's end-to-end time."""
    async with running_epp(_config(sims), metrics_port=0) as epp:
        assert epp.metrics_port is not None
        with envoy(envoy_path, epp.port, mode, workdir) as gw:
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
                with anyio.fail_after(30):
                    whole = await client.post("/v1/chat/completions", json=chat("Count me."))
                    body = chat("Stream me.", stream=True)
                    async with client.stream("POST", "/v1/chat/completions", json=body) as stream:
                        await stream.aread()
                    name = stream.headers["x-burstsched-endpoint"]
                    served = {whole.headers["x-burstsched-endpoint"], name}
                    metrics_url = f"http://127.0.0.1:{epp.metrics_port}/metrics"
                    page = await client.get(metrics_url)

                    async def both_counted() -> bool:
                        nonlocal page
                        page = await client.get(metrics_url)
                        return _ok(page.text, served) == 2

                    await eventually(both_counted, within_s=10)
                    base = f"http://127.0.0.1:{epp.metrics_port}"
                    health, ready = await client.get(base + "/health"), await client.get(base + "/ready")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/plain")
    assert (health.status_code, ready.status_code) == (200, 200)
    text = page.text
    ttft = _sample(text, f'burstsched_time_to_first_token_seconds_count{{endpoint="{name}"}}')
    e2e = sum(
        _sample(text, f'burstsched_e2e_request_latency_seconds_count{{endpoint="{n}"}}') for n in set(served)
    )
    assert (ttft, e2e) == ((1.0, 2.0) if body_seen else (0.0, 0.0)), text
