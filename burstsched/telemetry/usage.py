"""What a replica's response says about itself: id, model, token usage, finish reasons (pure functions).

A JSON body is read whole; a stream (SSE) is read from its tail, where vLLM puts the usage chunk (with
``stream_options.include_usage``) just before ``data: [DONE]``. Anything missing or malformed is left out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from burstsched.wire.sse import SSEReader, json_object

SSE_TAIL_BYTES = 16 * 1024
"""How much of a stream's end :class:`StreamTail` keeps: the usage chunk and the last content chunks."""

_MAX_JSON_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ResponseInfo:
    """The fields of an OpenAI response (or of a stream's last chunks) that go on the upstream span."""

    response_id: str | None = None
    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reasons: tuple[str, ...] = ()


def from_json_body(body: bytes) -> ResponseInfo:
    """The response info of a non-streaming JSON body."""
    if len(body) > _MAX_JSON_BYTES:
        return ResponseInfo()
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return ResponseInfo()
    return _from_payloads([payload] if isinstance(payload, dict) else [])


def from_sse_tail(tail: bytes) -> ResponseInfo:
    """The response info of a stream, from its last events (JSON object ``data``; others ignored).

    A tail starts anywhere in the stream: its first line, if cut, is no ``data:`` line and is skipped; an
    event the tail ends before its blank line is left out (the stream was cut there)."""
    payloads: list[dict[str, Any]] = []
    for data in SSEReader().feed(tail):
        payload = json_object(data)
        if payload is not None:
            payloads.append(payload)
    return _from_payloads(payloads)


def _from_payloads(payloads: list[dict[str, Any]]) -> ResponseInfo:
    response_id: str | None = None
    model: str | None = None
    usage: dict[str, Any] | None = None
    reasons: list[str] = []
    for payload in payloads:
        if isinstance(payload.get("id"), str):
            response_id = payload["id"]
        if isinstance(payload.get("model"), str):
            model = payload["model"]
        if isinstance(payload.get("usage"), dict):
            usage = payload["usage"]
        choices = payload.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                reason = choice.get("finish_reason") if isinstance(choice, dict) else None
                if isinstance(reason, str):
                    reasons.append(reason)
    if usage is None:
        return ResponseInfo(response_id, model, finish_reasons=tuple(reasons))
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return ResponseInfo(
        response_id,
        model,
        input_tokens=_count(usage.get("prompt_tokens")),
        output_tokens=_count(usage.get("completion_tokens")),
        cached_tokens=_count(cached),
        finish_reasons=tuple(reasons),
    )


def _count(value: object) -> int | None:
    return value if type(value) is int and value >= 0 else None


class StreamTail:
    """The last ``limit`` bytes (at least) of a stream, kept as its chunks arrive."""

    __slots__ = ("_chunks", "_size", "_limit")

    def __init__(self, limit: int = SSE_TAIL_BYTES) -> None:
        self._chunks: list[bytes] = []
        self._size = 0
        self._limit = limit

    def add(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._size += len(chunk)
        while len(self._chunks) > 1 and self._size - len(self._chunks[0]) >= self._limit:
            self._size -= len(self._chunks.pop(0))

    def value(self) -> bytes:
        return b"".join(self._chunks)
