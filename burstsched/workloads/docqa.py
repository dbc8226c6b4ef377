"""Document QA: many long documents, skewed popularity, one short question per request.

The workload burstsched is judged on. ``D`` documents, each longer than 2k tokens and built like the seed
experiment's contexts (distinct operations observations after a unique id, so no two documents share a
block), are asked questions: each request is one document followed by a question no other request asks,
as one user chat message. Documents are drawn by a Zipf law (a few are hot, most are cold) and requests
arrive as a Poisson process. With enough documents the distinct document blocks exceed all the replicas'
KV caches together, so where a request lands decides whether its document is still cached there.

Everything here is pure and deterministic: :func:`build_sequence` fixes the request sequence (documents,
questions, arrival times) from an injected RNG, so every routing policy gets the identical sequence;
:func:`build_corpus` sizes the documents with a tokenizer callback (the replica's ``/tokenize``);
:func:`ideal_hits` is the hit rate perfect document affinity with an infinite cache would reach.
Running the sequence against a URL is :mod:`burstsched.workloads.docqa_run`.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from burstsched.workloads.contexts import context_text
from burstsched.workloads.zipf import ZipfSampler

Tokenize = Callable[[str], Awaitable[list[int]]]
"""Token ids of a text sent as one user chat message (chat template applied), as the replicas count them."""

MIN_DOCUMENT_TOKENS = 2048
SEPARATOR = "\n\n"
QUESTION_TEXTS = (
    "Which host degraded first, and when?",
    "What single change would you roll back?",
    "Which signal looks like noise?",
    "Name the two most worrying observations.",
    "Which service should be paged?",
    "What happened during the nightly batch?",
    "Which metric leads the others?",
    "Summarize the incident in one sentence.",
    "What should engineers measure next?",
    "Is there evidence of a regional traffic shift?",
    "Which observation contradicts the rest?",
    "What is the likely blast radius?",
)


@dataclass(frozen=True, slots=True)
class DocQASpec:
    """One document-QA workload. Lengths are in the replicas' tokens, rates in requests per second."""

    documents: int = 100
    zipf_exponent: float = 1.0
    doc_tokens_min: int = 2200
    doc_tokens_max: int = 3600
    max_tokens: int = 16
    rate: float = 2.0
    duration_s: float = 60.0
    max_requests: int = 400
    seed: int = 0

    def __post_init__(self) -> None:
        if self.documents < 1:
            raise ValueError("documents must be >= 1")
        if self.doc_tokens_min <= MIN_DOCUMENT_TOKENS:
            raise ValueError(f"doc_tokens_min must be > {MIN_DOCUMENT_TOKENS} (documents longer than 2k)")
        if self.doc_tokens_max < self.doc_tokens_min:
            raise ValueError("doc_tokens_max must be >= doc_tokens_min")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if self.rate <= 0 or self.duration_s <= 0 or self.max_requests < 1:
            raise ValueError("rate and duration_s must be > 0, max_requests >= 1")
        if self.zipf_exponent < 0:
            raise ValueError("zipf_exponent must be >= 0")


@dataclass(frozen=True, slots=True)
class DocQARequest:
    """One request of the sequence: which document, which question, when it is sent (s from the start);
    with classes (:mod:`burstsched.workloads.docqa_classes`), its class and the headers it sends."""

    index: int
    document: int
    question: str
    arrival_s: float
    request_class: str = ""
    headers: tuple[tuple[str, str], ...] = ()


def question_text(index: int, rng: random.Random) -> str:
    """A question no other request of the sequence asks (it carries the request's number)."""
    return f"Question {index + 1}: {rng.choice(QUESTION_TEXTS)}"


def build_sequence(spec: DocQASpec, rng: random.Random) -> list[DocQARequest]:
    """The request sequence: Zipf-drawn documents, distinct questions, Poisson arrivals at ``spec.rate``.

    Each request takes the same three draws from ``rng`` whatever the rate (its gap is a unit exponential
    divided by the rate), so one seed gives the same documents and questions at every rate, only spread
    over time differently. The sequence ends at ``max_requests`` or at ``duration_s``, whichever is first.
    """
    sampler = ZipfSampler(spec.documents, spec.zipf_exponent)
    requests: list[DocQARequest] = []
    now = 0.0
    for index in range(spec.max_requests):
        now += rng.expovariate(1.0) / spec.rate
        document = sampler.sample(rng)
        question = question_text(index, rng)
        if now >= spec.duration_s:
            break
        requests.append(DocQARequest(index, document, question, now))
    return requests


def prompt_text(document_text: str, question: str) -> str:
    """The user message: the whole document, then the question."""
    return f"{document_text}{SEPARATOR}{question}"


