"""OpenAI chat messages turned into the conversation a chat template sees, as vLLM 0.32 does it.

vLLM does not hand the client's messages to the template as they are: it rebuilds each message with only
``role`` and ``content`` (then ``tool_calls``, ``reasoning``/``reasoning_content``, ``tool_call_id``,
``name``, ``task``, and ``tools`` for a developer message), joins text parts with newlines (``string``
content format) or keeps them as ``{"type": "text", "text": ...}`` parts (``openai`` format), parses tool
call arguments from JSON into objects, and drops an empty ``tool_calls`` list. A port of
``vllm/renderers/chat_utils.py`` (``_parse_chat_message_content`` and ``_postprocess_messages``) limited to
text: a multimodal part raises :class:`TokenizationError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from burstsched.tokenization.content_format import ContentFormat
from burstsched.tokenization.errors import TemplateError, TokenizationError

# Part types vLLM reads as text, and the key each keeps its text under.
_TEXT_KEYS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
_SKIP_WHEN_NONE = ("text", "refusal")
# Keys of vLLM's content-part types; other keys of a text part are kept in the openai format.
_KNOWN_PART_FIELDS = frozenset(
    "audio_embeds audio_url closed data file image_embeds image_pil image_url input_audio name "
    "prompt_cache_breakpoint refusal text thinking type uuid video_embeds video_url".split()
)
_BILLING_HEADER = "x-anthropic-billing-header"
# pydantic rebuilds each tool call in the order of OpenAI's TypedDicts, extra keys last.
_TOOL_CALL_ORDER = ("id", "function", "type")
_FUNCTION_ORDER = ("arguments", "name")


def build_conversation(
    messages: Sequence[Mapping[str, Any]], content_format: ContentFormat
) -> list[dict[str, Any]]:
    """The conversation vLLM renders for ``messages``; non-text content raises :class:`TokenizationError`."""
    conversation = [_message(m, content_format) for m in messages]
    for message in conversation:
        _parse_tool_call_arguments(message)
    return conversation


def developer_as_system(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Developer messages as system ones, all system messages merged into one first (for templates without
    a developer role, as vLLM does)."""
    converted = []
    for message in conversation:
        if message["role"] == "developer":
            message = {k: v for k, v in message.items() if k != "tools"}
            message["role"] = "system"
        converted.append(message)
    system_contents: list[str] = []
    others: list[dict[str, Any]] = []
    needs_merge = False
    for i, message in enumerate(converted):
        if message["role"] != "system":
            others.append(message)
            continue
        if i > 0 or system_contents:
            needs_merge = True
        content = message.get("content", "")
        if isinstance(content, list):
            texts = [p["text"] if isinstance(p, dict) else p for p in content if _has_text(p)]
            content = "\n".join(texts)
        if content:
            system_contents.append(content)
    if not needs_merge:
        return converted
    return [{"role": "system", "content": "\n\n".join(system_contents)}, *others]


def _has_text(part: Any) -> bool:
    return isinstance(part, str) or (isinstance(part, dict) and "text" in part)


def _message(message: Mapping[str, Any], content_format: ContentFormat) -> dict[str, Any]:
    role = message.get("role")
    if not isinstance(role, str):
        raise TemplateError("each message needs a string role")
    content = message.get("content")
    parts: list[Any]
    if content is None:
        parts = []
    elif isinstance(content, str):
        parts = [{"type": "text", "text": content}]
    elif isinstance(content, list):
        parts = list(content)
    else:
        raise TemplateError(f"message content of type {type(content).__name__} is not supported")
    if role == "system":
        parts = _strip_billing_header(parts)
    texts = [t for t in (_part(p, content_format) for p in parts) if t is not None]
    out: dict[str, Any] = {"role": role}
    if content_format == "openai":
        out["content"] = texts
    else:
        out["content"] = "\n".join(str(t) for t in texts)
    if role == "assistant":
        tool_calls = message.get("tool_calls")
        if tool_calls is not None:
            if not isinstance(tool_calls, list):
                raise TemplateError("tool_calls must be a list")
            out["tool_calls"] = [_ordered_tool_call(c) for c in tool_calls]
        reasoning = message.get("reasoning")
        if reasoning is not None:
            out["reasoning"] = reasoning
            out["reasoning_content"] = reasoning
    elif role == "tool":
        if "tool_call_id" in message:
            out["tool_call_id"] = message["tool_call_id"]
        body = out["content"]
        if isinstance(body, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in body):
            out["content"] = "\n".join(str(p.get("text", "")) for p in body)
    if isinstance(message.get("name"), str):
        out["name"] = message["name"]
    if isinstance(message.get("task"), str):
        out["task"] = message["task"]
    if role == "developer":
        out["tools"] = message.get("tools")
    return out


