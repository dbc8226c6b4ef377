"""What a run's placements leave in vLLM's prefix caches, and the best fixed split of the documents.

:func:`replay_hits` plays requests, in arrival order, through one
:class:`~burstsched.sim.block_cache.BlockCache` per replica, the simulator's copy of vLLM's block pool: a
request takes the longest cached prefix of its blocks, computes and caches the rest, and frees them last
block first, as vLLM does, so a replica evicts its least recently used blocks, and a document's last blocks
before its first; a request's last, partial block is reused first. Requests run one at a time here (on
a replica, running requests also hold blocks, and a request that arrives while another computes the same
document finds only what is already computed), so what differs from the run's own hit rate is timing.

:func:`best_partition` asks which hit rate a router could have had by keeping each document on one
replica, chosen knowing the whole sequence, with no replica taking more than a share of the requests. It
climbs from the balanced split (most asked documents first, each to the replica with the fewest requests
so far) and from random splits, moving one document at a time while the replayed hits grow. The split it
returns exists, so its hit rate is a lower bound on the best split's.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from burstsched.sim.block_cache import BlockCache


@dataclass(frozen=True, slots=True)
class Placed:
    """One request: its document, its prompt's length in tokens, the replica that served it, and the
    tokens it generated there."""

    document: int
    prompt_tokens: int
    replica: str
    output_tokens: int = 0


def shared_blocks_of(requests: Iterable[tuple[int, int, int]], block_size: int) -> dict[int, int]:
    """Per document, its full blocks every prompt of it shares, from (document, prompt, cached tokens).

    The most a request of the document read from cache, in whole blocks, is the shared part that vLLM
    hashes alike for all of them. A document never read from cache gets its shortest prompt's full
    blocks less one (the last full block may hold some of the question).
    """
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    most: dict[int, int] = {}
    shortest: dict[int, int] = {}
    for document, prompt, cached in requests:
        most[document] = max(most.get(document, 0), cached // block_size)
        shortest[document] = min(shortest.get(document, prompt), prompt)
    return {d: most[d] or max(0, shortest[d] // block_size - 1) for d in most}


def replay_hits(
    placed: Sequence[Placed], shared_blocks: Mapping[int, int], *, block_size: int, capacity_blocks: int
) -> list[int]:
    """Per request, the tokens it reads from its replica's cache when the requests run in this order.

    A prompt's first ``shared_blocks[document]`` full blocks are its document's, the same for every
    request of it. The request holds KV for its prompt and all but its last output token: the full
    blocks of that past its document's are its own (cached, found by no one else), and a last, partial
    block is held without a hash and freed to be reused first. Each replica holds ``capacity_blocks``
    usable blocks (vLLM's ``num_gpu_blocks`` less its null block). On 400 document-QA prompts sent one
    at a time to a real vLLM replica of 161 blocks (``loadtests/cache_probe.py``), this gave every
    request's cached tokens exactly.
    """
    if block_size < 1 or capacity_blocks < 1:
        raise ValueError("block_size and capacity_blocks must be >= 1")
    caches: dict[str, BlockCache] = {}
    hits: list[int] = []
    own = 0
    for request in placed:
        cache = caches.get(request.replica)
        if cache is None:
            cache = caches[request.replica] = BlockCache(capacity_blocks + 1, block_size)  # + vLLM's null
        prompt_full = request.prompt_tokens // block_size
        with_kv = request.prompt_tokens + max(0, request.output_tokens - 1)
        full, partial = divmod(with_kv, block_size)
        shared = min(shared_blocks.get(request.document, 0), prompt_full)
        hashes = [_document_block(request.document, k) for k in range(shared)]
        for _ in range(full - shared):
            own += 1
            hashes.append(-own)  # a block no other request has
        if full + (partial > 0) > capacity_blocks:
            raise ValueError(f"a request of {full + (partial > 0)} blocks cannot fit {capacity_blocks}")
        hit = cache.longest_hit(hashes[:prompt_full], request.prompt_tokens - 1)
        cache.touch(hit)
        computed = cache.allocate(len(hashes) - len(hit) + (partial > 0))
        cache.cache_blocks(computed[: len(hashes) - len(hit)], hashes[len(hit) :], (), None)
        cache.free(list(reversed(hit + computed)))
        cache.take_events()
        hits.append(len(hit) * block_size)
    return hits


def _document_block(document: int, index: int) -> int:
    return (document + 1) * 1_000_003 + index  # apart from every other document's, and positive


@dataclass(frozen=True, slots=True)
class Partition:
    """A split of the documents over the replicas, and what its replay read from cache."""

    owner: Mapping[int, str]
    hit_tokens: int
    prompt_tokens: int
    requests: Mapping[str, int]
    computed: Mapping[str, int]  # per replica, the prompt tokens it computed (missed the cache)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def largest_share(self) -> float:
        total = sum(self.requests.values())
        return max(self.requests.values()) / total if total else 0.0


def balanced_owner(documents: Sequence[int], replicas: Sequence[str]) -> dict[int, str]:
    """Most asked documents first, each to the replica with the fewest requests so far (ties: list order)."""
    if not replicas:
        raise ValueError("at least one replica")
    load = dict.fromkeys(replicas, 0)
    owner: dict[int, str] = {}
    for document, count in sorted(Counter(documents).items(), key=lambda item: (-item[1], item[0])):
        replica = min(replicas, key=lambda r: load[r])
        owner[document] = replica
        load[replica] += count
    return owner


def partition(
    owner: Mapping[int, str],
    documents: Sequence[int],
    prompt_tokens: Sequence[int],
    shared_blocks: Mapping[int, int],
    *,
    block_size: int,
    capacity_blocks: int,
    output_tokens: Sequence[int] | None = None,
) -> Partition:
    """Replay the sequence with every request on its document's replica (``output_tokens``: what each
    generated; none if not given)."""
    outputs = [0] * len(documents) if output_tokens is None else output_tokens
    if not len(documents) == len(prompt_tokens) == len(outputs):
        raise ValueError("one prompt length (and output length) per request")
    placed = [Placed(d, p, owner[d], o) for d, p, o in zip(documents, prompt_tokens, outputs, strict=True)]
    hits = replay_hits(placed, shared_blocks, block_size=block_size, capacity_blocks=capacity_blocks)
    requests = Counter(owner[d] for d in documents)
    computed = computed_by_replica(placed, hits)
    return Partition(dict(owner), sum(hits), sum(prompt_tokens), dict(requests), computed)


def computed_by_replica(placed: Sequence[Placed], hits: Sequence[int]) -> dict[str, int]:
    """Per replica, the prompt tokens its requests computed (missed the cache), given their hits."""
    computed: Counter[str] = Counter()
    for request, hit in zip(placed, hits, strict=True):
        computed[request.replica] += request.prompt_tokens - hit
    return dict(computed)


def best_partition(
    documents: Sequence[int],
    prompt_tokens: Sequence[int],
    shared_blocks: Mapping[int, int],
    *,
    replicas: Sequence[str],
    block_size: int,
    capacity_blocks: int,
    max_share: float,
    rng: random.Random,
    starts: int = 4,
    output_tokens: Sequence[int] | None = None,
) -> Partition | None:
    """The split with the most replayed hits that local search found with no replica over ``max_share``
    of the requests; None when none of its starts could be brought under the cap.

    The first start is :func:`balanced_owner`'s split, the others random ones; a start over the cap moves
    random documents off its busiest replica until it is under (or gives up). From each, single documents
    move to another replica while that raises the hits and keeps the cap, until no move does.
    """
    if not 0 < max_share <= 1:
        raise ValueError("max_share must be in (0, 1]")
    if starts < 1 or not replicas:
        raise ValueError("starts and replicas must be >= 1")
    asked = Counter(documents)
    limit = max_share * len(documents)

    def replay(owner: Mapping[int, str]) -> Partition:
        return partition(
            owner,
            documents,
            prompt_tokens,
            shared_blocks,
            block_size=block_size,
            capacity_blocks=capacity_blocks,
            output_tokens=output_tokens,
        )

    def loads(owner: Mapping[int, str]) -> Counter[str]:
        out: Counter[str] = Counter(dict.fromkeys(replicas, 0))
        for document, count in asked.items():
            out[owner[document]] += count
        return out

    best: Partition | None = None
    for start in range(starts):
        if start:
            owner = {d: rng.choice(list(replicas)) for d in sorted(asked)}
        else:
            owner = balanced_owner(documents, replicas)
        if not _bring_under(owner, asked, loads, limit, rng):
            continue
        current = replay(owner)
        improved = True
        while improved:
            improved = False
            for document in rng.sample(sorted(asked), len(asked)):
                home = owner[document]
                for replica in replicas:
                    if replica == home:
                        continue
                    owner[document] = replica
                    if loads(owner)[replica] <= limit:
                        trial = replay(owner)
                        if trial.hit_tokens > current.hit_tokens:
                            current, home, improved = trial, replica, True
                            continue
                    owner[document] = home
        if best is None or current.hit_tokens > best.hit_tokens:
            best = current
    return best


def _bring_under(
    owner: dict[int, str],
    asked: Counter[int],
    loads: Callable[[Mapping[int, str]], Counter[str]],
    limit: float,
    rng: random.Random,
) -> bool:
    """Move random documents off the busiest replica to the idlest until none is over ``limit``."""
    for _ in range(4 * len(asked) + 1):
        load = loads(owner)
        busiest = max(load, key=lambda r: load[r])
        if load[busiest] <= limit:
            return True
        idlest = min(load, key=lambda r: load[r])
        movable = sorted(d for d, r in owner.items() if r == busiest)
        owner[rng.choice(movable)] = idlest
    return False
