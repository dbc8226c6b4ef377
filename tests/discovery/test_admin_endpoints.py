"""``GET /admin/endpoints``: each member's state (joining, healthy, unhealthy, draining), url, source, since
and in-flight count, as discovery changes the set; and its admin protection."""

from __future__ import annotations

import json
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from burstsched.config import AuthConfig, EndpointConfig, PoolConfig, RouterConfig
from burstsched.front.app import create_app
from burstsched.server.serve import serving

pytestmark = pytest.mark.anyio
MODEL = "kv-demo"
METRICS = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.1\n"
ADMIN = {"Authorization": "Bearer admin-key"}
API = {"Authorization": "Bearer api-key"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Replica:
    """A replica whose ``/health`` status the test sets, with or without ``/metrics``, whose streams send a
    first chunk then wait for ``gate``."""

    metrics: bool = True
    health: int = 200
    gate: anyio.Event = field(default_factory=anyio.Event)
    url: str = ""

    def app(self) -> Starlette:
        async def health(request: Request) -> Response:
            return Response(status_code=self.health)

        async def metrics(request: Request) -> Response:
            return Response(METRICS) if self.metrics else Response(status_code=404)

        async def models(request: Request) -> Response:
            return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

        async def chat(request: Request) -> Response:
            await request.body()
            return StreamingResponse(self._events(), media_type="text/event-stream")

        return Starlette(
            routes=[
                Route("/health", health),
                Route("/metrics", metrics),
                Route("/v1/models", models),
                Route("/v1/chat/completions", chat, methods=["POST"]),
            ]
        )

    async def _events(self) -> AsyncIterator[bytes]:
        for i in range(2):
            choice = {"index": 0, "delta": {"content": f"tok{i} "}, "finish_reason": None}
            chunk = {"id": "c", "object": "chat.completion.chunk", "model": MODEL, "choices": [choice]}
            yield f"data: {json.dumps(chunk)}\n\n".encode()
            if i == 0:
                await self.gate.wait()
        yield b"data: [DONE]\n\n"


class ScriptedDiscovery:
    """A discovery source whose endpoint sets the test sends."""

    source = "scripted"

    def __init__(self) -> None:
        self.send, self._receive = anyio.create_memory_object_stream[list[EndpointConfig]](10)

    async def endpoint_sets(self) -> AsyncGenerator[list[EndpointConfig], None]:
        async with self._receive:
            async for endpoints in self._receive:
                yield endpoints


async def _endpoints(client: httpx.AsyncClient, url: str) -> dict[str, dict[str, Any]]:
    response = await client.get(f"{url}/admin/endpoints", headers=ADMIN)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["discovery"] == "scripted"
    return {e["name"]: e for e in body["endpoints"]}


async def _states(client: httpx.AsyncClient, url: str) -> dict[str, str]:
    return {name: e["state"] for name, e in (await _endpoints(client, url)).items()}


async def _until_states(client: httpx.AsyncClient, url: str, wanted: dict[str, str]) -> None:
    with anyio.fail_after(10):
        while await _states(client, url) != wanted:  # noqa: ASYNC110 - the router's state
            await anyio.sleep(0.01)


async def test_admin_endpoints_lists_each_discovery_state_and_needs_an_admin_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("BURSTSCHED_API_KEYS", raising=False)
    monkeypatch.delenv("BURSTSCHED_ADMIN_KEYS", raising=False)
    config = RouterConfig(
        pool=PoolConfig(scrape_interval_ms=20, health_check_interval_ms=20, failed_checks_before_down=1),
        auth=AuthConfig(api_keys=["api-key"], admin_keys=["admin-key"]),
    )
    discovery = ScriptedDiscovery()
    held, flaky, silent = Replica(), Replica(), Replica(metrics=False)
    app = create_app(config, rng=random.Random(1), discovery=discovery)
    async with (
        serving(held.app()) as held.url,
        serving(flaky.app()) as flaky.url,
        serving(silent.app()) as silent.url,
        serving(app) as url,
        httpx.AsyncClient(timeout=10) as client,
    ):
        # admin protection: no key, or an API key where admin keys are set, gets 401; the admin key passes
        no_key = await client.get(f"{url}/admin/endpoints")
        assert no_key.status_code == 401 and no_key.headers["www-authenticate"].startswith("Bearer")
        assert (await client.get(f"{url}/admin/endpoints", headers=API)).status_code == 401
        wrong = {"Authorization": "Bearer admin-kez"}
        assert (await client.get(f"{url}/admin/endpoints", headers=wrong)).status_code == 401
        assert await _endpoints(client, url) == {}

        before = time.time()
        await discovery.send.send(
            [EndpointConfig(url=held.url, name="held"), EndpointConfig(url=flaky.url, name="flaky")]
        )
        await _until_states(client, url, {"flaky": "healthy", "held": "healthy"})
        listed = await _endpoints(client, url)
        assert listed["held"]["url"] == held.url and listed["held"]["source"] == "scripted"
        assert before - 1 <= listed["held"]["since"] <= time.time() + 1  # epoch seconds
        assert listed["held"]["in_flight"] == 0

        # a stream on "held", held open after its first chunk
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        async with anyio.create_task_group() as tg:
            flaky.health = 503  # "flaky" fails its checks from now on, so no request goes to it
            await _until_states(client, url, {"flaky": "unhealthy", "held": "healthy"})
            first_chunk = anyio.Event()
            outcome: list[str] = []

            async def stream() -> None:
                async with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=API) as r:
                    assert r.headers["x-burstsched-endpoint"] == "held"
                    text = ""
                    async for piece in r.aiter_text():
                        text += piece
                        first_chunk.set()
                outcome.append(text)

            tg.start_soon(stream)
            with anyio.fail_after(10):
                await first_chunk.wait()
            assert (await _endpoints(client, url))["held"]["in_flight"] == 1

            # discovery drops "held" and "flaky" and brings "silent", which never serves /metrics
            await discovery.send.send([EndpointConfig(url=silent.url, name="silent")])
            await _until_states(client, url, {"held": "draining", "silent": "joining"})
            listed = await _endpoints(client, url)
            assert listed["held"]["in_flight"] == 1 and listed["silent"]["url"] == silent.url
            assert not app.state.router.pool.snapshot("silent").healthy  # /health but no /metrics

            held.gate.set()  # the stream ends: "held" has drained and goes
        assert outcome and outcome[0].endswith("data: [DONE]\n\n")
        await _until_states(client, url, {"silent": "joining"})
        metrics = await client.get(f"{url}/metrics", headers=ADMIN)
        assert metrics.status_code == 200
        assert 'burstsched_discovery_endpoints{state="joining"} 1.0' in metrics.text
        await discovery.send.aclose()
