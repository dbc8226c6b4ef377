"""The ``tokenizer:`` section of the configuration (precise prefix mode, ``burstsched.tokenization``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator


class TokenizerConfig(BaseModel):
    """How the router gets a request's token ids exactly as vLLM computes them (for the precise index)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    source: Literal["none", "local", "remote"] = Field(
        default="none",
        description="none: the router does not tokenize (approximate prefix hashing only); local: tokenize "
        "in the router from the model's tokenizer files (path); remote: ask a replica's POST /tokenize.",
    )
    path: str | None = Field(
        default=None,
        min_length=1,
        validate_default=True,
        description="For source local: the model's tokenizer folder (tokenizer.json, tokenizer_config.json "
        "with the chat template) or a tokenizer.json path. It must be the tokenizer the replicas serve.",
    )
    cache_entries: int = Field(
        default=8192,
        ge=0,
        description="Most prompts whose token ids are kept (LRU, keyed by a digest of what decides the ids; "
        "about 4 bytes a token). 0 keeps none.",
    )
    timeout_ms: float = Field(
        default=2000.0,
        gt=0,
        description="For source remote: the longest wait for a replica's /tokenize answer; past it the "
        "request is routed without token ids (approximate hashing).",
    )

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None and info.data.get("source") == "local":
            raise ValueError("required when source is local (a tokenizer folder or tokenizer.json)")
        return value
