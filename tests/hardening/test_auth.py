"""Client API keys, the admin key and the admin port, and that no client input chooses the upstream."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from burstsched.config import AuthConfig
from burstsched.front.app import create_app
from burstsched.front.auth import API_KEYS_ENV, AuthSettings
from burstsched.server.serve import RunningRouter, running_router
from burstsched.testing.replicas import MODEL, Replica, sim_replicas

from .helpers import config_for, eventually

pytestmark = pytest.mark.anyio

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
async def reps() -> AsyncIterator[list[Replica]]:
    async with sim_replicas(1) as running:
        yield running


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_keys_come_from_the_config_and_the_environment() -> None:
    settings = AuthSettings.resolve(
        AuthConfig(api_keys=["a1"], admin_keys=["m1"]),
        {API_KEYS_ENV: " a2, ,a1 ,a3", "BURSTSCHED_ADMIN_KEYS": "m2"},
    )
    assert settings.api_keys == (b"a1", b"a2", b"a3")
    assert settings.admin_keys == (b"m1", b"m2")
    assert not AuthSettings.resolve(AuthConfig(), {}).enabled


def test_config_refuses_blank_or_comma_keys() -> None:
    for bad in ("", " k", "a,b"):
        with pytest.raises(ValueError):
            AuthConfig(api_keys=[bad])


async def test_api_keys_guard_the_api_and_admin_keys_guard_metrics_and_admin(
    reps: list[Replica], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(API_KEYS_ENV, "env-key")
    auth = AuthConfig(api_keys=["cfg-key"], admin_keys=["admin-key"])
    config = config_for([(r.name, r.url) for r in reps], auth=auth)
    async with running_router(config) as router, httpx.AsyncClient(base_url=router.url, timeout=10) as client:
        for headers in ({}, _bearer("wrong"), {"authorization": "Basic Y2ZnLWtleQ=="}, _bearer("admin-key")):
            response = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
            assert response.status_code == 401
            assert response.headers["www-authenticate"] == "Bearer"
            error = response.json()["error"]
            assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
            assert set(error) == {"message", "type", "param", "code"}
        assert (await client.get("/v1/models")).status_code == 401
        for key in ("cfg-key", "env-key"):
            response = await client.post("/v1/chat/completions", json=CHAT, headers=_bearer(key))
            assert response.status_code == 200
        # the router's keys never reach a replica
        assert all("authorization" not in seen for seen in reps[0].headers_seen)

        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/ready")).status_code == 200
        assert (await client.get("/metrics", headers=_bearer("cfg-key"))).status_code == 401
        assert (await client.post("/admin/reset", headers=_bearer("cfg-key"))).status_code == 401
        assert (await client.get("/metrics", headers=_bearer("admin-key"))).status_code == 200
        assert (await client.post("/admin/reset", headers=_bearer("admin-key"))).status_code == 200


async def test_without_router_keys_the_client_authorization_passes_through(reps: list[Replica]) -> None:
    config = config_for([(r.name, r.url) for r in reps])
    async with running_router(config) as router, httpx.AsyncClient(base_url=router.url, timeout=10) as client:
        response = await client.post("/v1/chat/completions", json=CHAT, headers=_bearer("replica-key"))
        assert response.status_code == 200
        assert (await client.get("/metrics")).status_code == 200
    assert reps[0].headers_seen[-1]["authorization"] == "Bearer replica-key"


async def test_the_admin_port_alone_serves_metrics_and_admin(reps: list[Replica]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        admin_port = probe.getsockname()[1]
    auth = AuthConfig(api_keys=["k"], admin_port=admin_port)
    config = config_for([(r.name, r.url) for r in reps], auth=auth)
    async with running_router(config) as router, httpx.AsyncClient(timeout=10) as client:
        assert (await client.get(f"{router.url}/metrics", headers=_bearer("k"))).status_code == 404
        assert (await client.post(f"{router.url}/admin/reset", headers=_bearer("k"))).status_code == 404
        # the same app, reached through a port named admin_port: what `burstsched serve` binds
        app = router.app
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
        async with httpx.AsyncClient(transport=transport, base_url=f"http://127.0.0.1:{admin_port}") as admin:
            assert (await admin.get("/metrics")).status_code == 200
            assert (await admin.post("/admin/reset")).status_code == 200
            assert (await admin.post("/v1/chat/completions", json=CHAT)).status_code == 404


async def test_no_header_body_field_or_path_chooses_the_upstream(reps: list[Replica]) -> None:
    async with sim_replicas(1) as (trap,):
        trap_url = trap.url
        trap_host = trap_url.removeprefix("http://")
        config = config_for([(r.name, r.url) for r in reps])
        async with (
            running_router(config) as router,
            httpx.AsyncClient(base_url=router.url, timeout=10) as client,
        ):
            hostile_headers = {
                "host": trap_host,
                "x-forwarded-host": trap_host,
                "x-forwarded-for": "127.0.0.1",
                "forwarded": f"host={trap_host}",
                "x-burstsched-endpoint": trap_url,
                "x-original-url": f"{trap_url}/v1/chat/completions",
                "x-rewrite-url": f"{trap_url}/v1/chat/completions",
                "x-envoy-original-dst-host": trap_host,
            }
            hostile_fields = {
                "base_url": trap_url,
                "api_base": trap_url,
                "url": trap_url,
                "endpoint": trap_url,
                "upstream": trap_url,
                "extra_body": {"base_url": trap_url},
            }
            for path in ("/v1/chat/completions", "/v1/completions"):
                body: dict[str, Any] = {**CHAT} if "chat" in path else {"model": MODEL, "prompt": "hi"}
                body |= hostile_fields
                for stream in (False, True):
                    response = await client.post(
                        path, json={**body, "stream": stream}, headers=hostile_headers
                    )
                    assert response.status_code == 200, response.text
                    assert response.headers["x-burstsched-endpoint"] == reps[0].name
            bad_model = await client.post("/v1/chat/completions", json={**CHAT, "model": trap_url})
            assert bad_model.status_code == 404
            absolute = await _raw(router, f"POST {trap_url}/v1/chat/completions HTTP/1.1\r\n")
            assert absolute.startswith(b"HTTP/1.1 ")
            dotted = await _raw(router, "POST /v1/../../v1/chat/completions HTTP/1.1\r\n")
            assert dotted.startswith(b"HTTP/1.1 404")
    assert trap.requests == []  # the trap was never contacted
    assert set(reps[0].paths_seen) <= {"/v1/chat/completions", "/v1/completions"}
    assert all(seen.get("host", "").startswith("127.0.0.1:") for seen in reps[0].headers_seen)
    assert all(trap_host not in seen.get("host", "") for seen in reps[0].headers_seen)


async def _raw(router: RunningRouter, request_line: str) -> bytes:
    import anyio

    body = b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}'
    head = (
        request_line + f"host: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    ).encode()
    port = int(router.url.rsplit(":", 1)[1])
    reply = b""
    with anyio.fail_after(10):
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(head + body)
            while True:
                try:
                    reply += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return reply


async def test_control_characters_in_forwarded_headers_never_reach_the_upstream_head(
    reps: list[Replica],
) -> None:
    # an HTTP server refuses such headers; the app itself must not rely on it (ASGI in process)
    config = config_for([(r.name, r.url) for r in reps])
    app = create_app(config)
    injected = "host: evil.example\r\nx-injected: 1"
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
            await eventually(lambda: _ready(client))
            headers = [
                (b"x-request-id", b"rid\r\n" + injected.encode()),
                (b"traceparent", b"00-x\r\n" + injected.encode()),
                (b"content-type", b"application/json\nx-injected: 2"),
            ]
            request = client.build_request("POST", "/v1/chat/completions", json=CHAT)
            request.headers = httpx.Headers([*request.headers.raw, *headers])
            response = await client.send(request)
            assert response.status_code == 200
    seen = reps[0].headers_seen[-1]
    assert "x-injected" not in seen and "traceparent" not in seen
    assert seen["host"] == reps[0].url.removeprefix("http://")
    assert seen["x-request-id"].startswith("rid??host: evil.example")


async def _ready(client: httpx.AsyncClient) -> bool:
    return (await client.get("/ready")).status_code == 200
