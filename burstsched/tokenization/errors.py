"""The one exception family of tokenization.

::

    ValueError
    └── TokenizationError      the engine's token ids cannot be computed exactly, or the tokenizer cannot load
        └── TemplateError      the chat template refused these messages (vLLM answers HTTP 400)

Callers that route by token ids catch :class:`TokenizationError` and fall back (to approximate hashing);
the simulator turns :class:`TemplateError` into an HTTP 400, as vLLM does. Both derive from ``ValueError``
so that code written against the simulator's older loaders keeps working.
"""

from __future__ import annotations


class TokenizationError(ValueError):
    """The prompt's token ids cannot be computed exactly; the message says why."""


class TemplateError(TokenizationError):
    """The chat template could not render these messages (a client error: vLLM answers HTTP 400)."""
