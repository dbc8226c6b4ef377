"""``burstsched serve --workers 2``: one port, two router processes; SIGTERM drains them all; a killed worker
is replaced; workers that cannot start make the parent exit non-zero."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import IO

import anyio
import httpx
import pytest

from burstsched.server.workers import WORKER_HEADER, Backoff, Supervisor, worker_sockets
from burstsched.testing.ports import free_port
from burstsched.testing.replicas import MODEL, Replica, sim_replicas

from .helpers import eventually

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config" / "rendezvous.yaml"


def children(pid: int) -> set[int]:
    """The live child processes of ``pid`` (Linux /proc)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return set()
    return {int(p) for p in text.split()}


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in {"Z", "X"}


def body(prompt: str = "hi", **extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 4, **extra}


def fresh_client(base_url: str) -> httpx.AsyncClient:
    """A client that opens a new connection per request, so the kernel picks a worker for each."""
    limits = httpx.Limits(max_keepalive_connections=0)
    return httpx.AsyncClient(base_url=base_url, timeout=10, limits=limits, trust_env=False)


async def workers_answering(client: httpx.AsyncClient, expected: set[str], *, within_s: float = 30) -> None:
    """Send requests until every worker in ``expected`` has answered one with 200."""
    seen: set[str] = set()

    async def all_seen() -> bool:
        try:
            response = await client.post("/v1/chat/completions", json=body())
        except httpx.TransportError:
            return False
        if response.status_code == 200:
            seen.add(response.headers[WORKER_HEADER])
        return seen >= expected

    await eventually(all_seen, within_s=within_s, poll=0.01)
    assert seen == expected


@asynccontextmanager
async def serve_workers(
    replicas: Sequence[Replica], workers: int = 2, extra: Sequence[str] = ()
) -> AsyncIterator[tuple[subprocess.Popen[bytes], str, IO[bytes]]]:
    """``burstsched serve --workers`` over ``replicas``: the process, its URL and its stderr (a file: a pipe
    nobody reads fills up, and the supervisor would block on its next log line)."""
    port = free_port()
    args = [sys.executable, "-m", "burstsched", "serve", "--config", str(CONFIG), "--port", str(port)]
    args += ["--workers", str(workers), *extra]
    for replica in replicas:
        args += ["--endpoint", f"{replica.name}={replica.url}"]
    stderr = tempfile.TemporaryFile()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=stderr)  # noqa: ASYNC220
    seen: set[int] = set()
    try:
        url = f"http://127.0.0.1:{port}"
        async with fresh_client(url) as client:

            async def ready() -> bool:
                assert proc.poll() is None, "burstsched serve --workers exited early"
                seen.update(children(proc.pid))
                try:
                    return (await client.get("/ready")).status_code == 200 and len(
                        children(proc.pid)
                    ) == workers
                except httpx.TransportError:
                    return False

            await eventually(ready, within_s=60, poll=0.1)
        yield proc, url, stderr
    finally:
        seen.update(children(proc.pid))
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                await anyio.to_thread.run_sync(lambda: proc.wait(timeout=30))
        for pid in [proc.pid, *seen]:  # only ours: the parent and the workers it started
            if alive(pid):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if proc.returncode is None:
            proc.wait(timeout=10)
        stderr.close()


@pytest.mark.anyio
async def test_two_workers_serve_one_port_each_with_its_own_metrics() -> None:
    async with sim_replicas(2) as replicas, serve_workers(replicas) as (proc, url, stderr):
        workers = children(proc.pid)
        async with fresh_client(url) as client:
            await workers_answering(client, {"0", "1"})
            responses = [await client.post("/v1/chat/completions", json=body(f"q{i}")) for i in range(10)]
            assert all(r.status_code == 200 for r in responses)
            assert {r.headers["x-burstsched-endpoint"] for r in responses} <= {r.name for r in replicas}
            # each worker's /metrics says which process answered it
            infos: dict[str, str] = {}

            async def both_scraped() -> bool:
                text = (await client.get("/metrics")).text
                for line in text.splitlines():
                    if line.startswith("burstsched_worker_info{"):
                        labels = dict(
                            part.split("=") for part in line[line.index("{") + 1 : line.index("}")].split(",")
                        )
                        infos[labels["worker"].strip('"')] = labels["pid"].strip('"')
                return len(infos) == 2

            await eventually(both_scraped, within_s=20, poll=0.01)
        assert {int(pid) for pid in infos.values()} == workers


