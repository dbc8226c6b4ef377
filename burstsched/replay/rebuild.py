"""Synthetic prompts with a trace's sharing structure.

A recorded request keeps only its block-hash chain: equal hashes at position ``i`` mean equal prompts up
to the end of block ``i``. The rebuilt prompt is a completions prompt (its rendering is its UTF-8 bytes,
so the router's blocks are exactly the text's ``block_tokens × bytes_per_token``-byte slices) made of one
synthetic text per recorded block, chosen by the block's hash, then a tail unique to the request up to
its recorded size. Two rebuilt prompts therefore share exactly as many leading router blocks as their
recorded chains did. The text is ASCII words, each with its leading space (by default 1-5 letters: the
simulator's tokenizer counts about 3.3 bytes a token of it, measured by :func:`sim_bytes_per_token`); a
block boundary falls between words, so the engine's tokens of a shared prefix are shared as well.

Where two recorded chains part, the prompts went on sharing some bytes of the block where they part (a
document's end before its different questions): the chain cannot say how many, only that it is fewer
than a block. A rebuilt block therefore opens with half a block of text drawn from its parent's hash,
the same for every child of that parent, and the tail after a chain's last block likewise: prompts that
part at a block share half of it, the expected share when the point of parting falls anywhere in the
block. Without it a warm request's cached prefix came out one engine block short in a fifth of the
requests of a document-QA trace from vLLM (35 of 154 warm requests, 128 tokens each).

Sizes follow the engine when the trace has the replicas' own token counts (usage's ``prompt_tokens``,
recorded as ``input_tokens``): the trace's median ratio of engine tokens to pseudo-tokens gives the bytes
the recorded prompts held per engine token (about 2.1 for a chat trace from vLLM with a 4-byte
pseudo-token). Between 2 and 5 bytes, the rebuilt text is written with words of that mean length (a
space and 1 to 4 letters, one token each for the simulator's tokenizer): the router cuts it into the
recorded blocks, each as many engine tokens as the recorded one, and the simulated replica counts the
recorded tokens. So the replayed router's view matches the live one's, down to how its approximate index
sizes a replica's cache in blocks (engine capacity over pseudo-tokens a block): on a 3-minute trace from
vLLM the replayed router sent 51 requests through the window as cold and 218 as warm to a replica that had
evicted them, against the live router's 45 and 213 (with text at the simulator's 3.3 bytes a token and
blocks stretched to match the tokens: 153 and 79). A denser trace (under 2 bytes a token) gets the
stretched blocks: each block's text is as many simulator tokens as the recorded block's engine tokens, and
the router cuts it into proportionally more blocks, with the same sharing. Without either, a chat trace
from vLLM replays with half its tokens: the caches hold twice the documents and the hit rate comes out 8
points high (measured). A trace without usage is rebuilt block for block, as the router saw it.

Limits: a chain stops at the router's ``max_blocks``; what a prompt held past it is rebuilt as unique
text. Prompts rendered from chat messages are rebuilt as completions prompts of the same size.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence

from burstsched.replay.trace import TracedRequest
from burstsched.sim.tokenizer import BuiltinTokenizer

_TO_LETTERS = bytes(ord("a") + b % 26 for b in range(256))
"""Random bytes → lowercase letters (a translation table)."""
_MIN_SPLIT_BYTES = 8
"""Blocks shorter than this get no shared opening (too short for two runs of words)."""
MIN_WORD_BYTES = 2
MAX_WORD_BYTES = 5
"""Words of 2 to 5 bytes (a space and 1 to 4 letters) are one token each for the simulator's tokenizer."""


