"""The contract the router's precise prefix mode relies on: a request body in, the engine's token ids out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from burstsched.framework import ApiKind


@runtime_checkable
class PromptTokenizer(Protocol):
    """Gives the token ids vLLM will compute for a request's prompt, exactly, or raises.

    ``payload`` is the already-validated OpenAI JSON body of a ``/v1/chat/completions`` (``api`` CHAT) or
    ``/v1/completions`` (``api`` COMPLETIONS) request; it is not modified. Raises
    :class:`~burstsched.tokenization.TokenizationError` (message says why) when the ids cannot be exact,
    e.g. multimodal content, a request-supplied chat template, a template that refuses the messages, or an
    unreachable tokenizer endpoint; the caller then falls back to approximate hashing.
    """

    async def prompt_token_ids(self, api: ApiKind, payload: Mapping[str, Any]) -> tuple[int, ...]: ...
