"""Synthetic prompts with a trace's sharing structure.

A recorded request keeps only its block-hash chain: equal hashes at position ``i`` mean equal prompts up
to the end of block ``i``. The rebuilt prompt is a completions prompt (its rendering is its UTF-8 bytes,
so the router's blocks are exactly the text's ``block_tokens × bytes_per_token``-byte slices) made of one
synthetic text per recorded block, chosen by the block's hash, then a tail unique to the request up to
its recorded size. Two rebuilt prompts therefore share exactly as many leading router blocks as their
recorded chains did. The text is ASCII words of 1–5 letters, each with its leading space, which the
simulator's tokenizer counts at about one token per 4 bytes, like the router's pseudo-tokens; a block
boundary falls between words, so the engine's tokens of a shared prefix are shared as well.

Limits: a chain stops at the router's ``max_blocks``; what a prompt held past it is rebuilt as unique
text. Prompts rendered from chat messages are rebuilt as completions prompts of the same size.
"""

from __future__ import annotations

import random
import string
from collections.abc import Sequence

from burstsched.replay.trace import TracedRequest

_LETTERS = string.ascii_lowercase


def _words(rng: random.Random, size: int) -> str:
    """Exactly ``size`` ASCII bytes of space-led words (each 2 to 6 bytes)."""
    parts: list[str] = []
    left = size
    while left > 0:
        length = left if left <= 6 else rng.randint(2, 6)
        if 0 < left - length < 2:  # never leave a remainder too short for a word
            length = left - 2
        parts.append(" " + "".join(rng.choice(_LETTERS) for _ in range(length - 1)))
        left -= length
    return "".join(parts)


def block_text(block_hash: int, size: int) -> str:
    """The synthetic text of one recorded block (the same hash: the same text)."""
    return _words(random.Random(block_hash), size)


def rebuild_prompt(request: TracedRequest, unique: int) -> str:
    """The prompt of one recorded request; ``unique`` seeds its tail (distinct per request)."""
    block_bytes = request.block_tokens * request.bytes_per_token
    parts = [block_text(h, block_bytes) for h in request.blocks]
    total = max(request.prompt_tokens * request.bytes_per_token, len(parts) * block_bytes + 1)
    tail = total - len(parts) * block_bytes
    parts.append(_words(random.Random(f"tail-{unique}"), max(tail, 2)))
    return "".join(parts)


def rebuild_prompts(requests: Sequence[TracedRequest]) -> list[str]:
    return [rebuild_prompt(r, i) for i, r in enumerate(requests)]
