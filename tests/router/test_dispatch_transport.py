"""The dispatcher through the app's upstream seam: an injected upstream (an httpx mock) is the network."""

from __future__ import annotations

import json
import random

import anyio
import httpx
import pytest

from burstsched.dispatch import HttpxUpstream
from burstsched.server.serve import running_router

from .helpers import router_config

METRICS = (
    '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
    '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name="m"}} 0\n'
)


class Upstream:
    """Two replicas, r1 and r2 (r2 reports a queue, so r1 ranks first); completions fail on r1: ``connect``,
    ``timeout``, or an HTTP status (e.g. ``"503"``). With ``prompt`` set, every completion must carry it."""

    def __init__(self, r1_failure: str, prompt: str | None = "hi") -> None:
        self.r1_failure = r1_failure
        self.prompt = prompt
        self.completions: list[str] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        path = request.url.path
        if path == "/health":
            return httpx.Response(200)
        if path == "/metrics":
            return httpx.Response(200, text=METRICS.format(waiting=5 if host == "r2" else 0))
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "m", "object": "model"}]})
        self.completions.append(host)
        if host == "r1":
            if self.r1_failure == "connect":
                raise httpx.ConnectError("connection refused", request=request)
            if self.r1_failure == "timeout":
                raise httpx.ReadTimeout("read timed out", request=request)
            if self.r1_failure.isdigit():
                error = {"error": {"message": "no", "type": "x", "code": None}}
                return httpx.Response(int(self.r1_failure), json=error)
        if self.prompt is not None:
            assert json.loads(request.content)["prompt"] == self.prompt
        return httpx.Response(200, json={"choices": [{"text": "ok"}], "host": host})


@pytest.mark.anyio
@pytest.mark.parametrize("failure", ["connect", "timeout"])
async def test_transport_errors_fail_over_to_the_next_best(failure: str) -> None:
    upstream = Upstream(failure)
    config = router_config([("r1", "http://r1:8000"), ("r2", "http://r2:8000")])
    mock = HttpxUpstream(httpx.MockTransport(upstream))
    async with (
        running_router(config, upstream=mock, rng=random.Random(0)) as router,
        httpx.AsyncClient(base_url=router.url, timeout=10) as client,
    ):
        with anyio.fail_after(10):
            response = await client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
        assert response.status_code == 200
        assert response.headers["x-burstsched-endpoint"] == "r2"
        assert upstream.completions == ["r1", "r2"]
        metrics = (await client.get("/metrics")).text
        result = "connect_error" if failure == "connect" else "timeout"
        assert f'burstsched_upstream_attempts_total{{endpoint="r1",result="{result}"}} 1.0' in metrics


@pytest.mark.anyio
async def test_attempts_are_bounded() -> None:
    upstream = Upstream("connect")
    config = router_config([("r1", "http://r1:8000")])
    async with (
        running_router(config, upstream=HttpxUpstream(httpx.MockTransport(upstream))) as router,
        httpx.AsyncClient(base_url=router.url, timeout=10) as client,
    ):
        response = await client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
        assert response.status_code == 502
        assert "r1: ConnectError" in response.json()["error"]["message"]
        assert upstream.completions == ["r1"]


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("r1", ["connect", "timeout", "503", "400"])
async def test_a_stream_s_prefix_is_recorded_only_on_the_endpoint_that_took_it(r1: str, stream: bool) -> None:
    """For a stream, on_dispatch fires for the endpoint whose answer the client got, not for every attempt:
    the approximate index never holds the prompt on r1, which failed before its first byte (or refused it
    with a 400). A whole-body request is recorded at each attempt's start (its head comes with its whole
    answer, too late for a burst to follow it): r1 holds it too, unless the pool forgot r1 as unreachable."""
    upstream = Upstream(r1, prompt=None)
    config = router_config([("r1", "http://r1:8000"), ("r2", "http://r2:8000")])
    async with (
        running_router(
            config, upstream=HttpxUpstream(httpx.MockTransport(upstream)), rng=random.Random(0)
        ) as router,
        httpx.AsyncClient(base_url=router.url, timeout=10) as client,
    ):
        index = next(
            p for p in router.app.state.router.scheduler.profile.plugins if hasattr(p, "index")
        ).index
        with anyio.fail_after(10):
            body = {"model": "m", "prompt": "context " * 200, "stream": stream}
            response = await client.post("/v1/completions", json=body)
        on_r1 = 0 if stream or r1 == "connect" else index.size("r2")  # the same prompt's blocks
        if r1 == "400":  # refused: no failover, and nobody computed the prompt
            assert response.status_code == 400 and upstream.completions == ["r1"]
            assert index.size("r2") == 0
            assert (index.size("r1") > 0) == (not stream)
            return
        assert response.status_code == 200 and upstream.completions == ["r1", "r2"]
        assert index.size("r1") == on_r1 and index.size("r2") > 0
