"""One recorded request as a JSON line (pure functions, run on the event loop by the recorder's flush).

The line format (``v`` 1) is documented in this package's README. Block hashes are written as one hex
string, 16 hex digits per block (unsigned 64-bit, big-endian): ``jq`` reads it without the precision loss
its numbers would suffer past 2^53.

:func:`line_of` turns a queued :data:`Entry` into a :class:`Line`, a ``msgspec`` struct whose fields are
the line's keys in order; :func:`encode_lines` writes a batch of them in one C call (``msgspec``'s
``encode_lines``). Python touches each line only to read its usage from the response's tail and to work
out its times: cheaper than formatting it in Python (an f-string of primitives, or a dict through
``json.dumps``). It runs once per request on the event loop, so every call counts (the costs measured are
in the README).
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any, Final

import msgspec

from burstsched.framework import Decision

LINE_VERSION = 1
HEX_PER_BLOCK = 16

_USAGE_KEY = b'"usage"'
_USAGE_OPEN = re.compile(rb'"usage"\s*:\s*\{')
_INPUT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_OUTPUT = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_CACHED = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')
_VLLM_USAGE = re.compile(
    rb'"usage":\{"prompt_tokens":(\d+),"total_tokens":\d+,"completion_tokens":(\d+)'
    rb'(?:\}|,"prompt_tokens_details":(?:null|\{"cached_tokens":(\d+)))'
)
"""vLLM's ``usage`` object as it serializes it (its field order, no spaces; ``prompt_tokens_details`` absent,
null or leading with ``cached_tokens``): read with one anchored match. Any other shape takes the general
reading, three searches inside the object, in any order and spacing."""

Counts = tuple[int | None, int | None, int | None]
"""``(input_tokens, output_tokens, cached_tokens)``; None: not reported."""

_NO_COUNTS: Counts = (None, None, None)

_CHAIN_FORMATS: dict[int, struct.Struct] = {}
"""The compiled ``struct`` format of each chain length met (bounded by the longest prefix hashed)."""


@dataclass(frozen=True, slots=True)
class Usage:
    """The token counts of a response's ``usage`` object (None: not reported)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None


def usage_counts(response_tail: bytes) -> Counts:
    """The counts of the last ``usage`` object in a JSON body or a stream's tail.

    Found from the end with ``bytes.rfind`` (a ``"usage"`` key holding no object, e.g. ``null``, is
    skipped), then read with one match when it is vLLM's serialization, else with three regex searches
    inside that object: no JSON decoding, no copy.
    """
    end = len(response_tail)
    while True:
        at = response_tail.rfind(_USAGE_KEY, 0, end)
        if at < 0:
            return _NO_COUNTS
        vllm = _VLLM_USAGE.match(response_tail, at)
        if vllm is not None:
            cached = vllm[3]
            return int(vllm[1]), int(vllm[2]), None if cached is None else int(cached)
        opened = _USAGE_OPEN.match(response_tail, at)
        if opened is not None:
            break
        end = at
    start = opened.end()
    close = response_tail.find(b"}}", start)
    stop = len(response_tail) if close < 0 else close + 2
    found_in = _INPUT.search(response_tail, start, stop)
    found_out = _OUTPUT.search(response_tail, start, stop)
    found_cached = _CACHED.search(response_tail, start, stop)
    return (
        None if found_in is None else int(found_in[1]),
        None if found_out is None else int(found_out[1]),
        None if found_cached is None else int(found_cached[1]),
    )


def usage_of(response_tail: bytes) -> Usage:
    """:func:`usage_counts` as a :class:`Usage`."""
    return Usage(*usage_counts(response_tail))


def hex_chain(block_hashes: tuple[int, ...]) -> str:
    """A block-hash chain as one hex string, 16 digits per block."""
    chain_format = _CHAIN_FORMATS.get(len(block_hashes))
    if chain_format is None:  # a compiled format per length: 0.3 µs less per 16-block chain than struct.pack
        chain_format = _CHAIN_FORMATS[len(block_hashes)] = struct.Struct(f">{len(block_hashes)}Q")
    return chain_format.pack(*block_hashes).hex()


def parse_chain(text: str) -> tuple[int, ...]:
    """The inverse of :func:`hex_chain`."""
    if len(text) % HEX_PER_BLOCK:
        raise ValueError("a block chain has 16 hex digits per block")
    raw = bytes.fromhex(text)
    return struct.unpack(f">{len(raw) // 8}Q", raw)


def max_tokens_of(max_completion_tokens: object, max_tokens: object) -> int | None:
    """The request's output limit (``max_completion_tokens`` first, as vLLM reads it); ints only."""
    if type(max_completion_tokens) is int:
        return max_completion_tokens
    if type(max_tokens) is int:
        return max_tokens
    return None


def prompt_text_of(payload: dict[str, Any]) -> Any:
    """What ``include_text`` records: the chat messages, or the completion prompt."""
    return payload["messages"] if "messages" in payload else payload.get("prompt")


