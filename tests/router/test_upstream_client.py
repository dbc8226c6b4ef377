"""The upstream client against raw asyncio HTTP servers on loopback whose every byte the test controls."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx
import pytest

from burstsched.config import DispatchConfig, UpstreamTLSConfig
from burstsched.dispatch import UpstreamClient, tls_context
from burstsched.server.serve import running_router

from .helpers import eventually, router_config

pytestmark = pytest.mark.anyio

TIMEOUTS = {"connect": 2.0, "read": 2.0, "write": 2.0, "pool": 2.0}
JSON = [(b"content-type", b"application/json")]


@dataclass
class Seen:
    """One request as the server read it."""

    head: bytes
    body: bytes

    @property
    def request_line(self) -> bytes:
        return self.head.split(b"\r\n", 1)[0]

    def header(self, name: bytes) -> bytes | None:
        for line in self.head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == name:
                return value.strip()
        return None


Handler = Callable[[asyncio.StreamWriter, Seen], Awaitable[bool]]
"""Answers one request; returns whether to keep the connection open."""


@dataclass
class RawServer:
    handler: Handler
    url: str = ""
    connections: int = 0
    closed: int = 0
    requests: list[Seen] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                seen = Seen(head, b"")
                length = seen.header(b"content-length")
                seen.body = await reader.readexactly(int(length)) if length else b""
                self.requests.append(seen)
                if not await self.handler(writer, seen):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                await writer.wait_closed()
            self.closed += 1


@asynccontextmanager
async def raw_server(
    handler: Handler, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None
) -> AsyncIterator[RawServer]:
    server = RawServer(handler)
    listener = await asyncio.start_server(server.serve, host, 0, ssl=tls)
    port = listener.sockets[0].getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    server.url = f"{'https' if tls else 'http'}://{shown}:{port}"
    async with listener:
        yield server
        listener.close()


def _answer(body: bytes, *, status: bytes = b"200 OK", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
        status,
        len(body),
        extra,
        body,
    )


async def ok(writer: asyncio.StreamWriter, seen: Seen) -> bool:
    writer.write(_answer(b'{"n": %d}' % len(seen.body)))
    await writer.drain()
    return True


async def _send(
    client: UpstreamClient, method: str, url: str, body: bytes = b"", **timeouts: float
) -> tuple[int, bytes]:
    response = await client.request(method, url, JSON if body else [], body, {**TIMEOUTS, **timeouts})
    try:
        return response.status, b"".join([chunk async for chunk in response.iter_body()])
    finally:
        await response.aclose()


@pytest.fixture
async def client() -> AsyncIterator[UpstreamClient]:
    async with UpstreamClient(trust_env=False) as upstream:
        yield upstream


# --- exchanges ----------------------------------------------------------------------------------------------


async def test_a_json_answer_and_exactly_the_headers_given(client: UpstreamClient) -> None:
    async def answer(writer: asyncio.StreamWriter, seen: Seen) -> bool:
        writer.write(b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\nX-Twice: a\r\nX-Twice: b\r\n\r\n{}")
        await writer.drain()
        return True

    with anyio.fail_after(10):
        async with raw_server(answer) as server:
            headers = [(b"content-type", b"application/json"), (b"x-request-id", b"r1")]
            response = await client.request(
                "POST", server.url + "/v1/completions", headers, b'{"a":1}', TIMEOUTS
            )
            assert response.status == 201
            assert response.headers == [(b"content-length", b"2"), (b"X-Twice", b"a"), (b"X-Twice", b"b")]
            assert b"".join([chunk async for chunk in response.iter_body()]) == b"{}"
            await response.aclose()
    seen = server.requests[0]
    assert seen.request_line == b"POST /v1/completions HTTP/1.1"
    assert seen.body == b'{"a":1}'
    names = [line.split(b":")[0].lower() for line in seen.head.split(b"\r\n")[1:] if line]
    assert sorted(names) == [
        b"content-length",
        b"content-type",
        b"host",
        b"x-request-id",
    ]  # nothing of its own
    assert seen.header(b"host") == server.url.removeprefix("http://").encode()


async def test_a_stream_passes_through_chunk_by_chunk(client: UpstreamClient) -> None:
    events = [b'data: {"n": %d}\n\n' % i for i in range(4)] + [b"data: [DONE]\n\n"]
    received = [asyncio.Event() for _ in events]

    async def sse(writer: asyncio.StreamWriter, seen: Seen) -> bool:
        if not seen.request_line.startswith(b"POST /v1/completions"):
            return await ok(writer, seen)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        for event, got in zip(events, received, strict=True):
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await got.wait()  # the next event goes only once the client holds this one
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    with anyio.fail_after(10):
        async with raw_server(sse) as server:
            response = await client.request("POST", server.url + "/v1/completions", JSON, b"{}", TIMEOUTS)
            data = b""
            try:
                async for chunk in response.iter_body():
                    data += chunk
                    for i, got in enumerate(received):
                        if data == b"".join(events[: i + 1]):
                            got.set()
            finally:
                await response.aclose()
            assert data == b"".join(events)
            assert (await _send(client, "GET", server.url + "/again")) == (200, b'{"n": 0}')
        assert server.connections == 1  # the stream's connection was kept for the next request


async def test_bodies_over_64_kib_both_ways(client: UpstreamClient) -> None:
    upload = os.urandom(200_000)
    parts = [os.urandom(100_000) for _ in range(3)]

    async def echo_reversed(writer: asyncio.StreamWriter, seen: Seen) -> bool:
        if seen.request_line.startswith(b"POST /length"):
            writer.write(_answer(seen.body[::-1]))
        else:  # chunked, 300 kB
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            for part in parts:
                writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    with anyio.fail_after(10):
        async with raw_server(echo_reversed) as server:
            assert await _send(client, "POST", server.url + "/length", upload) == (200, upload[::-1])
            assert await _send(client, "POST", server.url + "/chunked", upload) == (200, b"".join(parts))
    assert [seen.body for seen in server.requests] == [upload, upload]
    assert server.connections == 1


async def test_keep_alive_reuses_one_connection(client: UpstreamClient) -> None:
    with anyio.fail_after(10):
        async with raw_server(ok) as server:
            for n in range(5):
                assert await _send(client, "POST", server.url + "/x", b"x" * n) == (200, b'{"n": %d}' % n)
    assert server.connections == 1


async def test_keep_alive_off_opens_a_connection_per_request() -> None:
    with anyio.fail_after(10):
        async with UpstreamClient(keepalive=False, trust_env=False) as client, raw_server(ok) as server:
            for _ in range(3):
                assert (await _send(client, "GET", server.url + "/x"))[0] == 200
    assert server.connections == 3


# --- failures -----------------------------------------------------------------------------------------------


async def test_a_refused_connection_is_a_connect_error(client: UpstreamClient) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with anyio.fail_after(10), pytest.raises(httpx.ConnectError):
        await _send(client, "POST", f"http://127.0.0.1:{port}/v1/completions", b"{}")


@contextlib.contextmanager
def full_backlog() -> Iterator[int]:
    """A port that accepts no connection: its listener's backlog is full and never accepted from, so the
    kernel drops further handshakes."""
    listener = socket.socket()
    fillers: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        for _ in range(3):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


async def test_a_connection_not_accepted_in_time_is_a_connect_timeout(client: UpstreamClient) -> None:
    with full_backlog() as port, anyio.fail_after(10), pytest.raises(httpx.ConnectTimeout):
        await _send(client, "POST", f"http://127.0.0.1:{port}/v1/completions", b"{}", connect=0.2)


async def test_read_timeouts_before_the_head_and_mid_stream(client: UpstreamClient) -> None:
    stop = asyncio.Event()

    async def stall(writer: asyncio.StreamWriter, seen: Seen) -> bool:
        if seen.request_line.startswith(b"POST /stream"):
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\ndata: \r\n")
            await writer.drain()
        await stop.wait()
        return False

    with anyio.fail_after(10):
        async with raw_server(stall) as server:
            with pytest.raises(httpx.ReadTimeout):
                await _send(client, "POST", server.url + "/silent", b"{}", read=0.2)
            response = await client.request(
                "POST", server.url + "/stream", JSON, b"{}", {**TIMEOUTS, "read": 0.2}
            )
            chunks = response.iter_body()
            try:
                assert await anext(chunks) == b"data: "
                with pytest.raises(httpx.ReadTimeout):
                    await anext(chunks)
            finally:
                await response.aclose()
            stop.set()


async def test_a_server_closing_the_connection_is_a_protocol_error(client: UpstreamClient) -> None:
    async def hang_up(writer: asyncio.StreamWriter, seen: Seen) -> bool:
        if seen.request_line.startswith(b"POST /cut"):
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        elif seen.request_line.startswith(b"POST /garbage"):
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        return False  # and close, without a response for /none

    with anyio.fail_after(10):
        async with raw_server(hang_up) as server:
            with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
                await _send(client, "POST", server.url + "/none", b"{}")
            with pytest.raises(httpx.RemoteProtocolError, match="cut short"):
                await _send(client, "POST", server.url + "/cut", b"{}")
            with pytest.raises(httpx.RemoteProtocolError):
                await _send(client, "POST", server.url + "/garbage", b"{}")
    assert len(server.requests) == 3  # none sent twice: each went out on a new connection


async def test_a_connection_the_server_closed_while_idle_is_replaced(client: UpstreamClient) -> None:
    async def once(writer: asyncio.StreamWriter, seen: Seen) -> bool:
        await ok(writer, seen)
        return False  # close after each response, without saying so

    with anyio.fail_after(10):
        async with raw_server(once) as server:
            assert (await _send(client, "POST", server.url + "/x", b"{}"))[0] == 200
            while server.closed < 1:  # noqa: ASYNC110 - the server's own state, on this loop
                await anyio.sleep(0.01)
            assert (await _send(client, "POST", server.url + "/x", b"{}"))[0] == 200
    assert server.connections == 2


async def test_a_closed_client_refuses_requests() -> None:
    with anyio.fail_after(10):
        async with raw_server(ok) as server:
            client = UpstreamClient(trust_env=False)
            assert (await _send(client, "GET", server.url + "/x"))[0] == 200
            await client.aclose()
            with pytest.raises(httpx.ConnectError, match="closed"):
                await _send(client, "GET", server.url + "/x")


# --- the connection cap -------------------------------------------------------------------------------------


async def test_the_cap_queues_requests_and_a_waiter_gets_the_freed_slot() -> None:
    release = asyncio.Event()

    async def slow(writer: asyncio.StreamWriter, seen: Seen) -> bool:
        if seen.request_line.startswith(b"POST /slow"):
            await release.wait()
        return await ok(writer, seen)

    with anyio.fail_after(10):
        async with UpstreamClient(max_connections=1, trust_env=False) as client, raw_server(slow) as server:
            results: dict[str, tuple[int, bytes]] = {}

            async def send(name: str, path: str) -> None:
                results[name] = await _send(client, "POST", server.url + path, b"{}")

            async with anyio.create_task_group() as tg:
                tg.start_soon(send, "first", "/slow")
                while len(server.requests) < 1:  # noqa: ASYNC110 - the server's own state, on this loop
                    await anyio.sleep(0.01)
                tg.start_soon(send, "waiter", "/next")
                while client.waiting < 1:  # noqa: ASYNC110 - the client's own state, on this loop
                    await anyio.sleep(0.01)
                with pytest.raises(httpx.PoolTimeout):  # a third finds the line too long for its pool timeout
                    await _send(client, "POST", server.url + "/late", b"{}", pool=0.05)
                assert "waiter" not in results
                release.set()
            assert results == {"first": (200, b'{"n": 2}'), "waiter": (200, b'{"n": 2}')}
            assert [seen.request_line for seen in server.requests] == [
                b"POST /slow HTTP/1.1",
                b"POST /next HTTP/1.1",
            ]
            assert server.connections == 1  # the waiter took over the first request's connection


async def test_an_abandoned_response_frees_its_slot_and_drops_its_connection() -> None:
    stop = asyncio.Event()

    async def stream_then_stall(writer: asyncio.StreamWriter, seen: Seen) -> bool:
        if seen.request_line.startswith(b"POST /stream"):
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\ndata: \r\n")
            await writer.drain()
            await stop.wait()
            return False
        return await ok(writer, seen)

    with anyio.fail_after(10):
        async with (
            UpstreamClient(max_connections=1, trust_env=False) as client,
            raw_server(stream_then_stall) as server,
        ):
            started = anyio.Event()

            async def consume() -> None:
                response = await client.request("POST", server.url + "/stream", JSON, b"{}", TIMEOUTS)
                try:
                    async for _ in response.iter_body():
                        started.set()
                finally:
                    await response.aclose()

            async with anyio.create_task_group() as tg:
                tg.start_soon(consume)
                await started.wait()
                tg.cancel_scope.cancel()  # the client went away mid-stream
            assert await _send(client, "POST", server.url + "/x", b"{}", pool=1.0) == (200, b'{"n": 2}')
            assert server.connections == 2  # the half-read stream's connection was not reused
            stop.set()


# --- TLS, IPv6, proxies -------------------------------------------------------------------------------------


async def test_tls_against_a_self_signed_server(self_signed: tuple[Path, Path]) -> None:
    cert, key = self_signed
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    with anyio.fail_after(10):
        async with raw_server(ok, tls=server_tls) as server:
            url = server.url + "/v1/completions"
            async with UpstreamClient(tls=tls_context(ca_file=str(cert)), trust_env=False) as trusting:
                assert await _send(trusting, "POST", url, b"{}") == (200, b'{"n": 2}')
                assert await _send(trusting, "POST", url, b"{}") == (200, b'{"n": 2}')
            async with UpstreamClient(tls=tls_context(verify=False), trust_env=False) as unverified:
                assert await _send(unverified, "POST", url, b"{}") == (200, b'{"n": 2}')
            async with UpstreamClient(trust_env=False) as default:  # the system's CAs do not know it
                with pytest.raises(httpx.ConnectError):
                    await _send(default, "POST", url, b"{}")
    assert server.connections == 2  # one per client that got through (each kept its connection)


async def replica(writer: asyncio.StreamWriter, seen: Seen) -> bool:
    """Just enough of a vLLM replica for the router: health, models, metrics and completions."""
    path = seen.request_line.split(b" ")[1]
    if path == b"/v1/models":
        writer.write(_answer(b'{"object": "list", "data": [{"id": "m", "object": "model"}]}'))
    elif path == b"/metrics":
        page = b"vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n"
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(page), page))
    elif path == b"/v1/completions":
        writer.write(_answer(b'{"choices": [{"text": "over tls"}]}'))
    else:
        writer.write(_answer(b"{}"))
    await writer.drain()
    return True


async def test_the_router_reaches_a_replica_through_its_configured_ca(self_signed: tuple[Path, Path]) -> None:
    cert, key = self_signed
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    dispatch = DispatchConfig(tls=UpstreamTLSConfig(ca_file=str(cert)))
    with anyio.fail_after(20):
        async with raw_server(replica, tls=server_tls) as server:
            config = router_config([("r1", server.url)], dispatch=dispatch)
            async with running_router(config) as router, httpx.AsyncClient(base_url=router.url) as http:

                async def ready() -> bool:
                    return (await http.get("/ready")).status_code == 200

                await eventually(ready)
                response = await http.post("/v1/completions", json={"model": "m", "prompt": "hi"})
                assert response.status_code == 200
                assert response.json() == {"choices": [{"text": "over tls"}]}
    paths = {seen.request_line.split(b" ")[1] for seen in server.requests}
    assert {b"/health", b"/v1/models", b"/metrics", b"/v1/completions"} <= paths  # one client for all


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
async def test_an_ipv6_endpoint(client: UpstreamClient) -> None:
    with anyio.fail_after(10):
        async with raw_server(ok, host="::1") as server:
            assert server.url.startswith("http://[::1]:")
            assert await _send(client, "POST", server.url + "/v1/completions", b"{}") == (200, b'{"n": 2}')
    assert server.requests[0].header(b"host") == server.url.removeprefix("http://").encode()


@pytest.fixture
def proxy_env(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str | None], None]:
    """Set the environment's proxy variables (and clear their other spellings)."""
    for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)

    def set_env(proxy: str, no_proxy: str | None) -> None:
        monkeypatch.setenv("HTTP_PROXY", proxy)
        if no_proxy is None:
            monkeypatch.delenv("NO_PROXY", raising=False)
        else:
            monkeypatch.setenv("NO_PROXY", no_proxy)

    return set_env


