"""The least a Python router can do per request: the overhead benchmark's ``python-floor`` target.

    python loadtests/python_floor.py --port PORT --backend http://127.0.0.1:8001 [--backend ...]

The same HTTP stack as ``burstsched serve`` (uvicorn with uvloop and httptools, an aiohttp client session
and keep-alive pool per backend, no cookies, no decompression) with nothing between the two: each POST's
body goes to the next backend in turn, and the answer comes back whole with its length or, for a stream,
chunk by chunk as it arrives.
No parsing, no scheduling, no limits, no metrics, no failover. What burstsched costs above this is router
logic; what this costs is the floor under any router written as a Python ASGI app over a Python client.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager

import aiohttp
import uvicorn
from starlette.types import Message, Receive, Scope, Send

_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"content-length"})


class FloorProxy:
    """ASGI: each POST to the backends in turn; ``GET /health`` answers 200."""

    def __init__(self, backends: Sequence[str]) -> None:
        if not backends:
            raise ValueError("give at least one backend")
        self._backends = list(backends)
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        self._turns: Iterator[str] = itertools.cycle(self._backends)

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        for url in self._backends:
            self._sessions[url] = aiohttp.ClientSession(
                url,
                connector=aiohttp.TCPConnector(limit=0),
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
            )
        try:
            yield
        finally:
            for session in self._sessions.values():
                await session.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope["method"] != "POST":
            await _answer(send, 200 if scope["path"] == "/health" else 404, b"")
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        session = self._sessions[next(self._turns)]
        async with session.post(
            scope["path"], data=body, headers={"content-type": "application/json"}
        ) as response:
            headers = [(k.lower(), v) for k, v in response.raw_headers if k.lower() not in _HOP_BY_HOP]
            if response.content_length is not None:  # a whole answer: passed on whole, with its length
                data = await response.read()
                headers.append((b"content-length", b"%d" % len(data)))
                await send({"type": "http.response.start", "status": response.status, "headers": headers})
                await send({"type": "http.response.body", "body": data})
                return
            await send({"type": "http.response.start", "status": response.status, "headers": headers})
            async for chunk in response.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        message: Message = await receive()
        async with self.lifespan():
            await send({"type": "lifespan.startup.complete"})
            message = await receive()
        if message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})


async def _answer(send: Send, status: int, body: bytes) -> None:
    await send(
        {"type": "http.response.start", "status": status, "headers": [(b"content-length", b"%d" % len(body))]}
    )
    await send({"type": "http.response.body", "body": body})


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", action="append", default=[], help="a backend's base URL (repeatable)")
    args = parser.parse_args(argv)
    uvicorn.run(
        FloorProxy(args.backend),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
