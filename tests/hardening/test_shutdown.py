"""Graceful shutdown: stop accepting, let in-flight requests finish up to the drain deadline, then end the
rest properly (a stream with an error event and ``[DONE]``); `burstsched serve` does it on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest

from burstsched.config import ShutdownConfig
from burstsched.dispatch.drain import Drainer
from burstsched.server.serve import running_router
from burstsched.sim import SimConfig, SimPool
from burstsched.testing import free_port
from burstsched.testing.replicas import LONG_ANSWER, MODEL, Replica, sim_replicas
from burstsched.wire.sse import DONE, SSEReader, data_payloads

from .helpers import config_for, eventually

pytestmark = pytest.mark.anyio


async def test_drain_waits_for_requests_then_aborts_the_rest() -> None:
    drainer = Drainer(timeout_s=0.2)
    aborted: list[str] = []
    drainer.request_started()
    drainer.request_started()
    done_a = drainer.register(lambda: aborted.append("a"))
    drainer.register(lambda: aborted.append("b"))
    done_a()
    drainer.request_finished()
    assert drainer.in_flight == 1 and not drainer.draining
    with anyio.fail_after(5):
        await drainer.drain()  # b never finishes: aborted at the deadline
    assert drainer.draining and aborted == ["b"]
    drainer.register(lambda: aborted.append("late"))  # reaches the dispatcher after the deadline
    assert aborted == ["b", "late"]

    quick = Drainer(timeout_s=30)
    quick.request_started()
    done = quick.register(lambda: aborted.append("never"))
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(quick.drain)
            await eventually(lambda: _draining(quick))  # the drain now waits for the request
            done()
            quick.request_finished()  # the last request ends: the drain stops waiting before its deadline
    assert aborted == ["b", "late"]


@pytest.fixture
async def reps() -> AsyncIterator[list[Replica]]:
    async with sim_replicas(1) as running:
        yield running


async def test_past_the_drain_deadline_a_stream_ends_with_an_error_event(reps: list[Replica]) -> None:
    config = config_for([(r.name, r.url) for r in reps], shutdown=ShutdownConfig(drain_timeout_ms=300))
    # a stream still generating well past the drain deadline
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": LONG_ANSWER,
    }
    async with running_router(config) as router, httpx.AsyncClient(base_url=router.url, timeout=10) as client:
        drainer: Drainer = router.app.state.drainer
        with anyio.fail_after(10):
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                chunks = response.aiter_raw()
                received = await anext(chunks)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(drainer.drain)
                    await eventually(lambda: _draining(drainer))
                    refused = await client.post("/v1/chat/completions", json={**body, "stream": False})
                    received += b"".join([chunk async for chunk in chunks])
    assert refused.status_code == 503 and refused.json()["error"]["type"] == "service_unavailable"
    events = data_payloads(received)
    assert json.loads(events[0])["choices"][0]["delta"]["role"] == "assistant"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "service_unavailable" and "shutting down" in error["message"]
    assert events[-1] == DONE


async def _draining(drainer: Drainer) -> bool:
    return drainer.draining


def _spawn_router(
    config_path: Path, port: int, endpoints: list[tuple[str, str]], log: Path
) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "burstsched", "serve", "--config", str(config_path), "--port", str(port)]
    for name, url in endpoints:
        args += ["--endpoint", f"{name}={url}"]
    with log.open("wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)


async def _stream(client: httpx.AsyncClient, url: str, max_tokens: int, started: anyio.Event) -> list[str]:
    body = {
        "model": "kv-demo",
        "messages": [{"role": "user", "content": "Tell a story."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        reader = SSEReader()
        events: list[str] = []
        async for chunk in response.aiter_bytes():
            events += reader.feed(chunk)
            if len(events) >= 2:
                started.set()
    return events


@pytest.mark.slow
async def test_serve_drains_on_sigterm_and_serves_admin_paths_on_their_own_port(tmp_path: Path) -> None:
    port, admin_port = free_port(), free_port()
    config_path = tmp_path / "router.yaml"
    config_path.write_text(
        f"shutdown:\n  drain_timeout_ms: 1500\nauth:\n  admin_port: {admin_port}\n", encoding="utf-8"
    )
    log = tmp_path / "router.log"
    async with SimPool(1, SimConfig(time_scale=1.0)) as pool:
        proc = _spawn_router(config_path, port, list(zip(pool.names, pool.urls, strict=True)), log)
        url = f"http://127.0.0.1:{port}"
        try:
            async with httpx.AsyncClient(timeout=30) as client:

                async def ready() -> bool:
                    try:
                        return (await client.get(f"{url}/ready")).status_code == 200
                    except httpx.TransportError:
                        return proc.poll() is not None  # died: stop waiting, the asserts below say why

                await eventually(ready, within_s=30)
                assert proc.poll() is None, log.read_text()
                assert (await client.get(f"{url}/metrics")).status_code == 404
                admin = await client.get(f"http://127.0.0.1:{admin_port}/metrics")
                assert admin.status_code == 200 and "burstsched_requests_total" in admin.text

                results: dict[str, list[str]] = {}
                long_started, short_started = anyio.Event(), anyio.Event()

                async def run(name: str, tokens: int, started: anyio.Event) -> None:
                    results[name] = await _stream(client, url, tokens, started)

                with anyio.fail_after(30):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(run, "long", 4000, long_started)
                        await long_started.wait()
                        tg.start_soon(run, "short", 20, short_started)
                        await short_started.wait()
                        os.kill(proc.pid, signal.SIGTERM)
                        await eventually(lambda: _refused(url), within_s=10)
                    code = await anyio.to_thread.run_sync(proc.wait)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # uvicorn re-raises the signal it shut down on once done: the process ends "killed by SIGTERM"
    assert code == -signal.SIGTERM, log.read_text()
    assert "Traceback" not in log.read_text()
    short = results["short"]
    assert short[-1] == DONE and not any('"error"' in e for e in short)
    assert json.loads(short[-2])["choices"][0]["finish_reason"] == "length"
    long = results["long"]
    assert long[-1] == DONE
    assert "shutting down" in json.loads(long[-2])["error"]["message"]


async def _refused(url: str) -> bool:
    async with httpx.AsyncClient(timeout=2) as fresh:
        try:
            await fresh.get(f"{url}/health")
        except (httpx.ConnectError, httpx.RemoteProtocolError):
            # refused, or (while uvicorn closes its socket) accepted from the backlog and closed unanswered
            return True
    return False
