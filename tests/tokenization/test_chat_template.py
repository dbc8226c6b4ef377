"""The chat renderer's vLLM behaviours, each pinned on a small template (real vLLM agreement is checked in
tests/real_vllm/test_router_tokenizer.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from burstsched.tokenization import (
    ChatTemplate,
    TemplateError,
    TokenizationError,
    detect_content_format,
    normalize_tools,
)

PARTS = (
    "{% for m in messages %}[{{ m.role }}]"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}<{{ p.text }}>{% endfor %}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}[gen]{% endif %}"
)
DUMP = "{{ messages | tojson }}|{{ tools | tojson }}"


def _user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def test_chatml_default_with_and_without_generation_prompt() -> None:
    template = ChatTemplate(None)
    messages = [{"role": "system", "content": "be brief"}, _user("hi")]
    text = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    assert template.render(messages) == text + "<|im_start|>assistant\n"
    assert template.render(messages, add_generation_prompt=False) == text
    assert template.content_format == "string"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{% for m in messages %}{{ m.content }}{% endfor %}", "string"),
        ("{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}", "openai"),
        ("{% for m in messages %}{% for p in m.content | reverse %}{% endfor %}{% endfor %}", "openai"),
        (
            "{% set msgs = messages %}{% for m in msgs %}{% for p in m.content %}{% endfor %}{% endfor %}",
            "openai",
        ),
        (
            "{% macro show(c) %}{% for p in c %}{{ p.text }}{% endfor %}{% endmacro %}"
            "{% for m in messages %}{{ show(m.content) }}{% endfor %}",
            "openai",
        ),
        ("{% for content in x %}{% endfor %}{% for m in messages %}{% endfor %}", "string"),
        ("{% for p in content %}{% endfor %}", "openai"),
        ("{% for m in messages %}{{ m.content ", "string"),  # does not parse: vLLM's default
    ],
)
def test_content_format_is_detected_as_vllm_does(source: str, expected: str) -> None:
    assert detect_content_format(ImmutableSandboxedEnvironment(), source) == expected


def test_parts_are_joined_by_newlines_or_kept_as_parts_depending_on_the_template() -> None:
    parts = [
        {"type": "text", "text": "a"},
        "b",
        {"type": "refusal", "refusal": "c"},
        {"type": "text", "text": None},
    ]
    messages = [_user(parts), _user("d"), {"role": "assistant", "content": None}]
    assert (
        ChatTemplate("{% for m in messages %}({{ m.content }}){% endfor %}").render(messages)
        == "(a\nb\nc)(d)()"
    )
    assert ChatTemplate(PARTS).render(messages) == "[user]<a><b><c>[user]<d>[assistant][gen]"


def test_messages_are_rebuilt_as_vllm_rebuilds_them() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "q", "name": "ann", "extra": 1},
        {
            "role": "assistant",
            "content": "",
            "reasoning": "r",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"b": 1, "a": [2]}'},
                    "id": "c1",
                },
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "not json"}},
                {"id": "c3", "function": {"arguments": "", "name": "h"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok", "name": "f"},
        {"role": "assistant", "content": "done", "tool_calls": []},
    ]
    text = ChatTemplate(DUMP).render(messages, tools=None)
    assert text == (
        '[{"role": "user", "content": "q", "name": "ann"}, '
        '{"role": "assistant", "content": "", "tool_calls": ['
        '{"id": "c1", "function": {"arguments": {"b": 1, "a": [2]}, "name": "f"}, "type": "function"}, '
        '{"id": "c2", "function": {"arguments": {}, "name": "g"}, "type": "function"}, '
        '{"id": "c3", "function": {"arguments": {}, "name": "h"}}], '
        '"reasoning": "r", "reasoning_content": "r"}, '
        '{"role": "tool", "content": "ok", "tool_call_id": "c1", "name": "f"}, '
        '{"role": "assistant", "content": "done"}]|null'
    )
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == '{"b": 1, "a": [2]}'  # not modified


def test_tools_are_dumped_like_vllms_pydantic_model_and_tojson_keeps_non_ascii() -> None:
    tools = [
        {"type": "function", "function": {"name": "ping", "zz": 1}},
        {
            "function": {"name": "wetter", "description": "Wetter für Zürich", "strict": True},
            "defer_loading": True,
        },
    ]
    assert normalize_tools(tools) == [
        {"type": "function", "function": {"name": "ping", "description": None, "parameters": None}},
        {
            "type": "function",
            "function": {
                "name": "wetter",
                "description": "Wetter für Zürich",
                "parameters": None,
                "strict": True,
                "defer_loading": True,
            },
            "defer_loading": True,
        },
    ]
    text = ChatTemplate(DUMP).render([_user("x")], tools=tools[1:])
    assert '"description": "Wetter für Zürich"' in text
    with pytest.raises(TemplateError, match="function"):
        normalize_tools([{"type": "custom"}])


def test_kwargs_merge_as_vllm_merges_them() -> None:
    template = ChatTemplate(
        "{{ add_generation_prompt }}|{{ persona | default('none') }}|{{ eos_token }}|"
        "{{ documents | tojson }}",
        {"eos_token": "<e>"},
    )
    msgs = [_user("x")]
    assert template.render(msgs, extra={"persona": "pirate"}) == "True|pirate|<e>|null"
    # None and "auto" are unset; the request's own fields win over chat_template_kwargs; kwargs may replace
    # a special token, as in transformers.
    assert template.render(msgs, extra={"persona": "auto"}) == "True|none|<e>|null"
    assert (
        template.render(msgs, extra={"persona": None, "add_generation_prompt": False}) == "True|none|<e>|null"
    )
    assert template.render(msgs, extra={"eos_token": "E"}, add_generation_prompt=False) == "False|none|E|null"
    assert template.render(msgs, documents=[{"title": "t"}]) == 'True|none|<e>|[{"title": "t"}]'
    assert template.render(msgs, extra={"documents": [1]}) == "True|none|<e>|[1]"
    with pytest.raises(TemplateError, match="chat_template"):
        template.render(msgs, extra={"chat_template": "x"})


def test_continue_final_message_cuts_after_the_final_content() -> None:
    template = ChatTemplate(None)
    messages = [_user("q"), {"role": "assistant", "content": "The answer is "}]
    text = template.render(messages, add_generation_prompt=False, continue_final_message=True)
    assert text == "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\nThe answer is "
    stripping = ChatTemplate("{% for m in messages %}{{ m.content | trim }}|{% endfor %}")
    assert (
        stripping.render(messages, add_generation_prompt=False, continue_final_message=True)
        == "q|The answer is"
    )
    parts = ChatTemplate(PARTS).render(
        [_user([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])],
        add_generation_prompt=False,
        continue_final_message=True,
    )
    assert parts == "[user]<a><b"
    with pytest.raises(TemplateError, match="Cannot set both"):
        template.render(messages, continue_final_message=True)
    with pytest.raises(TemplateError, match="does not appear"):
        ChatTemplate("{% for m in messages %}content{% endfor %}").render(
            messages, add_generation_prompt=False, continue_final_message=True
        )


def test_developer_messages_become_one_system_message_unless_the_template_knows_them() -> None:
    messages = [
        {"role": "system", "content": "S"},
        _user("u"),
        {"role": "developer", "content": [{"type": "text", "text": "D"}], "tools": [1]},
    ]
    plain = ChatTemplate("{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}")
    assert plain.render(messages) == "system:S\n\nD;user:u;"
    knowing = ChatTemplate(
        "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}{# 'developer' #}"
    )
    assert knowing.render(messages) == "system:S;user:u;developer:D;"


def test_template_helpers_and_failures() -> None:
    clock = ChatTemplate("{{ strftime_now('%Y-%m-%d') }}", now=lambda: datetime(2026, 11, 30, 12))
    assert clock.render([_user("x")]) == "2026-11-30"
    tagged = ChatTemplate(
        "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
    )
    assert tagged.render([_user("x"), _user("y")]) == "xy"
    strict = ChatTemplate(
        "{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}x"
    )
    with pytest.raises(TemplateError, match="user first"):
        strict.render([{"role": "system", "content": "s"}])
    with pytest.raises(TemplateError, match="empty conversation"):
        strict.render([])
    with pytest.raises(TemplateError, match="does not compile"):
        ChatTemplate("{% for %}")
    with pytest.raises(TemplateError):
        ChatTemplate("{{ messages[5].content }}").render([_user("x")])


def test_non_text_content_cannot_be_tokenized_exactly() -> None:
    image = {"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}}
    with pytest.raises(TokenizationError, match="image_url") as caught:
        ChatTemplate(None).render([_user([image])])
    assert not isinstance(caught.value, TemplateError)