Entry = tuple[
    float,  # arrived: the recorder's clock
    float,  # ended: the same clock
    str,  # request id
    str,  # api
    str,  # model
    bool,  # stream
    int,  # block_tokens
    str,  # the block-hash chain, as hex_chain writes it
    int,  # prompt_tokens
    object,  # the payload's max_completion_tokens (any JSON value)
    object,  # the payload's max_tokens
    int | None,  # window
    str | None,  # group
    str,  # role
    int,  # group_size
    float,  # waited_s
    str | None,  # endpoint
    str,  # outcome
    float | None,  # first_byte_at: the recorder's clock
    bytes,  # the response's tail (usage)
    Any,  # the prompt text (include_text: the messages or the prompt) or None
    Decision | None,  # the scheduler's decision (decisions) or None
    float,  # queued_s: the wait in the router's flow-control queue (0: it went straight through)
]
"""One finished request's fields, as the recorder reads them (the text only with ``include_text``, the
decision only with ``decisions``)."""

ENDPOINT: Final = 16
"""The endpoint's index in an :data:`Entry`."""


class Line(msgspec.Struct, gc=False):
    """A request's line: its fields are the line's keys, in the README's order (``text`` and ``decision``
    are left out unless set). Not tracked by the cyclic GC: a line refers to nothing that refers to it."""

    v: int
    t: float
    id: str
    api: str
    model: str
    stream: bool
    block_tokens: int
    bytes_per_token: int
    blocks: str
    prompt_tokens: int
    input_tokens: int | None
    cached_tokens: int | None
    max_tokens: int | None
    output_tokens: int | None
    window: int | None
    group: str | None
    role: str
    group_size: int
    waited_ms: float
    endpoint: str | None
    outcome: str
    ttft_ms: float | None
    e2e_ms: float
    text: Any = msgspec.UNSET
    decision: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    queued_ms: float | msgspec.UnsetType = msgspec.UNSET


def line_of(entry: Entry, wall_offset: float, bytes_per_token: int, with_text: bool) -> Line:
    """The line of one queued entry (schema: the package's README).

    ``wall_offset`` turns the entry's clock into Unix seconds. Times are rounded: ``t`` to the µs, ``*_ms``
    in milliseconds to the µs (a float is written as the shortest text that reads back as it: ``250.0``,
    ``4.123``). The text (only ``with_text``) is any JSON value.
    """
    (
        arrived,
        ended,
        request_id,
        api,
        model,
        stream,
        block_tokens,
        blocks,
        prompt_tokens,
        max_completion_tokens,
        max_tokens,
        window,
        group,
        role,
        group_size,
        waited_s,
        endpoint,
        outcome,
        first_byte_at,
        response_tail,
        text,
        decision,
        queued_s,
    ) = entry
    input_tokens, output_tokens, cached_tokens = usage_counts(response_tail)
    line = Line(
        LINE_VERSION,
        round((arrived + wall_offset) * 1e6) / 1e6,
        request_id,
        api,
        model,
        stream,
        block_tokens,
        bytes_per_token,
        blocks,
        prompt_tokens,
        input_tokens,
        cached_tokens,
        max_tokens_of(max_completion_tokens, max_tokens),
        output_tokens,
        window,
        group,
        role,
        group_size,
        round(waited_s * 1e6) / 1e3,
        endpoint,
        outcome,
        None if first_byte_at is None else round((first_byte_at - arrived) * 1e6) / 1e3,
        round((ended - arrived) * 1e6) / 1e3,
    )
    if with_text:
        line.text = text
    if decision is not None:
        line.decision = msgspec.Raw(decision_json(decision).encode())
    if queued_s > 0:
        line.queued_ms = round(queued_s * 1e6) / 1e3
    return line


_ENCODER = msgspec.json.Encoder()


def encode_lines(lines: Sequence[Line]) -> bytes:
    """The lines as JSON, each ended by a newline, in one call (no Python per line)."""
    return _ENCODER.encode_lines(lines)


def format_line(entry: Entry, wall_offset: float, bytes_per_token: int, with_text: bool) -> bytes:
    """One entry's line, newline-terminated (:func:`line_of`, then :func:`encode_lines` of one)."""
    return _ENCODER.encode_lines((line_of(entry, wall_offset, bytes_per_token, with_text),))


REPLICA_KIND = "replica"
"""``kind`` of a line that gives a replica's KV-cache geometry (request lines carry no ``kind``)."""


def format_replica_line(t: float, name: str, block_size: int, num_gpu_blocks: int) -> bytes:
    """A replica's KV-cache geometry as it reported it (``t``: Unix seconds), for the replay's defaults."""
    return (
        f'{{"v":{LINE_VERSION},"kind":"{REPLICA_KIND}","t":{t:.6f},"replica":{encode_basestring(name)},'
        f'"block_size":{block_size},"num_gpu_blocks":{num_gpu_blocks}}}\n'
    ).encode()


def decision_json(decision: Decision) -> str:
    """The candidates in the scheduler's order (the first was picked), each with its weighted total, every
    scorer's score, its prefix match in blocks and the load figures the scorers saw."""
    candidates = []
    for scored in decision.ranked:
        e = scored.endpoint
        match = decision.matches.get(scored.name)
        candidates.append(
            {
                "endpoint": e.name,
                "total": round(scored.total, 4),
                "scores": {name: round(value, 4) for name, value in scored.scores.items()},
                "matched_blocks": None if match is None else match.matched_blocks,
                "waiting": e.waiting,
                "running": e.running,
                "in_flight": e.in_flight,
                "pending": e.pending,
                "kv_usage": round(e.kv_usage, 4),
                "stale": e.stale,
                "metrics_age_ms": round(e.metrics_age * 1000.0, 1) if math.isfinite(e.metrics_age) else None,
            }
        )
    return json.dumps(candidates, separators=(",", ":"))
