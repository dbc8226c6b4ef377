"""Reading a request body's prompt with vLLM's defaults, and the cache key over exactly what decides it."""

from __future__ import annotations

from typing import Any

import pytest

from burstsched.framework import ApiKind
from burstsched.tokenization import ChatPrompt, CompletionPrompt, TokenizationError, parse_prompt, prompt_key

CHAT, COMPLETIONS = ApiKind.CHAT, ApiKind.COMPLETIONS
MESSAGES = [{"role": "user", "content": "hi"}]


def test_chat_defaults_and_reasoning_effort() -> None:
    assert parse_prompt(CHAT, {"model": "m", "messages": MESSAGES, "max_tokens": 3}) == ChatPrompt(MESSAGES)
    prompt = parse_prompt(CHAT, {"messages": MESSAGES, "reasoning_effort": "none"})
    assert isinstance(prompt, ChatPrompt)
    assert prompt.template_kwargs == {"reasoning_effort": "none", "enable_thinking": False}
    kept = parse_prompt(
        CHAT,
        {
            "messages": MESSAGES,
            "reasoning_effort": "high",
            "chat_template_kwargs": {"enable_thinking": False},
        },
    )
    assert isinstance(kept, ChatPrompt)
    assert kept.template_kwargs == {"enable_thinking": False, "reasoning_effort": "high"}


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("text", CompletionPrompt(text="text")),
        (["first", "second"], CompletionPrompt(text="first")),
        ([5, 6, 7], CompletionPrompt(token_ids=(5, 6, 7))),
        ([[1, 2], [3]], CompletionPrompt(token_ids=(1, 2))),
    ],
)
def test_completion_prompt_forms(prompt: Any, expected: CompletionPrompt) -> None:
    assert parse_prompt(COMPLETIONS, {"prompt": prompt}) == expected
    off = parse_prompt(COMPLETIONS, {"prompt": prompt, "add_special_tokens": False})
    assert isinstance(off, CompletionPrompt) and not off.add_special_tokens


@pytest.mark.parametrize(
    ("api", "body", "why"),
    [
        (CHAT, {"messages": MESSAGES, "chat_template": "{{ x }}"}, "chat_template"),
        (COMPLETIONS, {"prompt": "x", "truncate_prompt_tokens": 5}, "truncate_prompt_tokens"),
        (COMPLETIONS, {"prompt_embeds": "AAAA"}, "prompt_embeds"),
        (CHAT, {"messages": "hi"}, "messages"),
        (CHAT, {"messages": MESSAGES, "tools": {"a": 1}}, "tools"),
        (CHAT, {"messages": MESSAGES, "add_generation_prompt": "yes"}, "boolean"),
        (COMPLETIONS, {"prompt": []}, "prompt"),
        (COMPLETIONS, {"prompt": [1, True]}, "prompt"),
        (COMPLETIONS, {"prompt": [1, -2]}, "prompt"),
        (COMPLETIONS, {}, "prompt"),
    ],
)
def test_what_cannot_be_exact_is_refused(api: ApiKind, body: dict[str, Any], why: str) -> None:
    with pytest.raises(TokenizationError, match=why):
        parse_prompt(api, body)


def test_key_covers_what_decides_the_ids_and_nothing_else() -> None:
    base = {"messages": MESSAGES, "model": "m"}
    key, size = prompt_key(parse_prompt(CHAT, base))
    assert len(key) == 16 and size > 0
    assert prompt_key(parse_prompt(CHAT, {**base, "max_tokens": 9, "stream": True, "model": "n"}))[0] == key
    variants: list[dict[str, Any]] = [
        {"messages": [{"role": "user", "content": "hi!"}]},
        {"tools": []},
        {"documents": []},
        {"add_generation_prompt": False},
        {"add_special_tokens": True},
        {"chat_template_kwargs": {"x": 1}},
        {"reasoning_effort": "low"},
    ]
    keys = {prompt_key(parse_prompt(CHAT, {**base, **v}))[0] for v in variants}
    assert key not in keys and len(keys) == len(variants)
    text = prompt_key(parse_prompt(COMPLETIONS, {"prompt": "hi"}))[0]
    assert text != prompt_key(parse_prompt(COMPLETIONS, {"prompt": "hi", "add_special_tokens": False}))[0]
    assert text != key
