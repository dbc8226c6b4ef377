"""Limits on request heads in the HTTP server, against slow or oversized headers (slow-loris).

uvicorn bounds idle keep-alive connections but not the time a client takes to send a request's head, nor
its size (with httptools). :func:`guarded_protocol` returns uvicorn's httptools protocol with both limits:

- the head (request line and headers) must be complete within ``header_timeout_s`` of the connection
  opening, or of the previous request's end on a kept-alive connection; else the server answers 408 and
  closes the connection;
- a head larger than ``max_header_bytes`` gets 431 and the connection is closed;
- an idle keep-alive connection is closed after ``keep_alive_s`` (uvicorn's own timer, at sub-second
  precision), unless the next request's first bytes already wait in its socket: on a busy event loop the
  timer can run before the loop reads a request that arrived in time, and closing then would drop that
  request unanswered (clients do not resend a POST).

Each slow connection costs one timer; it never holds up other connections.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import json
import logging
import termios
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from burstsched.wire.errors import error_body

log = logging.getLogger(__name__)


def _raw_error(status: int, reason: str, message: str) -> bytes:
    body = json.dumps(error_body(status, message)).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class _GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a head deadline and a head size limit (set by the subclass)."""

    header_timeout_s: float = 10.0
    max_header_bytes: int = 65_536
    keep_alive_s: float = 5.0

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.timeout_keep_alive = self.keep_alive_s  # type: ignore[assignment]  # float is fine for call_later
        self._head_timer: asyncio.TimerHandle | None = None
        self._awaiting_head = True
        self._head_bytes = 0
        self._head_tail = b""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._awaiting_head:
            # count the head's bytes only: up to the blank line that ends it, if it is in this packet
            seen = self._head_tail + data
            end = seen.find(b"\r\n\r\n")
            self._head_bytes += len(data) if end < 0 else max(0, end + 4 - len(self._head_tail))
            self._head_tail = seen[-3:]
            if self._head_bytes > self.max_header_bytes:
                if not self.transport.is_closing():
                    self._refuse(431, "Request Header Fields Too Large", "request headers too large")
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._awaiting_head = True
        if self._head_timer is None:
            self._arm_head_timer()

    def on_headers_complete(self) -> None:
        self._awaiting_head = False
        self._head_bytes = 0
        self._head_tail = b""
        self._cancel_head_timer()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._awaiting_head = True
        self._head_bytes = 0
        self._head_tail = b""  # the keep-alive timer watches the idle time until the next request begins

    def timeout_keep_alive_handler(self) -> None:
        """Close the idle connection, unless a request already waits in its socket: then wait on."""
        if self.transport is not None and _bytes_waiting(self.transport) > 0:
            log.debug("keep-alive timer ran with a request waiting from %s: served, not closed", self.client)
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )
            return
        super().timeout_keep_alive_handler()

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._awaiting_head and self.transport is not None and not self.transport.is_closing():
            if self.cycle is not None and not self.cycle.response_complete:
                self._arm_head_timer()  # a response is being written: the next head waits its turn
                return
            self._refuse(408, "Request Timeout", "request headers did not arrive in time")

    def _refuse(self, status: int, reason: str, message: str) -> None:
        log.info("closing a connection from %s: %s", self.client, message)
        self._cancel_head_timer()
        self.transport.write(_raw_error(status, reason, message))
        self.transport.close()


def _bytes_waiting(transport: asyncio.BaseTransport) -> int:
    """Bytes received on the transport's socket that the event loop has not read yet (0 if unknown)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    count = array.array("i", [0])
    try:
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, count, True)
    except (OSError, ValueError):
        return 0
    return count[0]


def guarded_protocol(
    *, header_timeout_s: float, max_header_bytes: int, keep_alive_s: float
) -> type[HttpToolsProtocol]:
    """uvicorn's ``http`` protocol class with these limits (pass it as ``uvicorn.Config(http=...)``)."""
    return type(
        "GuardedHttpToolsProtocol",
        (_GuardedHttpToolsProtocol,),
        {
            "header_timeout_s": header_timeout_s,
            "max_header_bytes": max_header_bytes,
            "keep_alive_s": keep_alive_s,
        },
    )
