"""Rebuilt prompts keep the recorded sharing structure, as the router hashes them."""

from __future__ import annotations

import itertools
import random

from burstsched.prefix.hashing import block_hashes, pseudo_tokens
from burstsched.replay.rebuild import rebuild_prompts
from burstsched.replay.trace import TracedRequest


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _traced(chain: tuple[int, ...], extra_tokens: int) -> TracedRequest:
    return TracedRequest(
        t=0.0,
        api="chat",
        blocks=chain,
        prompt_tokens=len(chain) * 64 + extra_tokens,
        block_tokens=64,
        bytes_per_token=4,
        max_tokens=8,
        output_tokens=8,
        stream=True,
    )


def test_prompts_sharing_k_leading_blocks_share_k_blocks_after_rebuild() -> None:
    rng = random.Random(3)
    documents = [tuple(rng.getrandbits(64) for _ in range(rng.randint(2, 12))) for _ in range(4)]
    chains: list[tuple[int, ...]] = []
    for _ in range(24):
        document = rng.choice(documents)
        keep = rng.randint(0, len(document))  # a prefix of a shared document, then blocks of its own
        chains.append(document[:keep] + tuple(rng.getrandbits(64) for _ in range(rng.randint(0, 3))))
    requests = [_traced(chain, rng.randint(1, 63)) for chain in chains]
    prompts = rebuild_prompts(requests)
    rebuilt = [block_hashes(p.encode(), model="kv-demo") for p in prompts]
    for request, prompt, chain in zip(requests, prompts, rebuilt, strict=True):
        assert len(chain) == len(request.blocks)
        assert pseudo_tokens(prompt.encode()) == request.prompt_tokens
        assert prompt.isascii()
    for i, j in itertools.combinations(range(len(chains)), 2):
        assert _common(rebuilt[i], rebuilt[j]) == _common(chains[i], chains[j]), (i, j)