def _words(rng: random.Random, size: int, mean: float | None = None) -> str:
    """Exactly ``size`` ASCII bytes of space-led words: each 2 to 6 bytes, or (``mean`` bytes a word, from
    :data:`MIN_WORD_BYTES` to :data:`MAX_WORD_BYTES`) the two lengths around ``mean``, each word then one
    token of the simulator's tokenizer."""
    text = bytearray(rng.randbytes(size).translate(_TO_LETTERS))
    lengths = rng.randbytes(size // 2 + 1)
    shorter, longer_share = (0, 0) if mean is None else (int(mean), round((mean - int(mean)) * 256))
    position, word = 0, 0
    while position < size:
        left = size - position
        if left <= 6:
            length = left
        elif mean is None:
            length = 2 + lengths[word] % 5
        else:
            length = shorter + (lengths[word] < longer_share)
        if 0 < left - length < 2:  # never leave a remainder too short for a word
            length = left - 2
        text[position] = 0x20
        position += length
        word += 1
    return text.decode("ascii")


def block_text(block_hash: int, size: int, seed: int = 0, mean: float | None = None) -> str:
    """The synthetic text of one recorded block (the same hash and seed: the same text)."""
    return _words(random.Random(block_hash if seed == 0 else f"{seed}:{block_hash}"), size, mean)


def shared_opening(parent: int | None, size: int, seed: int = 0, mean: float | None = None) -> str:
    """The text every child of ``parent`` (None: the chain's start) opens with: half of ``size``."""
    return _words(random.Random(f"after:{seed}:{parent}"), size // 2, mean)


def _child_text(parent: int | None, block_hash: int, size: int, seed: int, mean: float | None) -> str:
    if size < _MIN_SPLIT_BYTES:
        return block_text(block_hash, size, seed, mean)
    opening = shared_opening(parent, size, seed, mean)
    return opening + block_text(block_hash, size - len(opening), seed, mean)


def rebuild_prompt(
    request: TracedRequest, unique: int, engine_scale: float | None = None, seed: int = 0
) -> str:
    """The prompt of one recorded request; ``unique`` seeds its tail (distinct per request), ``seed`` every
    text (another seed: other words, the same sharing structure).

    ``engine_scale`` None: each block is the router's block size in bytes, so the router hashes the rebuilt
    prompt into a chain as long as the recorded one. A number (engine tokens per router pseudo-token): each
    block becomes text the simulator counts as ``block_tokens × engine_scale`` tokens, and the prompt as
    many tokens as the replica counted (see the module's note).
    """
    mean: float | None = None
    if engine_scale is None:
        block_bytes = request.block_tokens * request.bytes_per_token
        size = request.prompt_tokens * request.bytes_per_token
    else:
        tokens = request.input_tokens or request.prompt_tokens * engine_scale
        recorded_bytes_per_token = request.bytes_per_token / engine_scale
        if MIN_WORD_BYTES <= recorded_bytes_per_token <= MAX_WORD_BYTES:  # the recorded blocks, as they were
            mean = recorded_bytes_per_token
            block_bytes = request.block_tokens * request.bytes_per_token
            size = round(tokens * mean)
        else:  # blocks stretched to the engine's tokens
            bytes_per_token = sim_bytes_per_token()
            block_bytes = max(2, round(request.block_tokens * engine_scale * bytes_per_token))
            size = round(tokens * bytes_per_token)
    parents = (None, *request.blocks)  # block i's parent is block i - 1; the tail's, the chain's last
    parts = [_child_text(parents[i], h, block_bytes, seed, mean) for i, h in enumerate(request.blocks)]
    total = max(size, len(parts) * block_bytes + 2)
    tail = total - len(parts) * block_bytes
    splits = block_bytes >= _MIN_SPLIT_BYTES and tail >= block_bytes // 2 + 2
    opening = shared_opening(parents[-1], block_bytes, seed, mean) if splits else ""
    tail_seed = f"tail-{unique}" if seed == 0 else f"tail-{seed}-{unique}"
    parts += [opening, _words(random.Random(tail_seed), tail - len(opening), mean)]
    return "".join(parts)


@functools.cache
def sim_bytes_per_token() -> float:
    """Bytes of the synthetic text per token of the simulator's tokenizer (measured once, on 200 blocks)."""
    text = "".join(block_text(i, 256) for i in range(200))
    return len(text) / len(BuiltinTokenizer().encode(text, add_special_tokens=False))


def engine_scale(requests: Sequence[TracedRequest]) -> float | None:
    """The median of engine tokens per router pseudo-token over ``requests`` (None: no usage recorded)."""
    ratios = sorted(r.input_tokens / r.prompt_tokens for r in requests if r.input_tokens and r.prompt_tokens)
    return ratios[len(ratios) // 2] if ratios else None


def rebuild_prompts(requests: Sequence[TracedRequest], seed: int = 0) -> list[str]:
    """Every request's prompt (:func:`rebuild_prompt`), the text drawn from ``seed``."""
    scale = engine_scale(requests)
    return [rebuild_prompt(r, i, scale, seed) for i, r in enumerate(requests)]
