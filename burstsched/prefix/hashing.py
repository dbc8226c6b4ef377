"""Approximate prefix hashing: a request's prompt as the bytes it will send, cut into chained block hashes.

No tokenizer is needed: the rendered bytes are packed ``bytes_per_token`` to a pseudo-token and cut into
blocks of ``block_tokens`` pseudo-tokens; only full blocks are hashed. Each block's hash is xxhash64 of its
bytes seeded by the previous hash, so ``h_i = H(h_{i-1}, block_i)`` and equal hashes at position ``i`` mean
equal prompts up to the end of block ``i``. The first seed covers the model name and ``cache_salt``.

Chat rendering keeps prefixes: a conversation's rendering is a byte prefix of the rendering of the same
conversation with more messages.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import xxhash

_ROLE_END = b"\x1e"  # record separator: ends a role
_MESSAGE_END = b"\x1d"  # group separator: ends a message


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _content_bytes(content: Any) -> bytes:
    if content is None:
        return b""
    if isinstance(content, str):
        return content.encode()
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"].encode())
            else:
                parts.append(_json(part))
        return b"".join(parts)
    return _json(content)


def render_chat(messages: Sequence[Mapping[str, Any]], tools: Any = None) -> bytes:
    """Tools (as JSON), then each message's role and content (and name, tool calls) in order."""
    out: list[bytes] = []
    if tools:
        out.append(_json(tools))
        out.append(_MESSAGE_END)
    for message in messages:
        out.append(str(message.get("role", "")).encode())
        out.append(_ROLE_END)
        out.append(_content_bytes(message.get("content")))
        for key in ("name", "tool_calls", "tool_call_id"):
            if message.get(key) is not None:
                out.append(_json({key: message[key]}))
        out.append(_MESSAGE_END)
    return b"".join(out)


def render_prompt(prompt: str | Sequence[int]) -> bytes:
    """A completion prompt: text as UTF-8, token ids as 4 little-endian bytes each."""
    if isinstance(prompt, str):
        return prompt.encode()
    return b"".join(int(t).to_bytes(4, "little", signed=False) for t in prompt)


def chain_seed(model: str, cache_salt: str | None = None) -> int:
    """The hash that seeds a chain: the model name and the cache salt."""
    salt = b"" if cache_salt is None else b"\x00" + cache_salt.encode()
    return int(xxhash.xxh64_intdigest(model.encode() + salt))


def block_hashes(
    data: bytes,
    *,
    model: str,
    cache_salt: str | None = None,
    block_tokens: int = 64,
    bytes_per_token: int = 4,
    max_blocks: int = 256,
) -> tuple[int, ...]:
    """The chained hashes of ``data``'s full blocks, at most ``max_blocks`` of them."""
    block_bytes = block_tokens * bytes_per_token
    count = min(len(data) // block_bytes, max_blocks)
    view = memoryview(data)
    previous = chain_seed(model, cache_salt)
    hashes = []
    for i in range(count):
        previous = int(xxhash.xxh64_intdigest(view[i * block_bytes : (i + 1) * block_bytes], seed=previous))
        hashes.append(previous)
    return tuple(hashes)


def pseudo_tokens(data: bytes, bytes_per_token: int = 4) -> int:
    """The prompt's size in pseudo-tokens (rounded up)."""
    return -(-len(data) // bytes_per_token)
