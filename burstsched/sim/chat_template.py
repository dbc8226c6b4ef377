"""Rendering chat messages into the prompt text the engine tokenizes, as vLLM does.

A Jinja2 sandbox like the one ``transformers`` uses (``trim_blocks``, ``lstrip_blocks``, loop controls,
``raise_exception``, ``tojson``, ``strftime_now``). Message content given as a list of parts is joined
to one string first (vLLM's "string" content format: text parts joined by newlines). The built-in
template is ChatML.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class TemplateError(ValueError):
    """The chat template could not render these messages (a client error: HTTP 400)."""


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """A compiled chat template."""

    def __init__(self, source: str | None, special_tokens: Mapping[str, str] | None = None) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self.source = source if source is not None else CHATML_TEMPLATE
        self._template = env.from_string(self.source)
        self._special = dict(special_tokens or {})

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[Any] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text for ``messages``; raises :class:`TemplateError` when the template refuses them."""
        flat = [_flatten_message(m) for m in messages]
        context: dict[str, Any] = dict(self._special)
        context.update(extra or {})
        context.update(
            messages=flat,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tools=list(tools) if tools is not None else None,
        )
        try:
            text = self._template.render(**context)
        except TemplateError:
            raise
        except (jinja2.TemplateError, TypeError, KeyError, ValueError, AttributeError, IndexError) as exc:
            raise TemplateError(f"chat template failed: {exc}") from exc
        if continue_final_message and flat:
            last = flat[-1].get("content")
            if isinstance(last, str) and last and last in text:
                text = text[: text.rindex(last) + len(last)]
        return text


def _flatten_message(message: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(message)
    content = message.get("content")
    if content is None:
        out["content"] = ""
    elif isinstance(content, list):
        texts = [str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text"]
        out["content"] = "\n".join(texts)
    return out
