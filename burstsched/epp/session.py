"""One ext_proc stream: one HTTP request through the gateway, in the message order of its body mode.

The gateway says its body modes in the first message (``protocol_config``; a gateway that does not is
taken to be in ``FULL_DUPLEX_STREAMED``, as llm-d's picker assumes). The orders, gateway → picker and
picker → gateway:

``FULL_DUPLEX_STREAMED`` (request body): request headers (no answer yet); body chunks, gathered (no answer
per chunk); at the chunk with ``end_of_stream`` (or the request trailers) the decision, then the answer to
the headers (destination header, ``envoy.lb`` metadata, route cache cleared), then the whole body given back
as streamed body responses of at most 62 000 bytes, the last with ``end_of_stream`` (then the trailers'
answer, when the request had trailers). The gateway sends nothing upstream before the headers' answer.

``BUFFERED`` (request body): request headers, answered at once (a client's destination header removed); the
whole body in one message, answered with the destination as a header mutation of the body response (which
``BUFFERED`` applies) and the ``envoy.lb`` metadata.

A request without a body (``end_of_stream`` on its headers), and any other request body mode (``NONE``,
``STREAMED``, ``BUFFERED_PARTIAL``), is decided on its headers alone: the least busy healthy endpoint.

Response: the headers answered at once (naming the replica in ``x-burstsched-endpoint``); in
``FULL_DUPLEX_STREAMED`` each body chunk is given back as it comes, as a streamed body response with the
chunk's ``end_of_stream``; in ``BUFFERED`` or ``STREAMED`` each body message is let through unchanged;
trailers are answered empty. With ``response_body_mode: NONE`` the gateway sends no body at all: the cheapest
setting, at the cost described in :mod:`burstsched.epp.accounting`.

A refusal (no endpoint, shed, a bad body) is an immediate response, after which the stream ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, AsyncIterator, Iterator
from dataclasses import dataclass

from burstsched.epp import wire
from burstsched.epp.accounting import Accounting
from burstsched.epp.pb.ext_proc_pb2 import (
    HttpBody,
    HttpHeaders,
    ProcessingMode,
    ProcessingRequest,
    ProcessingResponse,
)
from burstsched.epp.picker import Pick, Picker, Refusal
from burstsched.front.app import Router

log = logging.getLogger(__name__)

BodyMode = ProcessingMode.BodySendMode
FULL_DUPLEX = ProcessingMode.FULL_DUPLEX_STREAMED
BUFFERED = ProcessingMode.BUFFERED
NONE = ProcessingMode.NONE


@dataclass(frozen=True, slots=True)
class _Pending:
    """What the message that completes a request's decision said: whether its body ended (a decision on
    the trailers: no), whether there is a body to give back, whether the trailers are to be answered."""

    end_of_stream: bool
    with_body: bool = True
    trailers: bool = False


class Session:
    """The state of one stream; :meth:`run` turns the gateway's messages into the picker's answers."""

    def __init__(self, router: Router, picker: Picker, served_header: str | None = None) -> None:
        """``served_header``: a response header to name the ``IP:PORT`` that served in (None: none)."""
        self._router = router
        self._picker = picker
        self._served_header = served_header
        self._request_mode: BodyMode = FULL_DUPLEX
        self._response_mode: BodyMode = FULL_DUPLEX
        self._path = ""
        self._headers: dict[str, str] = {}
        self._subset: frozenset[str] | None = None
        self._body: list[bytes] = []
        self._decided = False
        self._accounting: Accounting | None = None
        self._pending = _Pending(end_of_stream=True)
        self._started = router.metrics.clock()
        self.refused = False

    async def run(self, messages: AsyncIterable[ProcessingRequest]) -> AsyncIterator[ProcessingResponse]:
        try:
            async for message in messages:
                answers = self._answer(message)
                if answers is None:  # the message completes what the decision needs
                    answers = await self._decide()
                for answer in answers:
                    yield answer
                if self.refused:
                    return
        except asyncio.CancelledError:
            if self._accounting is not None:
                self._accounting.finish("cancelled")
            raise
        finally:
            if self._accounting is not None:
                self._accounting.finish()

    def _answer(self, message: ProcessingRequest) -> list[ProcessingResponse] | None:
        """The answers to one message, or None when the request must now be decided (:meth:`_decide`,
        which then answers it). Synchronous: only a decision awaits."""
        kind = message.WhichOneof("request")
        if kind == "response_body":
            return self._response_body(message.response_body)
        if kind == "request_body":
            return self._request_body(message.request_body)
        if kind == "request_headers":
            if message.HasField("protocol_config"):
                self._request_mode = message.protocol_config.request_body_mode
                self._response_mode = message.protocol_config.response_body_mode
            return self._request_headers(message, message.request_headers)
        if kind == "response_headers":
            if self._accounting is not None:
                self._accounting.served_by(wire.served_address(message))
            return self._response_headers(message.response_headers)
        if kind == "request_trailers":
            if not self._decided:
                self._pending = _Pending(end_of_stream=False, trailers=True)
                return None
            return [wire.trailers(request=True)]
        if kind == "response_trailers":
            if self._accounting is not None:
                self._accounting.response_end()
                self._accounting.finish()
            return [wire.trailers(request=False)]
        return []

    def _request_headers(
        self, message: ProcessingRequest, headers: HttpHeaders
    ) -> list[ProcessingResponse] | None:
        self._headers = wire.header_values(headers.headers)
        self._path = self._headers.get(":path", "")
        self._subset = wire.subset_hint(message)
        if headers.end_of_stream or self._request_mode not in (FULL_DUPLEX, BUFFERED):
            self._pending = _Pending(end_of_stream=True, with_body=False)
            return None
        if self._request_mode == BUFFERED:
            return [wire.request_headers(wire.stripping())]
        return []

    def _request_body(self, body: HttpBody) -> list[ProcessingResponse] | None:
        if self._decided:  # decided on the headers: the body goes on unchanged
            if self._request_mode == FULL_DUPLEX:
                return wire.streamed(body.body, end_of_stream=body.end_of_stream, request=True)
            return [wire.body_passed(request=True)]
        self._body.append(body.body)
        if body.end_of_stream or self._request_mode == BUFFERED:
            self._pending = _Pending(end_of_stream=body.end_of_stream)
            return None
        return []

    async def _decide(self) -> list[ProcessingResponse]:
        pending = self._pending
        self._decided = True
        body = b"".join(self._body) if pending.with_body else None
        self._body = []
        outcome = await self._picker.pick(self._path, self._headers, body, self._subset)
        if isinstance(outcome, Refusal):
            self.refused = True
            self._router.metrics.request_done(None, outcome.outcome)
            immediate = wire.immediate(
                outcome.status,
                outcome.message,
                headers=outcome.headers,
                param=outcome.param,
                code=outcome.code,
            )
            return [immediate]
        answers = list(self._route(outcome, body, end_of_stream=pending.end_of_stream))
        if pending.trailers:
            answers.append(wire.trailers(request=True))
        return answers

    def _route(self, pick: Pick, body: bytes | None, *, end_of_stream: bool) -> Iterator[ProcessingResponse]:
        self._accounting = Accounting(self._router, pick, self._started)
        addresses = pick.addresses
        if body is not None and self._request_mode == BUFFERED:
            yield wire.destination(addresses, buffered=True)
            return
        yield wire.destination(addresses, buffered=False)
        if body is not None:  # FULL_DUPLEX_STREAMED: the gathered body goes back to the gateway
            yield from wire.streamed(body, end_of_stream=end_of_stream, request=True)

    def _response_headers(self, headers: HttpHeaders) -> list[ProcessingResponse]:
        accounting = self._accounting
        if accounting is not None:
            status, content_length = wire.response_head(headers.headers)
            body_follows = not headers.end_of_stream and self._response_mode != NONE
            length = _status(content_length) if content_length is not None else None
            accounting.response_head(_status(status), body_follows=body_follows, content_length=length)
        served = None
        if self._served_header is not None and accounting is not None:
            served = (self._served_header, accounting.address)
        answer = wire.response_headers(accounting.endpoint_name if accounting is not None else None, served)
        if headers.end_of_stream and accounting is not None:
            accounting.response_end()
            accounting.finish()
        return [answer]

    def _response_body(self, body: HttpBody) -> list[ProcessingResponse]:
        if self._accounting is not None:
            self._accounting.response_body(body.body)
        if self._response_mode == FULL_DUPLEX:
            answers = wire.streamed(body.body, end_of_stream=body.end_of_stream, request=False)
        else:
            answers = [wire.body_passed(request=False)]
        if body.end_of_stream and self._accounting is not None:
            self._accounting.response_end()
            self._accounting.finish()
        return answers


def _status(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0