def _part(part: Any, content_format: ContentFormat) -> Any:
    """A text part's text (string format) or ``{"type": "text", "text": ...}`` (openai format); None: skip."""
    if isinstance(part, str):
        return {"type": "text", "text": part} if content_format == "openai" else part
    if not isinstance(part, dict):
        raise TemplateError("a content part must be an object or a string")
    part_type = part.get("type")
    if part.get("uuid") is not None or not isinstance(part_type, str) or part_type not in _TEXT_KEYS:
        raise TokenizationError(f"content part of type {part_type!r} is not text: cannot tokenize it exactly")
    text = part.get(_TEXT_KEYS[part_type])
    if text is None and part_type in _SKIP_WHEN_NONE:
        return None
    if not isinstance(text, str):
        raise TemplateError(f"a {part_type} part needs a string {_TEXT_KEYS[part_type]}")
    if content_format == "string":
        return text
    out = {"type": "text", "text": text}
    out.update({k: v for k, v in part.items() if k not in _KNOWN_PART_FIELDS})
    return out


def _strip_billing_header(parts: list[Any]) -> list[Any]:
    """Claude Code's per-request attribution line dropped from system text, as vLLM does."""
    out: list[Any] = []
    for part in parts:
        text = part if isinstance(part, str) else part.get("text") if isinstance(part, dict) else None
        if isinstance(part, dict) and part.get("type") != "text":
            text = None
        if not (isinstance(text, str) and text.startswith(_BILLING_HEADER)):
            out.append(part)
            continue
        rest = text.partition("\n")[2]
        if rest:
            out.append(rest if isinstance(part, str) else {**part, "text": rest})
    return out


def _ordered_tool_call(call: Any) -> Any:
    if not isinstance(call, dict):
        raise TemplateError("assistant tool_calls entries must be objects.")
    out = _ordered(call, _TOOL_CALL_ORDER)
    if isinstance(out.get("function"), dict):
        out["function"] = _ordered(out["function"], _FUNCTION_ORDER)
    return out


def _ordered(value: Mapping[str, Any], order: tuple[str, ...]) -> dict[str, Any]:
    out = {k: value[k] for k in order if k in value}
    out.update({k: v for k, v in value.items() if k not in out})
    return out


def _parse_tool_call_arguments(message: dict[str, Any]) -> None:
    """Tool call arguments as objects (vLLM parses the JSON string; anything else becomes ``{}``)."""
    if message["role"] != "assistant" or "tool_calls" not in message:
        return
    tool_calls = message["tool_calls"]
    if not tool_calls:
        del message["tool_calls"]
        return
    for call in tool_calls:
        function = call.get("function")
        if call.get("type", "function") != "function" or not isinstance(function, dict):
            raise TemplateError("chat completions only support assistant tool_calls of type 'function'.")
        arguments = function.get("arguments")
        if not arguments:
            function["arguments"] = {}
            continue
        parsed: Any = arguments
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments)
            except json.JSONDecodeError:
                parsed = None
        function["arguments"] = parsed if isinstance(parsed, dict) else {}
