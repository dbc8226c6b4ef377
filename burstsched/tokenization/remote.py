"""Tokenizing prompts by asking a replica's own ``POST /tokenize`` (vLLM's), so the ids are the engine's.

Exact by construction (the replica renders and encodes with its own tokenizer, template and flags) at the
price of a round trip per distinct prompt; results are cached like the local tokenizer's. The body mirrors
the request: chat requests send ``messages``, ``tools``, ``add_generation_prompt``,
``continue_final_message``, ``add_special_tokens`` and ``chat_template_kwargs`` (with ``documents`` and
``reasoning_effort`` folded in, which ``/tokenize`` does not take as fields); completions send the first
prompt string and ``add_special_tokens``. Token-id prompts are not sent: they are their own ids.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx

from burstsched.framework import ApiKind
from burstsched.tokenization.cache import PromptCache
from burstsched.tokenization.errors import TokenizationError
from burstsched.tokenization.local import DEFAULT_CACHE_ENTRIES
from burstsched.tokenization.prompt_request import ChatPrompt, Prompt, parse_prompt, prompt_key

DEFAULT_TIMEOUT_S = 2.0

Post = Callable[[str, bytes, float], Awaitable[tuple[int, bytes]]]
"""``post(url, json_body, timeout_s) -> (status, body)``: one JSON POST within ``timeout_s``; raises httpx's
transport errors (the router's upstream client, through ``burstsched.dispatch.poster``)."""


class RemotePromptTokenizer:
    """A :class:`PromptTokenizer` asking ``POST {base_url()}/tokenize`` through the injected ``post``."""

    def __init__(
        self,
        post: Post,
        base_url: Callable[[], str | None],
        *,
        cache_entries: int = DEFAULT_CACHE_ENTRIES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """``base_url`` names the replica to ask now (e.g. a healthy one), or None when there is none."""
        self._post = post
        self._base_url = base_url
        self._timeout_s = timeout_s
        self.cache = PromptCache(cache_entries)

    async def prompt_token_ids(self, api: ApiKind, payload: Mapping[str, Any]) -> tuple[int, ...]:
        """The ids the replica computes for ``payload``'s prompt; raises :class:`TokenizationError`."""
        prompt = parse_prompt(api, payload)
        if not isinstance(prompt, ChatPrompt) and prompt.token_ids is not None:
            return prompt.token_ids
        key, _ = prompt_key(prompt)
        model = payload.get("model")
        body = tokenize_body(prompt, model if isinstance(model, str) else None)
        return await self.cache.get_or_compute(key, lambda: self._ask(body))

    async def _ask(self, body: dict[str, Any]) -> tuple[int, ...]:
        base = self._base_url()
        if base is None:
            raise TokenizationError("no replica to ask for /tokenize")
        url = base.rstrip("/") + "/tokenize"
        try:
            status, answer = await self._post(url, json.dumps(body).encode(), self._timeout_s)
        except httpx.HTTPError as exc:
            raise TokenizationError(f"POST {url} failed: {type(exc).__name__}: {exc}") from exc
        if status != 200:
            raise TokenizationError(f"POST {url} answered {status}: {_error_message(answer)}")
        try:
            tokens = json.loads(answer)["tokens"]
        except (ValueError, KeyError, TypeError) as exc:
            raise TokenizationError(f"POST {url} answered without a tokens list") from exc
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise TokenizationError(f"POST {url} answered without a tokens list")
        return tuple(tokens)


def tokenize_body(prompt: Prompt, model: str | None) -> dict[str, Any]:
    """The ``/tokenize`` body vLLM answers with ``prompt``'s ids."""
    body: dict[str, Any] = {} if model is None else {"model": model}
    if isinstance(prompt, ChatPrompt):
        kwargs = dict(prompt.template_kwargs or {})
        if prompt.documents is not None:
            kwargs["documents"] = prompt.documents
        body.update(
            messages=list(prompt.messages),
            add_generation_prompt=prompt.add_generation_prompt,
            continue_final_message=prompt.continue_final_message,
            add_special_tokens=prompt.add_special_tokens,
        )
        if prompt.tools is not None:
            body["tools"] = list(prompt.tools)
        if kwargs:
            body["chat_template_kwargs"] = kwargs
        return body
    body.update(prompt=prompt.text, add_special_tokens=prompt.add_special_tokens)
    return body


def _error_message(answer: bytes) -> str:
    try:
        error = json.loads(answer).get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
    except (ValueError, AttributeError):
        pass
    return answer[:200].decode("utf-8", errors="replace")
