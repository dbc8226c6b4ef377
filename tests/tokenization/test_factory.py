"""The tokenizer: configuration section and the tokenizer it builds."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from burstsched.config import RouterConfig, TokenizerConfig
from burstsched.dispatch import UpstreamClient, poster
from burstsched.tokenization import (
    LocalPromptTokenizer,
    RemotePromptTokenizer,
    TokenizationError,
    build_prompt_tokenizer,
)

pytestmark = pytest.mark.anyio


def test_config_defaults_and_strictness() -> None:
    assert RouterConfig().tokenizer == TokenizerConfig()
    assert TokenizerConfig().source == "none" and TokenizerConfig().cache_entries == 8192
    with pytest.raises(ValidationError) as caught:
        RouterConfig.model_validate({"tokenizer": {"source": "local"}})
    assert caught.value.errors()[0]["loc"] == ("tokenizer", "path")
    for bad in ({"source": "hf"}, {"cache_entries": -1}, {"timeout_ms": 0}, {"cache_entries": "8"}, {"x": 1}):
        with pytest.raises(ValidationError):
            TokenizerConfig.model_validate(bad)


async def test_build_gives_what_the_source_names(tokenizer_dir: Path) -> None:
    async with UpstreamClient(trust_env=False) as upstream:
        http = poster(upstream)
        assert build_prompt_tokenizer(TokenizerConfig(), http, lambda: None) is None
        local = build_prompt_tokenizer(
            TokenizerConfig(source="local", path=str(tokenizer_dir), cache_entries=3), http, lambda: None
        )
        assert isinstance(local, LocalPromptTokenizer) and local.cache.max_entries == 3
        remote = build_prompt_tokenizer(TokenizerConfig(source="remote"), http, lambda: "http://127.0.0.1:1")
        assert isinstance(remote, RemotePromptTokenizer)
        with pytest.raises(TokenizationError, match="does not exist"):
            build_prompt_tokenizer(
                TokenizerConfig(source="local", path=str(tokenizer_dir / "missing")), http, lambda: None
            )