@pytest.mark.anyio
async def test_sigterm_drains_a_stream_and_every_process_exits() -> None:
    async with sim_replicas(1) as replicas, serve_workers(replicas) as (proc, url, stderr):
        workers = children(proc.pid)
        assert len(workers) == 2
        events: list[str] = []
        async with (
            httpx.AsyncClient(base_url=url, timeout=30, trust_env=False) as client,
            client.stream(
                "POST", "/v1/chat/completions", json=body(stream=True, max_tokens=2000)
            ) as response,
        ):
            assert response.status_code == 200
            lines = response.aiter_lines()
            first = await anext(lines)
            assert first.startswith("data: ")
            proc.send_signal(signal.SIGTERM)  # while the stream is in flight
            async for line in lines:
                if line.startswith("data: "):
                    events.append(line.removeprefix("data: "))
        assert events[-1] == "[DONE]"
        assert not any("error" in json.loads(e) for e in events[:-1])
        with anyio.fail_after(30):
            code = await anyio.to_thread.run_sync(proc.wait)
        assert code == 0
        stderr.seek(0)
        assert "Traceback" not in stderr.read().decode()

        async def all_gone() -> bool:
            return not any(alive(pid) for pid in workers)

        await eventually(all_gone, within_s=10, poll=0.05)


@pytest.mark.anyio
async def test_a_killed_worker_is_replaced() -> None:
    async with sim_replicas(2) as replicas, serve_workers(replicas) as (proc, url, stderr):
        async with fresh_client(url) as client:  # both serving, so the parent has seen both ready:
            await workers_answering(client, {"0", "1"})  # a worker lost while starting fails the start
        before = children(proc.pid)
        victim = min(before)
        os.kill(victim, signal.SIGKILL)

        async def replaced() -> bool:
            now = children(proc.pid)
            return len(now) == 2 and victim not in now and not alive(victim)

        try:
            await eventually(replaced, within_s=30, poll=0.05)
        except TimeoutError:
            stderr.seek(0)
            log = stderr.read().decode(errors="replace")[-3000:]
            raise AssertionError(
                f"not replaced: children {children(proc.pid)}, victim {victim}\n{log}"
            ) from None
        assert proc.poll() is None
        after = children(proc.pid)
        assert len(after - before) == 1
        async with fresh_client(url) as client:
            await workers_answering(client, {"0", "1"})


# --- the supervisor on its own ---------------------------------------------------------------------------


def _sockets(workers: int) -> list[list[socket.socket]]:
    return worker_sockets("127.0.0.1", 0, None, workers, "reuseport")


def test_workers_that_exit_at_once_make_the_supervisor_fail() -> None:
    sockets = _sockets(2)
    try:
        supervisor = Supervisor(
            lambda i, fds, link: [sys.executable, "-c", "raise SystemExit(3)"], sockets, stop_timeout_s=5
        )
        started = time.monotonic()
        assert supervisor.run() == 1
        assert time.monotonic() - started < 20
        assert all(not alive(pid) for pids in supervisor.pids for pid in pids)
    finally:
        for group in sockets:
            for sock in group:
                sock.close()


def test_a_worker_that_never_serves_is_a_failed_start() -> None:
    sockets = _sockets(1)
    try:
        never = [sys.executable, "-c", "import time; time.sleep(60)"]
        supervisor = Supervisor(lambda i, fds, link: never, sockets, ready_timeout_s=1.0, stop_timeout_s=5)
        assert supervisor.run() == 1
        assert all(not alive(pid) for pids in supervisor.pids for pid in pids)
    finally:
        for group in sockets:
            for sock in group:
                sock.close()


def test_reuseport_sockets_share_one_port_and_shared_is_one_socket() -> None:
    sockets = worker_sockets("127.0.0.1", 0, 0, 3, "reuseport")
    shared = worker_sockets("127.0.0.1", 0, None, 3, "shared")
    try:
        ports = {group[0].getsockname()[1] for group in sockets}
        assert len(ports) == 1
        admin_ports = {group[1].getsockname()[1] for group in sockets}
        assert len(admin_ports) == 3 and not admin_ports & ports
        assert len({id(group[0]) for group in shared}) == 1
    finally:
        for group in [*sockets, *shared]:
            for sock in group:
                sock.close()


def test_backoff_doubles_to_its_cap() -> None:
    backoff = Backoff(base_s=0.5, max_s=3.0)
    assert [backoff.delay(n) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
