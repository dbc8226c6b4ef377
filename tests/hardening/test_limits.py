"""Limits on clients: slow or oversized heads, slow bodies, idle keep-alive connections, big bodies, and a
full admission queue; slow clients never hold up others."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import httpx
import pytest
from anyio.abc import SocketStream

from burstsched.config import AdmissionConfig, LimitsConfig
from burstsched.server.serve import RunningRouter, running_router
from burstsched.testing.replicas import MODEL, Replica, sim_replicas

pytestmark = pytest.mark.anyio

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}
LIMITS = LimitsConfig(
    max_body_bytes=4096,
    header_timeout_ms=500,
    max_header_bytes=8192,
    body_timeout_ms=500,
    keep_alive_timeout_ms=300,
)


@pytest.fixture
async def reps() -> AsyncIterator[list[Replica]]:
    async with sim_replicas(1) as running:
        yield running


@pytest.fixture
async def router(reps: list[Replica]) -> AsyncIterator[RunningRouter]:
    from .helpers import config_for

    async with running_router(config_for([(r.name, r.url) for r in reps], limits=LIMITS)) as running:
        yield running


def _port(router: RunningRouter) -> int:
    return int(router.url.rsplit(":", 1)[1])


async def _read_until_closed(stream: SocketStream) -> bytes:
    """Everything the server sends until it closes the connection (bounded by the caller)."""
    data = b""
    while True:
        try:
            data += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
            return data


async def _dribble(stream: SocketStream, data: bytes, every_s: float = 0.05) -> None:
    """Send ``data`` a byte at a time until it is sent or the server hangs up."""
    for i in range(len(data)):
        try:
            await stream.send(data[i : i + 1])
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionResetError, OSError):
            return
        await anyio.sleep(every_s)


async def _served_meanwhile(router: RunningRouter) -> None:
    async with httpx.AsyncClient(base_url=router.url, timeout=10) as client:
        response = await client.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 200


async def test_slow_headers_are_cut_off_and_block_nobody(router: RunningRouter) -> None:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: " + b"a" * 400 + b"\r\n\r\n"
    replies: list[bytes] = []
    connected: list[SocketStream] = []
    all_connected = anyio.Event()

    def holds(stream: SocketStream) -> None:
        connected.append(stream)
        if len(connected) == 6:
            all_connected.set()

    async def slow_client() -> None:
        async with await anyio.connect_tcp("127.0.0.1", _port(router)) as stream:
            holds(stream)
            async with anyio.create_task_group() as tg:
                tg.start_soon(_dribble, stream, head)
                replies.append(await _read_until_closed(stream))
                tg.cancel_scope.cancel()

    async def silent_client() -> None:  # connects and sends nothing at all
        async with await anyio.connect_tcp("127.0.0.1", _port(router)) as stream:
            holds(stream)
            replies.append(await _read_until_closed(stream))

    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(slow_client)
            tg.start_soon(silent_client)
            await all_connected.wait()
            await _served_meanwhile(router)  # while six slow clients hold their connections
    assert len(replies) == 6
    assert all(reply.startswith(b"HTTP/1.1 408 ") for reply in replies), replies
    assert all(b'"type": "timeout_error"' in reply for reply in replies)


async def test_slow_body_gets_408_and_blocks_nobody(router: RunningRouter, reps: list[Replica]) -> None:
    body = b'{"model": "fake-model", "messages": [{"role": "user", "content": "' + b"x" * 300 + b'"}]}'
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    with anyio.fail_after(15):
        async with await anyio.connect_tcp("127.0.0.1", _port(router)) as stream:
            await stream.send(head)
            async with anyio.create_task_group() as tg:
                tg.start_soon(_dribble, stream, body)
                await _served_meanwhile(router)
                reply = await _read_until_closed(stream)
                tg.cancel_scope.cancel()
    status_line, _, rest = reply.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 408")
    assert b"connection: close" in rest.lower() and b"request_timeout" in rest
    assert len(reps[0].requests) == 1  # only the request served meanwhile reached the replica


async def test_oversized_head_gets_431(router: RunningRouter) -> None:
    head = b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\nx-big: " + b"b" * 20_000 + b"\r\n\r\n"
    with anyio.fail_after(10):
        async with await anyio.connect_tcp("127.0.0.1", _port(router)) as stream:
            try:
                await stream.send(head)
            except (anyio.BrokenResourceError, OSError):
                pass  # the server may hang up before taking it all
            reply = await _read_until_closed(stream)
    assert reply.startswith(b"HTTP/1.1 431 ")


async def test_idle_keep_alive_connections_are_closed(router: RunningRouter) -> None:
    request = b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
    with anyio.fail_after(10):
        async with await anyio.connect_tcp("127.0.0.1", _port(router)) as stream:
            await stream.send(request)
            reply = await _read_until_closed(stream)  # the response, then the close once idle
    assert reply.startswith(b"HTTP/1.1 200 ") and reply.count(b"HTTP/1.1") == 1


async def test_an_undeclared_oversized_body_gets_413(router: RunningRouter) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"x" * 1000

    async with httpx.AsyncClient(base_url=router.url, timeout=10) as client:
        response = await client.post("/v1/chat/completions", content=chunks())
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


async def test_a_declared_body_far_over_the_limit_still_gets_its_413(router: RunningRouter) -> None:
    """4 MiB against a 4 KiB limit: far more than the socket buffers hold, so the client is still sending
    when the router decides; it must read the 413, not a reset connection."""
    body = b'{"model": "m", "prompt": "' + b"x" * (4 * 1024 * 1024) + b'"}'
    async with httpx.AsyncClient(base_url=router.url, timeout=30) as client:
        for _ in range(3):
            response = await client.post(
                "/v1/completions", content=body, headers={"content-type": "application/json"}
            )
            assert response.status_code == 413
            assert response.json()["error"]["code"] == "request_too_large"


async def test_a_full_admission_queue_answers_429_with_retry_after(reps: list[Replica]) -> None:
    from .helpers import config_for, eventually

    admission = AdmissionConfig(window_ms=1000, queue_limit=1, retry_after_s=3)
    config = config_for([(r.name, r.url) for r in reps], admission=admission)
    statuses: list[httpx.Response] = []
    async with running_router(config) as router, httpx.AsyncClient(base_url=router.url, timeout=10) as client:

        async def first_held() -> bool:
            return bool(router.app.state.router.admission.held == 1)

        async def send(i: int) -> None:
            body = {"model": MODEL, "messages": [{"role": "user", "content": f"cold {i} " * 400}]}
            statuses.append(await client.post("/v1/chat/completions", json=body))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(send, 0)
                await eventually(first_held)  # the first one waits in its window (1 s)
                tg.start_soon(send, 1)
    codes = sorted(r.status_code for r in statuses)
    assert codes == [200, 429]
    refused = next(r for r in statuses if r.status_code == 429)
    assert refused.headers["retry-after"] == "3"
    assert refused.json()["error"]["type"] == "rate_limit_error"
