"""One recorded request as a JSON line (pure functions, run on the recorder's writer thread).

The line format (``v`` 1) is documented in this package's README. Block hashes are written as one hex
string, 16 hex digits per block (unsigned 64-bit, big-endian): ``jq`` reads it without the precision loss
its numbers would suffer past 2^53.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from typing import Any

LINE_VERSION = 1
HEX_PER_BLOCK = 16

_USAGE = re.compile(rb'"usage"\s*:\s*\{')
_FIELDS = {
    "input_tokens": re.compile(rb'"prompt_tokens"\s*:\s*(\d+)'),
    "output_tokens": re.compile(rb'"completion_tokens"\s*:\s*(\d+)'),
    "cached_tokens": re.compile(rb'"cached_tokens"\s*:\s*(\d+)'),
}


@dataclass(frozen=True, slots=True)
class Usage:
    """The token counts of a response's ``usage`` object (None: not reported)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None


def usage_of(response_tail: bytes) -> Usage:
    """The last ``usage`` object in a JSON body or a stream's tail, read with a few regex searches (a
    stream's tail holds many events; decoding each as JSON would cost far more)."""
    start = -1
    for found in _USAGE.finditer(response_tail):
        start = found.end()
    if start < 0:
        return Usage()
    end = response_tail.find(b"}}", start)
    window = response_tail[start : len(response_tail) if end < 0 else end + 2]
    counts: dict[str, int | None] = {}
    for name, pattern in _FIELDS.items():
        match = pattern.search(window)
        counts[name] = int(match.group(1)) if match else None
    return Usage(**counts)


def hex_chain(block_hashes: tuple[int, ...]) -> str:
    """A block-hash chain as one hex string, 16 digits per block."""
    return struct.pack(f">{len(block_hashes)}Q", *block_hashes).hex()


def parse_chain(text: str) -> tuple[int, ...]:
    """The inverse of :func:`hex_chain`."""
    if len(text) % HEX_PER_BLOCK:
        raise ValueError("a block chain has 16 hex digits per block")
    raw = bytes.fromhex(text)
    return struct.unpack(f">{len(raw) // 8}Q", raw)


def max_tokens_of(payload: dict[str, Any]) -> int | None:
    """The request's output limit (``max_completion_tokens`` first, as vLLM reads it)."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = payload.get(key)
        if type(value) is int:
            return value
    return None


def prompt_text_of(payload: dict[str, Any]) -> Any:
    """What ``include_text`` records: the chat messages, or the completion prompt."""
    return payload["messages"] if "messages" in payload else payload.get("prompt")


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def encode(line: dict[str, Any]) -> bytes:
    """One JSON line, newline-terminated."""
    return json.dumps(line, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
