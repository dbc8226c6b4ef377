"""Tokenizers for the simulator: a built-in one that needs no files, and one read from a model's files.

Both sit behind :class:`Tokenizer`. The built-in tokenizer works like a byte-pair encoder in the ways
a scheduler can see: English text gives about 4 characters per token, pieces are found by a
pre-tokenizing regex (words with their leading space, numbers, punctuation, whitespace), so the
tokens of a text's prefix are a prefix of the text's tokens except near the cut; ids are a stable
hash of each piece. ChatML's special tokens are single tokens.

:class:`HFTokenizer` reads a folder as Hugging Face saves it (``tokenizer.json`` and
``tokenizer_config.json``) with the ``tokenizers`` package and tokenizes exactly as that model does; the
file reading is the router's too (:mod:`burstsched.tokenization.files`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

import xxhash

from burstsched.tokenization.files import load_encoder, read_tokenizer_files, token_text

BUILTIN_SPECIAL_TOKENS: Mapping[str, int] = MappingProxyType(
    {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
)
_BUILTIN_VOCAB = 150_000
_BUILTIN_FIRST_ID = 1_000
_MAX_PIECE_CHARS = 5
_PRETOKENIZE = re.compile(
    r"""'(?:s|t|re|ve|m|ll|d)| ?[^\W\d_]+| ?\d{1,3}| ?[^\s\w]+|\s+(?!\S)|\s+""",
    re.UNICODE,
)
# Words the simulated model "generates". Each is kept only if it is one token for the tokenizer in use.
OUTPUT_WORDS: tuple[str, ...] = tuple(
    """the of and to in is it for on was as at by an be or are from has had not but all can out one
    two new old big low top end key log set run job map day row bit net way use max min sum ops api
    node data disk load time rate user code test file host port pool read send slow fast warm cold
    heap core lock path page unit step task call sync peak mean drop fail pass edge zone rack pod
    cpu gpu ram ssd hot net tcp dns ack ping heat fan bus cap""".split()
)


class Tokenizer(Protocol):
    """What the simulator needs of a tokenizer."""

    @property
    def name(self) -> str: ...

    @property
    def eos_token_id(self) -> int: ...

    @property
    def chat_template(self) -> str | None: ...

    @property
    def special_tokens_map(self) -> dict[str, str]: ...

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def output_vocabulary(self) -> list[tuple[int, str]]:
        """(token id, text) pairs the simulated model generates, each text one token."""
        ...


class BuiltinTokenizer:
    """A deterministic tokenizer that needs no files (see the module docstring)."""

    def __init__(self) -> None:
        self._id_to_piece: dict[int, str] = {v: k for k, v in BUILTIN_SPECIAL_TOKENS.items()}
        self._special = re.compile("(" + "|".join(re.escape(t) for t in BUILTIN_SPECIAL_TOKENS) + ")")

    @property
    def name(self) -> str:
        return "builtin"

    @property
    def eos_token_id(self) -> int:
        return BUILTIN_SPECIAL_TOKENS["<|im_end|>"]

    @property
    def chat_template(self) -> str | None:
        return None

    @property
    def special_tokens_map(self) -> dict[str, str]:
        return {"bos_token": "", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """Token ids of ``text``; the built-in tokenizer adds no special tokens of its own."""
        ids: list[int] = []
        for segment in self._special.split(text):
            if not segment:
                continue
            special = BUILTIN_SPECIAL_TOKENS.get(segment)
            if special is not None:
                ids.append(special)
                continue
            for match in _PRETOKENIZE.finditer(segment):
                piece = match.group()
                for start in range(0, len(piece), _MAX_PIECE_CHARS):
                    ids.append(self._piece_id(piece[start : start + _MAX_PIECE_CHARS]))
        return ids

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of ids this tokenizer produced; unknown ids decode to nothing."""
        return "".join(self._id_to_piece.get(i, "") for i in token_ids)

    def output_vocabulary(self) -> list[tuple[int, str]]:
        words = []
        for word in OUTPUT_WORDS:
            ids = self.encode(" " + word, add_special_tokens=False)
            if len(ids) == 1:
                words.append((ids[0], " " + word))
        return words

    def _piece_id(self, piece: str) -> int:
        token_id = _BUILTIN_FIRST_ID + xxhash.xxh64_intdigest(piece.encode("utf-8")) % _BUILTIN_VOCAB
        if len(self._id_to_piece) < 1_000_000:
            self._id_to_piece.setdefault(token_id, piece)
        return token_id


class HFTokenizer:
    """A model's own tokenizer, read from ``tokenizer.json`` and ``tokenizer_config.json``."""

    def __init__(self, folder: str | Path) -> None:
        files = read_tokenizer_files(folder)
        self._folder = Path(folder)
        self._tok = load_encoder(files)
        self._config = files.config
        self._chat_template = files.chat_template
        eos = token_text(files.config.get("eos_token"))
        eos_id = self._tok.token_to_id(eos) if eos else None
        self._eos_token_id = eos_id if eos_id is not None else 0

    @property
    def name(self) -> str:
        return str(self._folder)

    @property
    def eos_token_id(self) -> int:
        return self._eos_token_id

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    @property
    def special_tokens_map(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
            text = token_text(self._config.get(key))
            out[key] = text or ""
        return out

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        ids: list[int] = self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    def decode(self, token_ids: Sequence[int]) -> str:
        text: str = self._tok.decode(list(token_ids), skip_special_tokens=True)
        return text

    def output_vocabulary(self) -> list[tuple[int, str]]:
        words: list[tuple[int, str]] = []
        for word in OUTPUT_WORDS:
            ids = self.encode(" " + word, add_special_tokens=False)
            if len(ids) == 1 and ids[0] != self._eos_token_id:
                words.append((ids[0], self.decode(ids)))
        if words:
            return words
        ids = self.encode(" the", add_special_tokens=False) or [0]
        return [(ids[0], self.decode(ids[:1]))]


def load_tokenizer(path: str | None) -> Tokenizer:
    """The HF tokenizer in folder ``path``, or the built-in one when ``path`` is None."""
    if path is None:
        return BuiltinTokenizer()
    return HFTokenizer(path)
