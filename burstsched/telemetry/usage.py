"""What a replica's response says about itself: id, model, token usage, finish reasons (pure functions).

A JSON body is read whole; a stream (SSE) is read from its tail, where vLLM puts the usage chunk (with
``stream_options.include_usage``) just before ``data: [DONE]``. Anything missing or malformed is left out.

A JSON body is decoded by msgspec into the few fields wanted (the message content and everything else is
skipped without being built: 2-3 µs against about 11 for ``json.loads`` of a small completion); a body
whose fields have other types than OpenAI's takes the general reading.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgspec

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


class _Details(msgspec.Struct):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _Details | None = None


class _Choice(msgspec.Struct):
    finish_reason: str | None = None


class _Body(msgspec.Struct):
    id: str | None = None
    model: str | None = None
    usage: _Usage | None = None
    choices: list[_Choice] | None = None


_BODY = msgspec.json.Decoder(_Body)


def from_json_body(body: bytes) -> ResponseInfo:
    """The response info of a non-streaming JSON body."""
    if len(body) > _MAX_JSON_BYTES:
        return ResponseInfo()
    try:
        head = _BODY.decode(body)
    except msgspec.ValidationError:
        pass  # valid JSON of other shapes: the general reading below
    except msgspec.DecodeError:
        return ResponseInfo()
    else:
        usage = head.usage
        reasons = tuple(c.finish_reason for c in head.choices or () if c.finish_reason is not None)
        if usage is None:
            return _info(head.id, head.model, None, reasons)
        details = usage.prompt_tokens_details
        cached = details.cached_tokens if details is not None else None
        return _info(head.id, head.model, (usage.prompt_tokens, usage.completion_tokens, cached), reasons)
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
        return _info(response_id, model, None, tuple(reasons))
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    counts = (usage.get("prompt_tokens"), usage.get("completion_tokens"), cached)
    return _info(response_id, model, counts, tuple(reasons))


def _info(
    response_id: str | None,
    model: str | None,
    counts: tuple[object, object, object] | None,
    reasons: tuple[str, ...],
) -> ResponseInfo:
    """A :class:`ResponseInfo`; ``counts`` (input, output, cached tokens as found) kept where they are
    counts, None when the response had no usage."""
    if counts is None:
        return ResponseInfo(response_id, model, finish_reasons=reasons)
    prompt, completion, cached = counts
    return ResponseInfo(response_id, model, _count(prompt), _count(completion), _count(cached), reasons)


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
