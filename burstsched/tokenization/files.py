"""A model's tokenizer files, read as ``transformers`` (and so vLLM) reads them.

A tokenizer is given either as a folder saved by Hugging Face (``tokenizer.json``, ``tokenizer_config.json``,
optionally ``special_tokens_map.json``, ``chat_template.jinja`` and ``additional_chat_templates/*.jinja``) or
as the path of a ``tokenizer.json``, whose neighbours are read the same way when present. Chat templates
stored as files take priority over the ``chat_template`` entry of ``tokenizer_config.json``, as in
``transformers`` 5. Nothing here encodes text: :func:`load_encoder` gives the ``tokenizers`` object.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from burstsched.tokenization.errors import TokenizationError

if TYPE_CHECKING:
    from tokenizers import Tokenizer as RustTokenizer

SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
_TEMPLATE_FILE = "chat_template.jinja"
_TEMPLATE_DIR = "additional_chat_templates"


@dataclass(frozen=True, slots=True)
class TokenizerFiles:
    """What a tokenizer folder holds: the ``tokenizer.json`` path, the config and the named chat templates."""

    tokenizer_json: Path
    config: Mapping[str, Any] = field(default_factory=dict)
    chat_templates: Mapping[str, str] = field(default_factory=dict)

    @property
    def chat_template(self) -> str | None:
        """The default chat template (``default``, or the only one), or None."""
        if "default" in self.chat_templates:
            return self.chat_templates["default"]
        if len(self.chat_templates) == 1:
            return next(iter(self.chat_templates.values()))
        return None

    def chat_template_for(self, *, tools: bool) -> str | None:
        """The template ``transformers`` picks: ``tool_use`` if there are tools and it exists, else default"""
        if tools and "tool_use" in self.chat_templates:
            return self.chat_templates["tool_use"]
        return self.chat_template

    @property
    def special_tokens(self) -> dict[str, str]:
        """The special tokens that are set (``transformers``' ``special_tokens_map``), e.g. ``eos_token``."""
        out: dict[str, str] = {}
        for key in SPECIAL_TOKEN_KEYS:
            text = token_text(self.config.get(key))
            if text is not None:
                out[key] = text
        return out


def read_tokenizer_files(path: str | Path) -> TokenizerFiles:
    """The tokenizer files at ``path`` (a folder or a ``tokenizer.json``); raises TokenizationError."""
    given = Path(path)
    if given.is_file():
        folder, tokenizer_json = given.parent, given
    elif given.is_dir():
        folder, tokenizer_json = given, given / "tokenizer.json"
        if not tokenizer_json.is_file():
            raise TokenizationError(f"{tokenizer_json} not found (save the tokenizer with a fast tokenizer)")
    else:
        raise TokenizationError(f"tokenizer path {given} does not exist")
    config = _json_object(folder / "special_tokens_map.json")
    config.update(_json_object(folder / "tokenizer_config.json"))
    templates = _templates_from_config(config.get("chat_template"))
    file_templates = _templates_from_files(folder)
    if file_templates:
        templates = file_templates
    return TokenizerFiles(tokenizer_json, MappingProxyType(config), MappingProxyType(templates))


def load_encoder(files: TokenizerFiles) -> RustTokenizer:
    """The ``tokenizers`` tokenizer of ``files``; raises :class:`TokenizationError` when it cannot load."""
    from tokenizers import Tokenizer as RustTokenizer

    try:
        return RustTokenizer.from_file(str(files.tokenizer_json))
    except Exception as exc:  # the Rust side raises plain Exception for a malformed file
        raise TokenizationError(f"cannot load {files.tokenizer_json}: {exc}") from exc


def token_text(value: Any) -> str | None:
    """The text of a special token entry: a string, or an ``AddedToken`` dict's ``content``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _json_object(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizationError(f"cannot read {path}: {exc}") from exc
    if not isinstance(loaded, dict):
        raise TokenizationError(f"{path} is not a JSON object")
    return loaded


def _templates_from_config(value: Any) -> dict[str, str]:
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        return {k: v for k, v in named.items() if isinstance(k, str) and isinstance(v, str)}
    return {}


def _templates_from_files(folder: Path) -> dict[str, str]:
    templates: dict[str, str] = {}
    main = folder / _TEMPLATE_FILE
    if main.is_file():
        templates["default"] = main.read_text(encoding="utf-8")
    extra = folder / _TEMPLATE_DIR
    if extra.is_dir():
        for file in sorted(extra.glob("*.jinja")):
            templates[file.stem] = file.read_text(encoding="utf-8")
    return templates
