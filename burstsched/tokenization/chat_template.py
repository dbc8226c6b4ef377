"""Rendering a chat request into the prompt text the engine tokenizes, as vLLM 0.32's chat endpoint does.

The steps, each as vLLM (``vllm/renderers``) and ``transformers`` 5 (``apply_chat_template``) take them:

- messages become vLLM's conversation (:mod:`burstsched.tokenization.conversation`) in the content format
  the template reads (:mod:`burstsched.tokenization.content_format`); a developer message becomes a system
  one when the template does not name the developer role;
- tools are the request's tools as vLLM's pydantic model dumps them (``description`` and ``parameters``
  always present, unknown keys dropped);
- template arguments are merged as vLLM merges them: ``chat_template_kwargs`` first, the request's
  ``add_generation_prompt``, ``continue_final_message`` and ``documents`` over them, ``None`` and ``"auto"``
  values dropped, then only the names the template reads (or ``apply_chat_template``'s own) kept;
- the template runs in ``transformers``' sandbox (``trim_blocks``, ``lstrip_blocks``, loop controls,
  ``{% generation %}``, ``raise_exception``, ``tojson`` without HTML escaping, ``strftime_now``) with the
  tokenizer's special tokens (``bos_token``, ``eos_token``, ...) in scope;
- ``continue_final_message`` cuts the text right after the final message's content (``transformers``' tag).

Any failure is a :class:`TemplateError` (vLLM answers it with HTTP 400).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.meta
import jinja2.nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.runtime import Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment

from burstsched.tokenization.content_format import ContentFormat, detect_content_format
from burstsched.tokenization.conversation import build_conversation, developer_as_system
from burstsched.tokenization.errors import TemplateError

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# transformers' apply_chat_template parameters: always accepted as kwargs, never passed to the template.
APPLY_PARAMS = frozenset(
    "add_generation_prompt chat_template continue_final_message conversation documents max_length padding "
    "return_assistant_tokens_mask return_dict return_tensors tokenize tokenizer_kwargs tools "
    "truncation".split()
)
_ACCEPTED_WITHOUT_TEMPLATE_USE = APPLY_PARAMS | {"self"}
_UNSET = (None, "auto")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class _GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}`` (assistant-mask markers): rendered as their body."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Macro) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def template_environment(now: Callable[[], datetime] = datetime.now) -> ImmutableSandboxedEnvironment:
    """A Jinja environment like ``transformers``' chat-template one; ``now`` feeds ``strftime_now``."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: now().strftime(fmt)
    return env