def document_text(seed: int, document: int, lines: int) -> str:
    """Document ``document`` of the corpus ``seed``: ``lines`` observations after a unique id."""
    return context_text(f"doc-{document}-corpus-{seed}", lines, seed * 1_000_003 + document)


def common_prefix_length(a: Sequence[object], b: Sequence[object]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True, slots=True)
class Corpus:
    """The documents' texts and, per document, the tokens every request of it shares (chat-rendered)."""

    seed: int
    texts: tuple[str, ...]
    shared_tokens: tuple[int, ...]

    def prompt(self, request: DocQARequest) -> str:
        return prompt_text(self.texts[request.document], request.question)

    def blocks(self, documents: Sequence[int] | None, block_size: int) -> int:
        """Distinct full blocks of the given documents' shared parts (all documents when None)."""
        chosen = range(len(self.texts)) if documents is None else sorted(set(documents))
        return sum(self.shared_tokens[d] // block_size for d in chosen)


async def shared_tokens(tokenize: Tokenize, text: str) -> int:
    """Tokens every request of a document shares: the common prefix of two prompts whose questions differ
    from their number on (chat template included, so it is what the engine's prefix cache can share)."""
    first = await tokenize(prompt_text(text, "Question 1: " + QUESTION_TEXTS[0]))
    second = await tokenize(prompt_text(text, "Question 2: " + QUESTION_TEXTS[3]))
    return common_prefix_length(first, second)


async def remeasure_corpus(corpus: Corpus, tokenize: Tokenize) -> Corpus:
    """The same texts with their shared tokens counted by ``tokenize`` (the serving replicas' own)."""
    counts = [await shared_tokens(tokenize, text) for text in corpus.texts]
    return Corpus(corpus.seed, corpus.texts, tuple(counts))


async def build_corpus(spec: DocQASpec, tokenize: Tokenize, rng: random.Random) -> Corpus:
    """``spec.documents`` documents, each of a length drawn uniformly in the spec's token range.

    One sample document gives the tokens per line; each document then gets enough lines for its drawn
    length, and lines are added until the tokens shared by two different questions on it (the part every
    request of the document shares) reach that length. ``rng`` draws the lengths only; the texts depend on
    ``spec.seed`` and the tokenizer.
    """
    sample_lines = 40
    sample = await tokenize(document_text(spec.seed, -1, sample_lines))
    tokens_per_line = max(1.0, len(sample) / sample_lines)
    texts: list[str] = []
    shared: list[int] = []
    for document in range(spec.documents):
        target = rng.randint(spec.doc_tokens_min, spec.doc_tokens_max)
        lines = math.ceil(target / tokens_per_line)
        for _ in range(8):
            text = document_text(spec.seed, document, lines)
            count = await shared_tokens(tokenize, text)
            if count >= target:
                break
            lines += max(1, math.ceil((target - count) / tokens_per_line))
        else:
            raise RuntimeError(f"document {document}: could not reach {target} tokens (tokenizer?)")
        texts.append(text)
        shared.append(count)
    return Corpus(spec.seed, tuple(texts), tuple(shared))


def ideal_hits(
    documents: Sequence[int], shared_tokens: Sequence[int], prompt_tokens: Sequence[int], block_size: int
) -> list[int]:
    """Per request, the prefix-cache hit (tokens) of perfect document affinity with an infinite cache.

    A document's first request is cold (0); every later one hits all full blocks of the part it shares
    with the earlier ones, capped as vLLM caps a hit: at the prompt's length less one token, rounded down
    to whole blocks (the last token is always computed).
    """
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    if len(documents) != len(prompt_tokens):
        raise ValueError("one prompt length per request")
    seen: set[int] = set()
    hits: list[int] = []
    for document, prompt in zip(documents, prompt_tokens, strict=True):
        if document in seen:
            hits.append(_hit(shared_tokens[document], prompt, block_size))
        else:
            seen.add(document)
            hits.append(0)
    return hits


def _hit(shared_tokens: int, prompt_tokens: int, block_size: int) -> int:
    """A cached document's hit: its full shared blocks, at most the prompt less one token in whole blocks."""
    shared = shared_tokens // block_size * block_size
    return max(0, min(shared, (prompt_tokens - 1) // block_size * block_size))


def partitioned_hits(
    documents: Sequence[int],
    shared_tokens: Sequence[int],
    prompt_tokens: Sequence[int],
    block_size: int,
    *,
    replicas: int,
    capacity_blocks: int,
) -> list[int]:
    """Per request, the hit (tokens) of perfect document affinity on ``replicas`` LRU caches of
    ``capacity_blocks`` blocks each, as vLLM's prefix cache evicts.

    Each document lives on one replica, never two: documents are dealt out most requested first, each to
    the replica with the fewest requests so far, so the load is even. A request hits its document's full
    shared blocks (capped as in :func:`ideal_hits`) while they are cached, else computes and caches them,
    evicting the least recently used documents. Questions never fill a block here and are not cached. What
    this gives is the hit rate of even placement that wastes no cache on copies. It is a yardstick, not a
    ceiling: a router beats it by choosing which documents the caches keep, e.g. sending rarely asked
    ones where they evict nothing popular, at the price of uneven load.
    """
    if block_size < 1 or replicas < 1:
        raise ValueError("block_size and replicas must be >= 1")
    if len(documents) != len(prompt_tokens):
        raise ValueError("one prompt length per request")
    asked = Counter(documents)
    owner: dict[int, int] = {}
    load = [0] * replicas
    for document, count in sorted(asked.items(), key=lambda item: (-item[1], item[0])):
        replica = min(range(replicas), key=lambda r: (load[r], r))
        owner[document] = replica
        load[replica] += count
    caches: list[OrderedDict[int, int]] = [OrderedDict() for _ in range(replicas)]
    used = [0] * replicas
    hits: list[int] = []
    for document, prompt in zip(documents, prompt_tokens, strict=True):
        replica = owner[document]
        cache = caches[replica]
        if document in cache:
            cache.move_to_end(document)
            hits.append(_hit(shared_tokens[document], prompt, block_size))
            continue
        hits.append(0)
        blocks = shared_tokens[document] // block_size
        cache[document] = blocks
        used[replica] += blocks
        while used[replica] > capacity_blocks and cache:
            _, evicted = cache.popitem(last=False)
            used[replica] -= evicted
    return hits


def ceiling_hits(
    documents: Sequence[int],
    shared_tokens: Sequence[int],
    prompt_tokens: Sequence[int],
    block_size: int,
    *,
    cache_blocks: int,
) -> list[int]:
    """Per request, the hit (tokens) of a clairvoyant cache of ``cache_blocks`` blocks: a ceiling for any
    router over caches that hold that many blocks together.

    Every request reads its document's full shared blocks in order; a block read while cached is a hit
    (up to the request's cap, as in :func:`ideal_hits`), one that is not is computed and cached. When the
    cache is full it evicts the block whose next read lies furthest ahead (Belady's MIN), which misses the
    fewest blocks of any policy that caches what it computes (blocks are all one size).

    No router does better over replicas whose caches hold ``cache_blocks`` in all: whatever they hold at
    a moment is a set of at most that many blocks that grew only by computing blocks, as here, and a hit
    on a replica also needs the whole prefix there. So the ideal's gap above this is the cache's size,
    not routing. Questions never fill a block here and are not cached.
    """
    if block_size < 1 or cache_blocks < 0:
        raise ValueError("block_size must be >= 1 and cache_blocks >= 0")
    if len(documents) != len(prompt_tokens):
        raise ValueError("one prompt length per request")
    reads = [
        (document, block) for document in documents for block in range(shared_tokens[document] // block_size)
    ]
    next_read = [len(reads)] * len(reads)  # where each read's block is read next (len: never)
    upcoming: dict[tuple[int, int], int] = {}
    for position in range(len(reads) - 1, -1, -1):
        next_read[position] = upcoming.get(reads[position], len(reads))
        upcoming[reads[position]] = position
    cached: dict[tuple[int, int], int] = {}  # block -> its next read
    furthest: list[tuple[int, tuple[int, int]]] = []  # max-heap of (-next read, block); stale entries skipped
    hits: list[int] = []
    position = 0
    for document, prompt in zip(documents, prompt_tokens, strict=True):
        readable = _hit(shared_tokens[document], prompt, block_size) // block_size
        hit_blocks = 0
        for block in range(shared_tokens[document] // block_size):
            key = (document, block)
            position += 1
            if key in cached:
                hit_blocks += block < readable
            elif cache_blocks == 0:
                continue  # nothing is ever cached
            elif len(cached) >= cache_blocks:
                while True:  # evict the block read again furthest ahead
                    then, victim = heapq.heappop(furthest)
                    if cached.get(victim) == -then:
                        del cached[victim]
                        break
            cached[key] = next_read[position - 1]
            heapq.heappush(furthest, (-cached[key], key))
        hits.append(hit_blocks * block_size)
    return hits


def ideal_hit_rate(
    documents: Sequence[int], shared_tokens: Sequence[int], prompt_tokens: Sequence[int], block_size: int
) -> float:
    """Σ ideal hits / Σ prompt tokens (NaN for an empty sequence): the measured hit rate's ceiling."""
    total = sum(prompt_tokens)
    if total == 0:
        return math.nan
    return sum(ideal_hits(documents, shared_tokens, prompt_tokens, block_size)) / total
