"""The prompt tokenizer the configuration asks for (``tokenizer:`` section), or None."""

from __future__ import annotations

from collections.abc import Callable

from burstsched.config.tokenizer import TokenizerConfig
from burstsched.tokenization.local import LocalPromptTokenizer
from burstsched.tokenization.prompt_tokenizer import PromptTokenizer
from burstsched.tokenization.remote import Post, RemotePromptTokenizer


def build_prompt_tokenizer(
    config: TokenizerConfig, post: Post, base_url: Callable[[], str | None]
) -> PromptTokenizer | None:
    """None for ``source: none``; a local one reads its files now (raises :class:`TokenizationError` when
    they are missing); a remote one asks ``base_url()``'s ``/tokenize`` through ``post``."""
    if config.source == "local":
        assert config.path is not None  # the config validator requires it
        return LocalPromptTokenizer(config.path, cache_entries=config.cache_entries)
    if config.source == "remote":
        return RemotePromptTokenizer(
            post, base_url, cache_entries=config.cache_entries, timeout_s=config.timeout_ms / 1000.0
        )
    return None
