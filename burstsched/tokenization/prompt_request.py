"""What of an OpenAI request body decides its prompt token ids, read with vLLM 0.32's defaults.

Chat (``/v1/chat/completions``): ``messages``, ``tools``, ``documents``, ``add_generation_prompt`` (default
true), ``continue_final_message`` (default false), ``add_special_tokens`` (default false: the template adds
what the model needs), ``chat_template_kwargs``, and ``reasoning_effort`` (vLLM passes it to the template,
with ``enable_thinking = reasoning_effort != "none"`` unless the kwargs set it).

Completions (``/v1/completions``): ``prompt`` as a string, a list of strings (a batch: the first prompt
decides where the request goes), token ids, or a list of token-id lists (the first); ``add_special_tokens``
(default true, as vLLM). Token ids are used as given.

A request carrying its own ``chat_template``, ``truncate_prompt_tokens`` or ``prompt_embeds`` cannot be
matched exactly and raises :class:`TokenizationError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from burstsched.framework import ApiKind
from burstsched.tokenization.errors import TokenizationError


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """The parts of a chat request that decide its prompt."""

    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[Any] | None = None
    documents: Sequence[Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    template_kwargs: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class CompletionPrompt:
    """The prompt of a completions request: text to encode, or token ids as given."""

    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    add_special_tokens: bool = True


Prompt = ChatPrompt | CompletionPrompt


def parse_prompt(api: ApiKind, payload: Mapping[str, Any]) -> Prompt:
    """The prompt of ``payload`` sent to ``api``; raises :class:`TokenizationError` when it is not exact."""
    for name in ("chat_template", "truncate_prompt_tokens", "prompt_embeds"):
        if payload.get(name) is not None:
            raise TokenizationError(f"requests with {name} are not tokenized by the router")
    if api is ApiKind.CHAT:
        return _chat(payload)
    return _completion(payload)


def prompt_key(prompt: Prompt) -> tuple[bytes, int]:
    """A 128-bit digest of everything that decides the prompt's ids, and the size of what was hashed."""
    if isinstance(prompt, ChatPrompt):
        fields: list[Any] = [
            "chat",
            prompt.messages,
            prompt.tools,
            prompt.documents,
            prompt.add_generation_prompt,
            prompt.continue_final_message,
            prompt.add_special_tokens,
            prompt.template_kwargs,
        ]
    else:
        fields = ["completions", prompt.text, prompt.token_ids, prompt.add_special_tokens]
    try:
        data = json.dumps(fields, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise TokenizationError(f"request body is not plain JSON: {exc}") from exc
    return xxhash.xxh3_128_digest(data), len(data)


def _chat(payload: Mapping[str, Any]) -> ChatPrompt:
    messages = payload.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
        raise TokenizationError("messages must be a list of objects")
    tools = _optional(payload, "tools", list)
    documents = _optional(payload, "documents", list)
    kwargs = dict(_optional(payload, "chat_template_kwargs", dict) or {})
    effort = payload.get("reasoning_effort")
    if effort is not None:
        kwargs["reasoning_effort"] = effort
        if "enable_thinking" not in (payload.get("chat_template_kwargs") or {}):
            kwargs["enable_thinking"] = effort != "none"
    return ChatPrompt(
        messages=messages,
        tools=tools,
        documents=documents,
        add_generation_prompt=_flag(payload, "add_generation_prompt", True),
        continue_final_message=_flag(payload, "continue_final_message", False),
        add_special_tokens=_flag(payload, "add_special_tokens", False),
        template_kwargs=kwargs or None,
    )


def _completion(payload: Mapping[str, Any]) -> CompletionPrompt:
    add_special_tokens = _flag(payload, "add_special_tokens", True)
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch: the first prompt
    if isinstance(prompt, str):
        return CompletionPrompt(text=prompt, add_special_tokens=add_special_tokens)
    if isinstance(prompt, list) and prompt and all(_is_token_id(t) for t in prompt):
        return CompletionPrompt(token_ids=tuple(prompt), add_special_tokens=add_special_tokens)
    raise TokenizationError("prompt must be a string, token ids, or a non-empty list of either")


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _flag(payload: Mapping[str, Any], name: str, default: bool) -> bool:
    value = payload.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise TokenizationError(f"{name} must be a boolean")
    return value


def _optional(payload: Mapping[str, Any], name: str, kind: type[list[Any]] | type[dict[str, Any]]) -> Any:
    value = payload.get(name)
    if value is not None and not isinstance(value, kind):
        raise TokenizationError(f"{name} must be a {'list' if kind is list else 'JSON object'}")
    return value