async def test_proxies_from_the_environment(proxy_env: Callable[[str, str | None], None]) -> None:
    async def proxied(writer: asyncio.StreamWriter, seen: Seen) -> bool:
        writer.write(_answer(b'"via the proxy"'))
        await writer.drain()
        return True

    with anyio.fail_after(10):
        async with raw_server(proxied) as proxy, raw_server(ok) as replica:
            url = replica.url + "/v1/completions"
            user_proxy = proxy.url.replace("http://", "http://user:p%40ss@")
            proxy_env(user_proxy, None)
            async with UpstreamClient() as client:
                assert await _send(client, "POST", url, b"{}") == (200, b'"via the proxy"')
            seen = proxy.requests[0]
            assert seen.request_line == f"POST {url} HTTP/1.1".encode()  # absolute form, to the proxy
            assert seen.header(b"proxy-authorization") == b"Basic " + base64.b64encode(b"user:p@ss")
            assert seen.body == b"{}"

            proxy_env(proxy.url, "localhost,127.0.0.1")  # NO_PROXY lets loopback through directly
            async with UpstreamClient() as client:
                assert await _send(client, "POST", url, b"{}") == (200, b'{"n": 2}')
            proxy_env(proxy.url, None)
            async with UpstreamClient(trust_env=False) as client:  # the environment ignored
                assert await _send(client, "POST", url, b"{}") == (200, b'{"n": 2}')
    assert len(proxy.requests) == 1 and len(replica.requests) == 2
