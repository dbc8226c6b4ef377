"""The soak's client: one request of each kind, and the outcome the client saw, classified.

Outcome kinds (every request gets exactly one):

- ``completed``: a 200 answer read to its end (a stream: a ``finish_reason`` and ``[DONE]``, no error event);
- ``error_status``: a non-2xx answer whose body is an OpenAI error (e.g. 502 when every attempt failed);
- ``stream_error``: a 200 stream the router ended with an error event, then ``[DONE]`` (a replica died
  mid-stream);
- ``cancelled``: a stream this client closed on purpose after a few chunks;
- ``rejected``: a malformed request answered 4xx with an OpenAI error body, as it should be;
- ``bad_shape``: an answer came, but not the right one (an error body that is not OpenAI's, a malformed
  request not answered 4xx, a 200 body without choices, data after ``[DONE]``);
- ``lost``: no answer (a transport error before the status), a stream cut without an error event, an error
  event without ``[DONE]``, a stream that ended without ``[DONE]``.

``lost`` and ``bad_shape`` are failures; the others are what a client of a router under faults should see.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from burstsched.wire.sse import DONE, aiter_data

Kind = Literal["completed", "error_status", "stream_error", "cancelled", "rejected", "bad_shape", "lost"]
KINDS: tuple[Kind, ...] = (
    "completed",
    "error_status",
    "stream_error",
    "cancelled",
    "rejected",
    "bad_shape",
    "lost",
)
FAILURES: tuple[Kind, ...] = ("bad_shape", "lost")
MALFORMED = ("bad_json", "no_messages", "unknown_model", "bad_max_tokens", "oversize", "oversize_chunked")
"""Malformed requests: unparsable JSON, no ``messages``, a model nobody serves, a field the replica refuses
(its 400 passed through), a body over the router's limit with its length declared, and one streamed in
chunks without a declared length."""

ENDPOINT_HEADER = "x-burstsched-endpoint"
ATTEMPTS_HEADER = "x-burstsched-attempts"


@dataclass(slots=True)
class Outcome:
    """What one request looked like from the client; ``request``: ``stream``, ``json``, ``malformed:KIND``."""

    request: str
    kind: Kind
    status: int | None = None
    detail: str = ""
    endpoint: str | None = None
    attempts: int = 1
    started_s: float = 0.0
    ended_s: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "request": self.request,
            "kind": self.kind,
            "status": self.status,
            "detail": self.detail,
            "endpoint": self.endpoint,
            "attempts": self.attempts,
            "started_s": round(self.started_s, 3),
            "ended_s": round(self.ended_s, 3),
        }


def is_openai_error(body: object) -> bool:
    """``{"error": {"message": str, "type": str, "param": ..., "code": ...}}``."""
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return False
    error = body["error"]
    return (
        isinstance(error.get("message"), str)
        and isinstance(error.get("type"), str)
        and "param" in error
        and "code" in error
    )


def _json(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _classify_error_answer(outcome: Outcome, raw: bytes) -> None:
    if is_openai_error(_json(raw)):
        outcome.kind = "error_status"
        return
    outcome.kind = "bad_shape"
    outcome.detail = f"{outcome.status} without an OpenAI error body: {raw[:120]!r}"


def _headers_into(outcome: Outcome, response: httpx.Response) -> None:
    outcome.status = response.status_code
    outcome.endpoint = response.headers.get(ENDPOINT_HEADER)
    try:
        outcome.attempts = int(response.headers.get(ATTEMPTS_HEADER, "1"))
    except ValueError:
        outcome.attempts = 1


@dataclass(slots=True)
class StreamState:
    """What a stream's events said so far; :meth:`kind` classifies it once it ended."""

    done: bool = False
    finished: bool = False
    error_event: bool = False
    after_done: bool = False
    chunks: int = 0

    def read(self, data: str) -> None:
        """One event's ``data``."""
        if self.done:
            self.after_done = True
            return
        if data == DONE:
            self.done = True
            return
        self.chunks += 1
        chunk = _json(data.encode())
        if isinstance(chunk, dict) and "error" in chunk:
            self.error_event = True
            return
        if isinstance(chunk, dict):
            for choice in chunk.get("choices") or []:
                if isinstance(choice, dict) and choice.get("finish_reason"):
                    self.finished = True

    def kind(self, transport_error: str | None) -> tuple[Kind, str]:
        if self.after_done:
            return "bad_shape", "data after [DONE]"
        if self.error_event:
            if self.done:
                return "stream_error", ""
            return "lost", f"error event without [DONE] ({transport_error or 'stream ended'})"
        if transport_error is not None:
            return "lost", f"stream cut without an error event: {transport_error}"
        if self.done and self.finished:
            return "completed", ""
        return "lost", f"stream ended without {'a finish_reason' if self.done else '[DONE]'}"