def merge_kwargs(defaults: Mapping[str, Any] | None, overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """vLLM's ``merge_kwargs``: ``overrides`` win over ``defaults``, except ``None`` and ``"auto"`` ones."""
    return dict(defaults or {}) | {k: v for k, v in (overrides or {}).items() if not _is_unset(v)}


def _is_unset(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value == "auto")


def normalize_tools(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """The request's tools as vLLM's ``ChatCompletionToolsParam.model_dump()`` gives them to the template."""
    out = []
    for tool in tools:
        if not isinstance(tool, Mapping) or tool.get("type", "function") != "function":
            raise TemplateError("each tool must be an object of type 'function'")
        function = tool.get("function")
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise TemplateError("each tool needs a function with a string name")
        dumped: dict[str, Any] = {
            "name": function["name"],
            "description": function.get("description"),
            "parameters": function.get("parameters"),
        }
        if function.get("strict") is not None:
            dumped["strict"] = function["strict"]
        defer = function.get("defer_loading")
        if defer is None:
            defer = tool.get("defer_loading")
        if defer is not None:
            dumped["defer_loading"] = defer
        entry: dict[str, Any] = {"type": "function", "function": dumped}
        if tool.get("defer_loading") is not None:
            entry["defer_loading"] = tool["defer_loading"]
        out.append(entry)
    return out


class ChatTemplate:
    """A compiled chat template with the tokenizer's special tokens; renders requests as vLLM does."""

    def __init__(
        self,
        source: str | None,
        special_tokens: Mapping[str, str] | None = None,
        *,
        now: Callable[[], datetime] = datetime.now,
    ) -> None:
        env = template_environment(now)
        self.source = source if source is not None else CHATML_TEMPLATE
        try:
            self._template = env.from_string(self.source)
            self.variables = frozenset(jinja2.meta.find_undeclared_variables(env.parse(self.source)))
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template does not compile: {exc}") from exc
        self.content_format: ContentFormat = detect_content_format(env, self.source)
        self._special = dict(special_tokens or {})
        self._knows_developer = '"developer"' in self.source or "'developer'" in self.source

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[Any] | None = None,
        documents: Sequence[Any] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text for ``messages``; ``extra`` is the request's ``chat_template_kwargs``."""
        request = {
            "add_generation_prompt": add_generation_prompt,
            "continue_final_message": continue_final_message,
            "documents": documents,
        }
        defaults: dict[str, Any] = {"tokenize": False}
        if tools is not None:
            defaults["tools"] = normalize_tools(tools)
        kwargs = merge_kwargs(defaults, merge_kwargs(extra, request))
        if "chat_template" in kwargs:
            raise TemplateError("chat_template_kwargs may not carry a chat_template")
        kwargs = {
            k: v for k, v in kwargs.items() if k in self.variables or k in _ACCEPTED_WITHOUT_TEMPLATE_USE
        }
        conversation = build_conversation(messages, self.content_format)
        if any(m["role"] == "developer" for m in conversation) and not self._knows_developer:
            conversation = developer_as_system(conversation)
        try:
            return self._apply(conversation, kwargs)
        except TemplateError:
            raise
        except Exception as exc:  # vLLM turns any failure of the template into a 400
            raise TemplateError(f"chat template failed: {exc}") from exc

    def _apply(self, conversation: list[dict[str, Any]], kwargs: dict[str, Any]) -> str:
        """``transformers``' ``apply_chat_template(tokenize=False)`` on vLLM's conversation."""
        add_generation_prompt = bool(kwargs.get("add_generation_prompt", False))
        continue_final = bool(kwargs.get("continue_final_message", False))
        if not conversation:
            raise TemplateError("Cannot apply chat template to an empty conversation.")
        if continue_final and add_generation_prompt:
            raise TemplateError(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
            )
        if kwargs.get("return_assistant_tokens_mask"):
            raise TemplateError("return_assistant_tokens_mask needs tokenize=True")
        context: dict[str, Any] = dict(self._special)
        context.update({k: v for k, v in kwargs.items() if k not in APPLY_PARAMS})
        final_text = ""
        if continue_final:
            final_text = _tag_final_message(conversation, self.source)
        context.update(
            messages=conversation,
            tools=kwargs.get("tools"),
            documents=kwargs.get("documents"),
            add_generation_prompt=add_generation_prompt,
        )
        text = self._template.render(**context)
        if continue_final:
            text = _cut_after_final_message(text, final_text)
        return text


def _tag_final_message(conversation: list[dict[str, Any]], source: str) -> str:
    """Marks the end of the final message's text with the tag; returns that text untagged."""
    last = conversation[-1]
    content = last.get("content")
    if content is None:
        raise TemplateError(
            'continue_final_message is set but the final message has no "content" to continue!'
        )
    if "content" not in source:
        raise TemplateError('continue_final_message is set to "content" but this is not an accepted field')
    if isinstance(content, list | tuple):
        for block in reversed(content):
            if isinstance(block, dict) and "text" in block:
                final = str(block["text"])
                block["text"] = final + _CONTINUE_TAG
                return final
        raise TemplateError("continue_final_message is set but the final message has no text to continue!")
    last["content"] = content + _CONTINUE_TAG
    return str(content)


def _cut_after_final_message(text: str, final_text: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final_text.strip() not in text or tag not in text:
        raise TemplateError("continue_final_message is set but the final message does not appear in the chat")
    at = text.rindex(tag)
    if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return text[:at]
    return text[:at].rstrip()
