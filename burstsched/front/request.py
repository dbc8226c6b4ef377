"""Client requests: reading the body under a size limit, validating an OpenAI body, building the
:class:`SchedRequest`.

Validation covers what the router relies on (JSON object, ``model``, ``stream``, ``messages`` or ``prompt``,
``cache_salt``); every other field goes to the replica untouched, and the body is forwarded as received.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.types import Receive

from burstsched.config import PrefixHashingConfig
from burstsched.framework import ApiKind, SchedRequest
from burstsched.prefix.hashing import block_hashes, pseudo_tokens, render_chat, render_prompt


class RequestError(Exception):
    """A request the router refuses; ``status`` and the OpenAI error fields say why."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


class ClientDisconnected(Exception):
    """The client went away while sending its body."""


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A validated client request; ``body`` is forwarded upstream as received."""

    api: ApiKind
    body: bytes
    payload: dict[str, Any]
    model: str | None
    stream: bool
    cache_salt: str | None
    rendered: bytes

    def to_sched_request(
        self,
        request_id: str,
        model: str,
        hashing: PrefixHashingConfig,
        token_ids: tuple[int, ...] | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> SchedRequest:
        """The scheduler's view of this request, with its block-hash chain (and its engine token ids, when
        the router tokenized it, and the client ``headers`` its plugins read)."""
        return SchedRequest(
            request_id=request_id,
            model=model,
            api=self.api,
            stream=self.stream,
            block_hashes=block_hashes(
                self.rendered,
                model=model,
                cache_salt=self.cache_salt,
                block_tokens=hashing.block_tokens,
                bytes_per_token=hashing.bytes_per_token,
                max_blocks=hashing.max_blocks,
            ),
            block_tokens=hashing.block_tokens,
            prompt_tokens=pseudo_tokens(self.rendered, hashing.bytes_per_token),
            token_ids=token_ids,
            cache_salt=self.cache_salt,
            headers=headers,
        )


DISCARD_BYTES = 64 * 1024 * 1024
"""How much of a body over the limit is still read (and dropped) before the 413 goes out ..."""
DISCARD_S = 1.0
"""... and for how long at most (a client that declared a huge body and waits gets its 413 after this)."""


async def read_body(receive: Receive, headers: dict[str, str], limit: int) -> bytes:
    """The whole request body; :class:`RequestError` 413 past ``limit`` bytes.

    Before a 413 the rest of the body is read and dropped (up to ``DISCARD_BYTES`` for ``DISCARD_S``): a
    client still sending would otherwise have its connection reset by the close that follows the answer,
    and lose the 413 with it.
    """
    declared = headers.get("content-length")
    if declared is not None:
        try:
            declared_size = int(declared)
        except ValueError:
            raise RequestError(400, "invalid Content-Length header") from None
        if declared_size > limit:
            await _discard(receive, DISCARD_BYTES)
            raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        chunk = message.get("body", b"")
        more = message.get("more_body", False)
        if chunk:
            size += len(chunk)
            if size > limit:
                if more:
                    await _discard(receive, DISCARD_BYTES)
                raise _too_large(limit)
            chunks.append(chunk)
        if not more:
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _discard(receive: Receive, budget: int) -> None:
    """Read and drop the rest of a body: at most ``budget`` more bytes, for at most ``DISCARD_S``."""
    with anyio.move_on_after(DISCARD_S):
        while budget > 0:
            message = await receive()
            if message["type"] != "http.request":
                return
            budget -= len(message.get("body", b""))
            if not message.get("more_body", False):
                return


def _too_large(limit: int) -> RequestError:
    return RequestError(413, f"request body larger than {limit} bytes", code="request_too_large")


def parse_request(api: ApiKind, body: bytes) -> ParsedRequest:
    """Validate an OpenAI chat or completions body; :class:`RequestError` (400) when it is not one."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestError(400, "request body is not valid UTF-8") from None
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestError(400, f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise RequestError(400, "request body is nested too deeply") from None
    if not isinstance(payload, dict):
        raise RequestError(400, "request body must be a JSON object")

    model = payload.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(400, "'model' must be a string", param="model")
    stream = payload.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise RequestError(400, "'stream' must be a boolean", param="stream")
    stream_options = payload.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise RequestError(400, "'stream_options' must be an object", param="stream_options")
    cache_salt = payload.get("cache_salt")
    if cache_salt is not None and not isinstance(cache_salt, str):
        raise RequestError(400, "'cache_salt' must be a string", param="cache_salt")
    _check_unicode(model, "model")
    _check_unicode(cache_salt, "cache_salt")

    try:
        rendered = _render_chat(payload) if api is ApiKind.CHAT else _render_completion(payload)
    except UnicodeEncodeError:
        raise RequestError(400, "request body holds a lone surrogate (\\ud800-\\udfff) escape") from None
    except RecursionError:
        raise RequestError(400, "request body is nested too deeply") from None
    return ParsedRequest(api, body, payload, model, bool(stream), cache_salt, rendered)


def _check_unicode(value: str | None, param: str) -> None:
    """Refuse a string holding a lone surrogate (valid JSON escapes, not valid text)."""
    if value is None:
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(400, f"'{param}' holds a lone surrogate", param=param) from None


def _render_chat(payload: dict[str, Any]) -> bytes:
    messages = payload.get("messages")
    if messages is None:
        raise RequestError(400, "'messages' is required", param="messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty array", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise RequestError(400, f"'messages[{i}]' must be an object", param=f"messages[{i}]")
        if not isinstance(message.get("role"), str):
            raise RequestError(400, f"'messages[{i}].role' must be a string", param=f"messages[{i}].role")
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise RequestError(
                400, f"'messages[{i}].content' must be a string or an array", param=f"messages[{i}].content"
            )
        if isinstance(content, list) and not all(isinstance(part, dict) for part in content):
            raise RequestError(
                400, f"'messages[{i}].content' parts must be objects", param=f"messages[{i}].content"
            )
    tools = payload.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise RequestError(400, "'tools' must be an array", param="tools")
    return render_chat(messages, tools)


def _is_token_list(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(type(t) is int and 0 <= t < 2**32 for t in value)


def _render_completion(payload: dict[str, Any]) -> bytes:
    prompt = payload.get("prompt")
    if prompt is None:
        raise RequestError(400, "'prompt' is required", param="prompt")
    if isinstance(prompt, str):
        return render_prompt(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return render_prompt(prompt[0])
        if _is_token_list(prompt):
            return render_prompt(prompt)
        if all(_is_token_list(p) for p in prompt):
            return render_prompt(prompt[0])
    raise RequestError(
        400,
        "'prompt' must be a string, an array of strings, an array of token ids or an array of such arrays",
        param="prompt",
    )
