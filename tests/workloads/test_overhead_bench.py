"""The overhead benchmark's pieces: the fast backend's answers, the load client's parser, /proc CPU, and a
short real run (direct + burstsched, traced too) that must produce sane rows with no errors."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from burstsched.pool.scrape import parse_vllm_metrics
from burstsched.testing.ports import free_port
from burstsched.wire.sse import aiter_data
from burstsched.workloads.proc_cpu import group_cpu_seconds, process_cpu_seconds
from loadtests.fast_backend import start_backend
from loadtests.http_load import Connection, ResponseError, closed_loop, post_request, response_end
from loadtests.overhead_targets import check_tree, git_worktree, untraced_env

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.anyio
MODEL = "bench-model"


@pytest.fixture
async def backend_url() -> AsyncIterator[str]:
    server, _ = await start_backend("127.0.0.1", 0, MODEL)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_backend_answers_what_routers_need(backend_url: str) -> None:
    async with httpx.AsyncClient(base_url=backend_url, trust_env=False, timeout=5) as client:
        assert (await client.get("/health")).status_code == 200
        models = (await client.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]] == [MODEL]
        chat = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": []})
        assert chat.status_code == 200
        assert chat.json()["object"] == "chat.completion"
        assert chat.json()["choices"][0]["message"]["content"] == "ok"
        completion = (await client.post("/v1/completions", json={"model": MODEL, "prompt": "x"})).json()
        assert completion["object"] == "text_completion" and completion["usage"]["total_tokens"] == 2
        metrics = parse_vllm_metrics((await client.get("/metrics")).text)
        assert (metrics.waiting, metrics.running, metrics.kv_usage) == (0, 0, 0.0)
        assert metrics.block_size == 16 and metrics.num_gpu_blocks == 1024
        assert metrics.model_names == frozenset({MODEL})
        assert (await client.get("/nothing-here")).status_code == 404


async def test_backend_streams_sse_with_usage_on_request(backend_url: str) -> None:
    body = {"model": MODEL, "messages": [], "stream": True, "stream_options": {"include_usage": True}}
    async with httpx.AsyncClient(base_url=backend_url, trust_env=False, timeout=5) as client:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.headers["content-type"] == "text/event-stream"
            events = [data async for data in aiter_data(response.aiter_bytes())]
        plain = await client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "stream": True})
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[-1]["usage"]["completion_tokens"] == 1
    plain_events = [line for line in plain.text.splitlines() if line]
    assert plain_events[-1] == "data: [DONE]" and "usage" not in plain.text


async def test_backend_reads_chunked_and_pipelined_requests(backend_url: str) -> None:
    host, port = backend_url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    body = b'{"model": "bench-model", "prompt": "x"}'
    chunked = (
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
        + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    )
    writer.write(chunked + post_request(host, int(port), "/v1/chat/completions", body))
    received = b""
    ends: list[int] = []
    async with asyncio.timeout(5):
        while len(ends) < 2:
            received += await reader.read(65536)
            ends, rest = [], received
            while (done := response_end(rest)) is not None:
                ends.append(done[0])
                rest = rest[done[1] :]
    writer.close()
    await writer.wait_closed()
    assert ends == [200, 200]
    assert b'"text_completion"' in received and b'"chat.completion"' in received


def test_response_end_finds_whole_responses_only() -> None:
    fixed = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"
    assert response_end(fixed) == (200, len(fixed))
    assert response_end(fixed[:-1]) is None
    chunked = b"HTTP/1.1 503 Unavailable\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    assert response_end(chunked + b"HTTP/1.1") == (503, len(chunked))
    assert response_end(chunked[:-2]) is None
    with pytest.raises(ResponseError):
        response_end(b"HTTP/1.1 200 OK\r\nx: y\r\n\r\nbody")


async def test_closed_loop_counts_requests_and_statuses(backend_url: str) -> None:
    host, port = backend_url.removeprefix("http://").rsplit(":", 1)
    good = post_request(host, int(port), "/v1/completions", b"{}")
    missing = post_request(host, int(port), "/v1/missing", b"{}")
    connections = [Connection(host, int(port), request) for request in (good, good, missing)]
    try:
        result = await closed_loop(connections, 0.2)
    finally:
        for connection in connections:
            connection.close()
    assert result.latencies and all(latency > 0 for latency in result.latencies)
    assert result.errors > 0 and set(result.statuses) == {404}


def test_proc_cpu_reads_this_process_and_its_group() -> None:
    sum(i * i for i in range(200_000))  # some CPU to see
    own = process_cpu_seconds(os.getpid())
    assert own is not None and own > 0
    group = group_cpu_seconds([os.getpgid(0)])
    assert group[os.getpgid(0)] >= own
    assert process_cpu_seconds(2**22 + 12345) is None


def test_baseline_worktree_runs_its_own_modules() -> None:
    with git_worktree("HEAD") as (tree, sha):
        assert (tree / "burstsched" / "cli.py").is_file() and len(sha) == 40
        assert check_tree(tree, untraced_env()) == []
    assert not tree.exists()


def test_short_run_has_sane_rows(tmp_path: Path) -> None:
    """About 10 s: two backends, burstsched (traced too) and the floor, one level, a second each."""
    out = tmp_path / "overhead.json"
    args = ["--duration", "1", "--warmup", "0.3", "--clients", "4", "--peers", "none"]
    args += ["--json", str(out), "--report", str(tmp_path / "overhead.md")]
    done = subprocess.run(
        [sys.executable, str(ROOT / "loadtests" / "overhead.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    rows = {row["target"]: row for row in result["rows"]}
    assert set(rows) == {"direct", "burstsched", "burstsched+trace", "python-floor"}, result["skipped"]
    for row in rows.values():
        assert row["clients"] == 4 and row["requests"] > 0 and row["errors"] == 0
        assert row["p50_ms"] > 0 and row["p99_ms"] >= row["p50_ms"]
        assert row["client_cpu_us"] > 0
    assert rows["direct"]["router_cpu_us"] is None and rows["direct"]["added_p50_ms"] == 0
    for name in ("burstsched", "burstsched+trace", "python-floor"):
        assert rows[name]["router_cpu_us"] > 0 and rows[name]["backends_cpu_us"] > 0
        assert rows[name]["idle_cores"] is not None
    assert result["spans_received"] > 0 and result["traced_requests"] > 0
    assert "| burstsched+trace | 4 |" in (tmp_path / "overhead.md").read_text()


async def test_python_floor_passes_answers_and_streams_through(backend_url: str) -> None:
    """The floor proxy (its own process) gives the backend's answers back: whole with their length, and
    streams event by event to ``[DONE]``."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "loadtests" / "python_floor.py"),
        *("--port", str(port), "--backend", backend_url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=5
        ) as client:
            for _ in range(300):
                try:
                    if (await client.get("/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
            whole = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": []})
            assert whole.status_code == 200 and whole.json()["choices"][0]["message"]["content"] == "ok"
            assert whole.headers["content-length"] == str(len(whole.content))
            body = {"model": MODEL, "messages": [], "stream": True, "stream_options": {"include_usage": True}}
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.status_code == 200
                assert response.headers["content-type"] == "text/event-stream"
                data = [d async for d in aiter_data(response.aiter_text())]
            assert data[-1] == "[DONE]" and json.loads(data[-2])["usage"]["completion_tokens"] > 0
    finally:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()