async def send_chat(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    request_id: str,
    *,
    clock: Callable[[], float],
    cut_after: int | None = None,
) -> Outcome:
    """One chat completion (streamed when ``body["stream"]``); ``cut_after``: close a stream after that
    many data chunks (the outcome is ``cancelled`` unless the stream had failed before)."""
    streamed = bool(body.get("stream"))
    outcome = Outcome("stream" if streamed else "json", "lost", started_s=clock())
    headers = {"x-request-id": request_id}
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
            _headers_into(outcome, resp)
            if resp.status_code != 200:
                _classify_error_answer(outcome, await resp.aread())
            elif streamed:
                await _read_stream(resp, outcome, cut_after)
            else:
                _classify_json(outcome, await resp.aread())
    except httpx.HTTPError as exc:
        if outcome.status is None:
            outcome.kind, outcome.detail = "lost", f"no answer: {type(exc).__name__}: {exc}"
        elif outcome.kind == "lost" and not outcome.detail:  # failed before the answer was classified
            outcome.kind, outcome.detail = "lost", f"answer cut: {type(exc).__name__}: {exc}"
    outcome.ended_s = clock()
    return outcome


async def _read_stream(resp: httpx.Response, outcome: Outcome, cut_after: int | None) -> None:
    state = StreamState()
    transport_error: str | None = None
    try:
        async for data in aiter_data(resp.aiter_bytes()):
            state.read(data)
            if cut_after is not None and state.chunks >= cut_after and not state.error_event:
                outcome.kind = "cancelled"
                return  # leaving the stream's context closes the connection mid-stream
    except httpx.HTTPError as exc:
        transport_error = f"{type(exc).__name__}: {exc}"
    outcome.kind, outcome.detail = state.kind(transport_error)


def _classify_json(outcome: Outcome, raw: bytes) -> None:
    body = _json(raw)
    choices = body.get("choices") if isinstance(body, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        if choices[0].get("finish_reason"):
            outcome.kind = "completed"
            return
    outcome.kind, outcome.detail = "bad_shape", f"200 without a finished choice: {raw[:120]!r}"


def malformed_body(kind: str, model: str, max_body_bytes: int) -> bytes:
    """The body of a malformed request of ``kind`` (see :data:`MALFORMED`)."""
    message = [{"role": "user", "content": "Is this request well formed?"}]
    if kind == "bad_json":
        return b'{"model": "' + model.encode() + b'", "messages": [{"role": "user", "content": "cut'
    if kind == "no_messages":
        return json.dumps({"model": model, "max_tokens": 4}).encode()
    if kind == "unknown_model":
        return json.dumps({"model": f"{model}-nobody-serves", "messages": message}).encode()
    if kind == "bad_max_tokens":
        return json.dumps({"model": model, "messages": message, "max_tokens": -3}).encode()
    if kind in ("oversize", "oversize_chunked"):
        head = json.dumps({"model": model, "messages": message, "user": ""}).encode()[:-2]
        return head + b"x" * max(0, max_body_bytes + 1 - len(head) - 2) + b'"}'
    raise ValueError(f"unknown malformed kind {kind!r}")


async def _chunks(data: bytes, size: int = 16384) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def send_malformed(
    client: httpx.AsyncClient,
    url: str,
    kind: str,
    model: str,
    max_body_bytes: int,
    request_id: str,
    *,
    clock: Callable[[], float],
) -> Outcome:
    """One malformed chat request; ``rejected`` when answered 4xx with an OpenAI error body."""
    outcome = Outcome(f"malformed:{kind}", "lost", started_s=clock())
    body = malformed_body(kind, model, max_body_bytes)
    content: bytes | AsyncIterator[bytes] = _chunks(body) if kind == "oversize_chunked" else body
    headers = {"content-type": "application/json", "x-request-id": request_id}
    try:
        response = await client.post(f"{url}/v1/chat/completions", content=content, headers=headers)
    except httpx.HTTPError as exc:
        outcome.kind, outcome.detail = "lost", f"no answer: {type(exc).__name__}: {exc}"
    else:
        _headers_into(outcome, response)
        if 400 <= response.status_code < 500 and is_openai_error(_json(response.content)):
            outcome.kind = "rejected"
        else:
            outcome.kind = "bad_shape"
            outcome.detail = f"{response.status_code} (want 4xx, OpenAI error): {response.content[:120]!r}"
    outcome.ended_s = clock()
    return outcome
