"""The router's prompt token ids equal real vLLM's, prompt for prompt (precise prefix mode's premise).

One real replica runs with ``--trust-request-chat-template``, so besides the model's own ChatML template
three more templates are tried through the request's ``chat_template`` (tools in Qwen2.5's style; content
read as parts with special tokens, documents and a thinking switch; a guarded one with ``raise_exception``,
``{% generation %}``, ``strftime_now`` and a custom kwarg). The local tokenizer gets the same template from a
copy of the tokenizer folder. For every case the reference is the serving path itself
(``return_token_ids``: the ids the engine ran, and ``usage.prompt_tokens``); ``POST /tokenize`` with the
request's own fields must agree, the local tokenizer must agree, and for the model's template the remote
tokenizer too. Cases vLLM refuses (HTTP 400) must make the router raise instead.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from burstsched.dispatch import UpstreamClient, poster
from burstsched.framework import ApiKind
from burstsched.testing.backends import SERVED_MODEL_NAME, vllm_config
from burstsched.testing.vllm_replica import VllmPool
from burstsched.tokenization import (
    LocalPromptTokenizer,
    RemotePromptTokenizer,
    TokenizationError,
    parse_prompt,
)
from burstsched.workloads.contexts import context_text

pytestmark = [pytest.mark.real_vllm, pytest.mark.anyio, pytest.mark.timeout(900)]

CHAT, COMPLETIONS = ApiKind.CHAT, ApiKind.COMPLETIONS

TOOLS_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nFunction signatures are within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nReturn a json object within <tool_call></tool_call> XML tags.<|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or
          (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

PARTS_TEMPLATE = """\
{%- for message in messages -%}
<|im_start|>{{ message['role'] }}{% if message.name is defined %} ({{ message.name }}){% endif %}
{% if message['content'] is string -%}
{{ message['content'] }}
{%- else -%}
{%- for part in message['content'] -%}
{%- if part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}
{%- if part['cache_control'] is defined %} [cached]{% endif -%}
{%- if not loop.last %} | {% endif -%}
{%- endfor -%}
{%- endif -%}
{{ eos_token }}
{% endfor -%}
{%- if documents -%}
<|im_start|>documents
{% for doc in documents %}[{{ loop.index }}] {{ doc['title'] }}: {{ doc['text'] }}
{% endfor %}{{ eos_token }}
{% endif -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>
{% endif -%}
{%- endif -%}
"""

GUARDED_TEMPLATE = """\
{%- if messages[0]['role'] == 'assistant' -%}
{{ raise_exception('the conversation must not start with the assistant') }}
{%- endif -%}
<|im_start|>system
Year {{ strftime_now('%Y') }}.{% if persona %} Speak as a {{ persona }}.{% endif %}<|im_end|>
{% for message in messages -%}
<|im_start|>{{ message.role }}
{% if message.role == 'assistant' %}{% generation %}{{ message.content }}{% endgeneration %}\
{% else %}{{ message.content }}{% endif %}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}
"""

TEMPLATES = {"tools": TOOLS_TEMPLATE, "parts": PARTS_TEMPLATE, "guarded": GUARDED_TEMPLATE}


@dataclass(frozen=True)
class Case:
    """One request: ``template`` is "default" (the model's) or a key of TEMPLATES."""

    name: str
    api: ApiKind
    payload: dict[str, Any]
    template: str = "default"
    refused: bool = False
    extra_fields: bool = False  # fields /tokenize does not take (documents, reasoning_effort)


@dataclass
class Outcome:
    compared: int = 0
    refused_agreed: int = 0
    remote_compared: int = 0
    serving_checked: int = 0
    mismatches: list[str] = field(default_factory=list)


def _sendable(body: dict[str, Any]) -> dict[str, Any]:
    """Tools need tool_choice "none" on a replica without a tool parser (the prompt is the same)."""
    return {**body, "tool_choice": "none"} if "tools" in body else body


def _user(text: Any) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _msgs(*pairs: tuple[str, Any]) -> list[dict[str, Any]]:
    return [{"role": role, "content": content} for role, content in pairs]


def _long(n_lines: int, seed: int) -> str:
    return context_text(f"tok-{seed}", n_lines, seed)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
BARE_TOOL = {"type": "function", "function": {"name": "ping", "unknown_key": 1}}
STRICT_TOOL = {
    "type": "function",
    "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}, "strict": True},
}
TOOL_CALL_TURNS: list[dict[str, Any]] = [
    _user("Weather in Zürich?"),
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"unit": "c", "city": "Zürich"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
]


def default_template_cases() -> list[Case]:
    """Chat and completions on the model's own ChatML template."""
    doc = _long(80, 1)
    chat: list[tuple[str, dict[str, Any]]] = [
        ("plain", {"messages": [_user("Hello there, how are you?")]}),
        ("system", {"messages": _msgs(("system", "Be brief."), ("user", "Summarise the incident."))}),
        (
            "multi-turn",
            {
                "messages": _msgs(
                    ("system", "You are an SRE."),
                    ("user", "Why did p99 rise?"),
                    ("assistant", "A GC pause during the batch."),
                    ("user", "And the error rate?"),
                    ("assistant", "It stayed flat."),
                    ("user", "Thanks. Anything else?"),
                )
            },
        ),
        ("no generation prompt", {"messages": [_user("hi")], "add_generation_prompt": False}),
        ("add_special_tokens", {"messages": [_user("hi")], "add_special_tokens": True}),
        ("non-ascii latin", {"messages": [_user("Grüße aus Köln, ça va? Ångström, naïve café, Øresund.")]}),
        ("cjk", {"messages": [_user("缓存命中率下降了。キャッシュのヒット率。캐시 적중률이 떨어졌다.")]}),
        ("rtl and indic", {"messages": [_user("معدل الإصابة في ذاكرة التخزين المؤقت. कैश हिट दर गिर गई।")]}),
        ("cyrillic greek", {"messages": [_user("Задержка выросла. Η καθυστέρηση αυξήθηκε.")]}),
        ("emoji", {"messages": [_user("Deploy done 🚀🔥 👍🏽 🇨🇭 👨‍👩‍👧‍👦 ❤️")]}),
        ("combining marks (NFC)", {"messages": [_user("Cafe\u0301 and n\u0303 and A\u030a")]}),
        ("empty content", {"messages": [_user("")]}),
        (
            "null assistant content",
            {"messages": [_user("a"), {"role": "assistant", "content": None}, _user("b")]},
        ),
        ("whitespace", {"messages": [_user("  leading\n\n\ttabs\r\nCRLF  trailing   \n")]}),
        ("only newlines", {"messages": [_user("\n\n\n")]}),
        ("code block", {"messages": [_user("```python\ndef f(x):\n    return x * 2  # doubled\n```")]}),
        ("json text", {"messages": [_user('{"a": [1, 2, {"b": null}], "c": "d\\"e"}')]}),
        ("special-token text in content", {"messages": [_user("fake <|im_end|>\n<|im_start|>system\nboo")]}),
        ("endoftext text", {"messages": [_user("before <|endoftext|> after")]}),
        ("digits", {"messages": [_user("3.14159 2026-11-30 1,234,567 0x1F 1e-9")]}),
        ("one long word", {"messages": [_user("a" * 3000)]}),
        (
            "parts joined",
            {"messages": [_user([{"type": "text", "text": "first"}, {"type": "text", "text": "second"}])]},
        ),
        ("parts single", {"messages": [_user([{"type": "text", "text": "only part"}])]}),
        ("parts empty list", {"messages": [_user([])]}),
        (
            "assistant refusal part",
            {
                "messages": [
                    _user([{"type": "text", "text": "in"}]),
                    {
                        "role": "assistant",
                        "content": [{"type": "text", "text": "x"}, {"type": "refusal", "refusal": "no"}],
                    },
                    _user("ok"),
                ]
            },
        ),
        (
            "system parts",
            {
                "messages": [
                    {"role": "system", "content": [{"type": "text", "text": "sys a"}, "sys b"]},
                    _user("q"),
                ]
            },
        ),
        (
            "prefill continue",
            {
                "messages": [_user("Finish the sentence."), {"role": "assistant", "content": "The cache is"}],
                "add_generation_prompt": False,
                "continue_final_message": True,
            },
        ),
        (
            "prefill trailing space",
            {
                "messages": [_user("Go on."), {"role": "assistant", "content": "Sure, here "}],
                "add_generation_prompt": False,
                "continue_final_message": True,
            },
        ),
        (
            "prefill user message",
            {
                "messages": [_user("Complete: the queue")],
                "add_generation_prompt": False,
                "continue_final_message": True,
            },
        ),
        (
            "prefill parts",
            {
                "messages": [
                    _user("x"),
                    {
                        "role": "assistant",
                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b c"}],
                    },
                ],
                "add_generation_prompt": False,
                "continue_final_message": True,
            },
        ),
        ("tools ignored by template", {"messages": [_user("weather?")], "tools": [WEATHER_TOOL]}),
        ("tool call turns", {"messages": TOOL_CALL_TURNS, "tools": [WEATHER_TOOL]}),
        ("named user", {"messages": [{"role": "user", "content": "hi", "name": "bob"}]}),
        ("developer as system", {"messages": _msgs(("developer", "Answer in French."), ("user", "Hello"))}),
        (
            "developer and system merged",
            {"messages": _msgs(("system", "S1"), ("user", "u1"), ("developer", "D1"), ("user", "u2"))},
        ),
        (
            "billing header stripped",
            {"messages": _msgs(("system", "x-anthropic-billing-header: cch=1\nReal"), ("user", "q"))},
        ),
        (
            "reasoning field",
            {"messages": [_user("a"), {"role": "assistant", "content": "b", "reasoning": "r"}, _user("c")]},
        ),
        ("custom role", {"messages": _msgs(("critic", "Too long."), ("user", "Shorten it."))}),
        (
            "kwargs unused",
            {"messages": [_user("k")], "chat_template_kwargs": {"foo": "bar", "enable_thinking": False}},
        ),
        (
            "long document",
            {"messages": _msgs(("system", "Answer from the log."), ("user", doc + "\nWhat rose first?"))},
        ),
        (
            "long multi-turn",
            {
                "messages": _msgs(
                    ("user", doc),
                    ("assistant", "Noted."),
                    ("user", _long(30, 2)),
                    ("assistant", "Also noted."),
                    ("user", "Compare them."),
                )
            },
        ),
        ("mixed long unicode", {"messages": [_user(("Grüße 🚀 缓存 " * 300).strip())]}),
    ]
    completions: list[tuple[str, dict[str, Any]]] = [
        ("string", {"prompt": "The replica cache held 42 blocks after the 3rd burst."}),
        ("string no special tokens", {"prompt": "The queue drained.", "add_special_tokens": False}),
        ("list of strings", {"prompt": ["First prompt of the batch.", "Second one."]}),
        ("list of one string", {"prompt": ["Only one."]}),
        ("token ids", {"prompt": [100, 200, 300, 400, 5, 6, 7]}),
        ("list of token-id lists", {"prompt": [[11, 12, 13], [14, 15]]}),
        ("special-token text", {"prompt": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"}),
        ("endoftext text", {"prompt": "a<|endoftext|>b"}),
        ("partial special token", {"prompt": "<|im_sta and |> and <| im_end |>"}),
        ("leading space", {"prompt": " leading space"}),
        ("whitespace only", {"prompt": "   \n\t "}),
        ("non-ascii", {"prompt": "Über die Brücke: 缓存 🚀 naïve"}),
        ("emoji sequences", {"prompt": "👨‍👩‍👧‍👦🏳️‍🌈🇨🇭"}),
        ("combining", {"prompt": "e\u0301e\u0301 A\u030a"}),
        ("long document", {"prompt": _long(90, 3)}),
        ("long unicode", {"prompt": "Ünïcödé 🚀 text, " * 400}),
        ("crlf", {"prompt": "line1\r\nline2\rline3\n"}),
        ("numbers", {"prompt": "12345678901234567890 3.5e10 -0.001"}),
    ]
    out = [Case(f"chat/{name}", CHAT, _sendable(body)) for name, body in chat]
    out += [Case(f"completions/{name}", COMPLETIONS, body) for name, body in completions]
    out += [
        Case(
            "chat/both generation prompt and continue (refused)",
            CHAT,
            {"messages": [_user("a"), {"role": "assistant", "content": "b"}], "continue_final_message": True},
            refused=True,
        ),
        Case("chat/empty conversation (refused)", CHAT, {"messages": []}, refused=True),
    ]
    return out


def other_template_cases() -> list[Case]:
    """Cases that need a template other than plain ChatML (sent as the request's chat_template)."""
    tools: list[tuple[str, dict[str, Any]]] = [
        (
            "tools with system",
            {"messages": _msgs(("system", "Use tools."), ("user", "Weather?")), "tools": [WEATHER_TOOL]},
        ),
        (
            "tools without system",
            {"messages": [_user("Weather in Paris?")], "tools": [WEATHER_TOOL, STRICT_TOOL]},
        ),
        ("tool without description", {"messages": [_user("ping it")], "tools": [BARE_TOOL]}),
        ("tool call round trip", {"messages": TOOL_CALL_TURNS, "tools": [WEATHER_TOOL]}),
        (
            "two calls and responses",
            {
                "messages": [
                    _user("Compare Rome and Oslo."),
                    {
                        "role": "assistant",
                        "content": "Checking both.",
                        "tool_calls": [
                            {
                                "id": "a",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                            },
                            {
                                "id": "b",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                            },
                        ],
                    },
                    {"role": "tool", "tool_call_id": "a", "content": "sunny"},
                    {
                        "role": "tool",
                        "tool_call_id": "b",
                        "content": [{"type": "text", "text": "snow"}, {"type": "text", "text": "-3"}],
                    },
                    _user("So?"),
                ],
                "tools": [WEATHER_TOOL],
            },
        ),
        (
            "bad and empty arguments",
            {
                "messages": [
                    _user("x"),
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": "{not json"},
                            },
                            {
                                "id": "d",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": ""},
                            },
                            {
                                "id": "e",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": "[1, 2]"},
                            },
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c", "content": "?"},
                ],
                "tools": [WEATHER_TOOL],
            },
        ),
        (
            "empty tool_calls list",
            {"messages": [_user("a"), {"role": "assistant", "content": "b", "tool_calls": []}, _user("c")]},
        ),
        ("no tools", {"messages": _msgs(("user", "Just chat."), ("assistant", "Sure."), ("user", "Good."))}),
        ("tools non-ascii", {"messages": [_user("Wetter in Zürich? 🌦")], "tools": [WEATHER_TOOL]}),
    ]
    parts: list[tuple[str, dict[str, Any]]] = [
        ("string content as parts", {"messages": _msgs(("system", "S"), ("user", "U"))}),
        (
            "several parts",
            {"messages": [_user([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}, "c"])]},
        ),
        (
            "part extras kept",
            {"messages": [_user([{"type": "text", "text": "doc", "cache_control": {"type": "ephemeral"}}])]},
        ),
        ("named", {"messages": [{"role": "user", "content": "hi", "name": "ann"}]}),
        (
            "documents",
            {
                "messages": [_user("Which doc?")],
                "documents": [{"title": "A", "text": "alpha"}, {"title": "B", "text": "beta"}],
            },
        ),
        ("reasoning effort none", {"messages": [_user("Quick.")], "reasoning_effort": "none"}),
        ("reasoning effort high", {"messages": [_user("Think.")], "reasoning_effort": "high"}),
        (
            "enable_thinking kwarg",
            {"messages": [_user("No thinking.")], "chat_template_kwargs": {"enable_thinking": False}},
        ),
        ("developer merged", {"messages": _msgs(("developer", "D"), ("system", "S"), ("user", "U"))}),
        (
            "prefill last part",
            {
                "messages": [
                    _user("x"),
                    {
                        "role": "assistant",
                        "content": [{"type": "text", "text": "p1"}, {"type": "text", "text": "p2"}],
                    },
                ],
                "add_generation_prompt": False,
                "continue_final_message": True,
            },
        ),
        (
            "emoji parts",
            {"messages": [_user([{"type": "text", "text": "🚀"}, {"type": "text", "text": "Grüße"}])]},
        ),
        (
            "long parts",
            {
                "messages": [
                    _user([{"type": "text", "text": _long(40, 4)}, {"type": "text", "text": "Summarise."}])
                ]
            },
        ),
    ]
    guarded: list[tuple[str, dict[str, Any]]] = [
        ("kwarg persona", {"messages": [_user("Hello")], "chat_template_kwargs": {"persona": "pirate"}}),
        ("kwarg auto dropped", {"messages": [_user("Hello")], "chat_template_kwargs": {"persona": "auto"}}),
        ("kwarg null dropped", {"messages": [_user("Hello")], "chat_template_kwargs": {"persona": None}}),
        ("generation tag", {"messages": _msgs(("user", "a"), ("assistant", "b"), ("user", "c"))}),
        (
            "prefill with generation tag",
            {
                "messages": _msgs(("user", "a"), ("assistant", "The answer")),
                "add_generation_prompt": False,
                "continue_final_message": True,
            },
        ),
    ]
    out = [Case(f"tools/{n}", CHAT, _sendable(b), template="tools") for n, b in tools]
    out += [
        Case(
            f"parts/{n}", CHAT, b, template="parts", extra_fields="documents" in b or "reasoning_effort" in b
        )
        for n, b in parts
    ]
    out += [Case(f"guarded/{n}", CHAT, b, template="guarded") for n, b in guarded]
    out.append(
        Case(
            "guarded/raise_exception (refused)",
            CHAT,
            {"messages": _msgs(("assistant", "I start."), ("user", "no"))},
            template="guarded",
            refused=True,
        )
    )
    return out


# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def replica_url(tiny_model_dir: Path) -> Iterator[str]:
    """A real replica that accepts a request's own chat template (core 1: the shared replica uses core 0)."""
    config = replace(
        vllm_config(tiny_model_dir, kv_events=False), extra_args=("--trust-request-chat-template",)
    )
    with VllmPool(1, config, cores=[1]) as pool:
        yield pool.urls[0]


@pytest.fixture(scope="module")
def local_tokenizers(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, LocalPromptTokenizer]:
    """The model's folder, and a copy per other template (tokenizer_config.json's chat_template replaced)."""
    out = {"default": LocalPromptTokenizer(tiny_model_dir)}
    config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    for name, source in TEMPLATES.items():
        folder = tmp_path_factory.mktemp(f"tok-{name}")
        shutil.copy(tiny_model_dir / "tokenizer.json", folder / "tokenizer.json")
        (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": source}))
        out[name] = LocalPromptTokenizer(folder)
    return out


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=120, trust_env=False) as http:
        yield http


@pytest.fixture
async def upstream() -> AsyncIterator[UpstreamClient]:
    """The router's own upstream client, for the remote tokenizer."""
    async with UpstreamClient(trust_env=False) as client:
        yield client


def _tokenize_body(case: Case) -> dict[str, Any]:
    """The /tokenize body made of the request's own fields (independent of the router's mapping)."""
    body: dict[str, Any] = {"model": SERVED_MODEL_NAME}
    if case.api is COMPLETIONS:
        prompt = case.payload["prompt"]
        body["prompt"] = prompt[0] if isinstance(prompt, list) and isinstance(prompt[0], str) else prompt
        if "add_special_tokens" in case.payload:
            body["add_special_tokens"] = case.payload["add_special_tokens"]
        return body
    keys = ("messages", "tools", "add_generation_prompt", "continue_final_message", "add_special_tokens")
    body.update({k: case.payload[k] for k in (*keys, "chat_template_kwargs") if k in case.payload})
    if case.template != "default":
        body["chat_template"] = TEMPLATES[case.template]
    return body


def _serving_body(case: Case) -> dict[str, Any]:
    body = {
        "model": SERVED_MODEL_NAME,
        **case.payload,
        "max_tokens": 1,
        "temperature": 0,
        "return_token_ids": True,
    }
    if case.template != "default":
        body["chat_template"] = TEMPLATES[case.template]
    return body


@dataclass(frozen=True)
class Served:
    """The serving path's answer: status, the prompt ids the engine ran, usage.prompt_tokens (one prompt)."""

    status: int
    ids: list[int]
    usage: int | None = None
    error: str = ""


async def _serving_ids(client: httpx.AsyncClient, url: str, case: Case) -> Served:
    response = await client.post(f"{url}{case.api.path}", json=_serving_body(case))
    if response.status_code != 200:
        return Served(response.status_code, [], error=response.text[:300])
    data = response.json()
    ids = data["prompt_token_ids"] if case.api is CHAT else data["choices"][0]["prompt_token_ids"]
    prompt = case.payload.get("prompt")
    batch = isinstance(prompt, list) and len(prompt) > 1 and isinstance(prompt[0], str | list)
    return Served(200, [int(t) for t in ids], None if batch else data["usage"]["prompt_tokens"])


async def _router_ids(tokenizer: Any, case: Case) -> tuple[int, ...] | str:
    try:
        ids: tuple[int, ...] = await tokenizer.prompt_token_ids(case.api, case.payload)
    except TokenizationError as exc:
        return f"TokenizationError: {exc}"
    return ids


async def _check(
    client: httpx.AsyncClient,
    url: str,
    case: Case,
    local: LocalPromptTokenizer,
    remote: RemotePromptTokenizer | None,
    outcome: Outcome,
) -> None:
    served = await _serving_ids(client, url, case)
    status, serving, usage = served.status, served.ids, served.usage
    local_ids = await _router_ids(local, case)
    remote_ids = await _router_ids(remote, case) if remote is not None else None
    if case.refused:
        if (
            status == 200
            or not isinstance(local_ids, str)
            or (remote is not None and not isinstance(remote_ids, str))
        ):
            outcome.mismatches.append(
                f"{case.name}: expected a refusal; vLLM {status}, local {local_ids!r:.80}"
            )
        else:
            outcome.refused_agreed += 1
        return
    if status != 200:
        outcome.mismatches.append(f"{case.name}: vLLM answered {status}: {served.error}")
        return
    outcome.compared += 1
    if usage is not None:
        outcome.serving_checked += 1
        if usage != len(serving):
            outcome.mismatches.append(f"{case.name}: usage.prompt_tokens {usage} != {len(serving)} ids")
    if not case.extra_fields and not _is_token_ids(case):
        response = await client.post(f"{url}/tokenize", json=_tokenize_body(case))
        tokenized = response.json().get("tokens") if response.status_code == 200 else response.text
        if tokenized != serving:
            outcome.mismatches.append(
                f"{case.name}: /tokenize disagrees with the serving path: {tokenized!r:.120}"
            )
    if local_ids != tuple(serving):
        outcome.mismatches.append(f"{case.name}: local {_diff(local_ids, serving)}")
    if remote is not None:
        outcome.remote_compared += 1
        if remote_ids != tuple(serving):
            outcome.mismatches.append(f"{case.name}: remote {_diff(remote_ids, serving)}")


def _is_token_ids(case: Case) -> bool:
    prompt = case.payload.get("prompt")
    return isinstance(prompt, list) and not isinstance(prompt[0], str)


def _diff(ours: tuple[int, ...] | str | None, theirs: list[int]) -> str:
    if not isinstance(ours, tuple):
        return f"{ours!r:.200}"
    at = next(
        (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs))
    )
    head = f"differs at {at} (ours {len(ours)} ids, vLLM {len(theirs)})"
    return f"{head}: {list(ours[at : at + 8])} vs {theirs[at : at + 8]}"


async def test_router_token_ids_equal_vllm(
    replica_url: str,
    local_tokenizers: dict[str, LocalPromptTokenizer],
    client: httpx.AsyncClient,
    upstream: UpstreamClient,
) -> None:
    remote = RemotePromptTokenizer(poster(upstream), lambda: replica_url, timeout_s=60.0)
    outcome = Outcome()
    cases = default_template_cases() + other_template_cases()
    for case in cases:
        is_default = case.template == "default"
        await _check(
            client,
            replica_url,
            case,
            local_tokenizers[case.template],
            remote if is_default else None,
            outcome,
        )
    print(
        f"\nrouter tokenizer vs vLLM: {len(cases)} cases, {outcome.compared} compared with the serving path "
        f"({outcome.serving_checked} usage counts), {outcome.remote_compared} also through the remote one, "
        f"{outcome.refused_agreed} refused by both; {len(outcome.mismatches)} mismatches"
    )
    assert outcome.compared >= 60
    assert not outcome.mismatches, "\n".join(outcome.mismatches)


async def test_cost_per_call_local_vs_remote(
    replica_url: str, local_tokenizers: dict[str, LocalPromptTokenizer], upstream: UpstreamClient
) -> None:
    """Uncached cost of one prompt, local (render + encode) against remote (a /tokenize round trip)."""
    local = local_tokenizers["default"]
    remote = RemotePromptTokenizer(poster(upstream), lambda: replica_url, cache_entries=0, timeout_s=60.0)
    report = []
    for label, lines in (("short", 1), ("~5000 tokens", 83)):
        payload = {"messages": [_user(_long(lines, 7))]}
        prompt = parse_prompt(CHAT, payload)
        local_s, remote_s = [], []
        for _ in range(20):
            started = time.perf_counter()
            ids = local.encode_prompt(prompt)
            local_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            remote_ids = await remote.prompt_token_ids(CHAT, payload)
            remote_s.append(time.perf_counter() - started)
        assert ids == remote_ids
        report.append(
            f"{label} ({len(ids)} ids): local median {statistics.median(local_s) * 1e3:.2f} ms, "
            f"remote median {statistics.median(remote_s) * 1e3:.2f} ms"
        )
    print("\n" + "\n".join(report))
