"""The document-QA sequence: fixed by its seed, Zipf-skewed, bounded; the ideal hit rate by hand."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import replace

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from burstsched.workloads.docqa import (
    MIN_DOCUMENT_TOKENS,
    DocQASpec,
    build_corpus,
    build_sequence,
    ceiling_hits,
    common_prefix_length,
    ideal_hit_rate,
    ideal_hits,
    partitioned_hits,
)
from burstsched.workloads.zipf import ZipfSampler

SPEC = DocQASpec(documents=50, rate=5.0, duration_s=1000.0, max_requests=300, seed=7)


def test_same_seed_gives_the_identical_sequence() -> None:
    first = build_sequence(SPEC, random.Random(7))
    second = build_sequence(SPEC, random.Random(7))
    assert first == second
    assert len(first) == 300
    assert build_sequence(SPEC, random.Random(8)) != first


def test_questions_are_distinct_and_arrivals_increase() -> None:
    requests = build_sequence(SPEC, random.Random(1))
    assert len({r.question for r in requests}) == len(requests)
    arrivals = [r.arrival_s for r in requests]
    assert arrivals == sorted(arrivals)
    assert all(0 <= r.document < SPEC.documents for r in requests)
    assert [r.index for r in requests] == list(range(len(requests)))


def test_rate_changes_only_the_times() -> None:
    slow = build_sequence(SPEC, random.Random(3))
    fast = build_sequence(replace(SPEC, rate=20.0), random.Random(3))
    assert [(r.document, r.question) for r in slow] == [(r.document, r.question) for r in fast]
    for a, b in zip(slow, fast, strict=True):
        assert a.arrival_s == pytest.approx(4 * b.arrival_s)


def test_poisson_rate_is_the_asked_one() -> None:
    requests = build_sequence(replace(SPEC, max_requests=4000, rate=10.0), random.Random(5))
    observed = len(requests) / requests[-1].arrival_s
    assert observed == pytest.approx(10.0, rel=0.06)


def test_sequence_is_bounded_by_duration_and_count() -> None:
    by_time = build_sequence(replace(SPEC, duration_s=10.0), random.Random(2))
    assert by_time and all(r.arrival_s < 10.0 for r in by_time)
    assert len(by_time) < 100  # ~50 expected at 5 requests/s
    by_count = build_sequence(replace(SPEC, max_requests=17), random.Random(2))
    assert len(by_count) == 17
    assert by_count == build_sequence(SPEC, random.Random(2))[:17]


def test_zipf_skew_holds() -> None:
    """Frequencies follow 1/rank^s: the top rank about twice the second for s = 1, within sampling error."""
    sampler = ZipfSampler(20, 1.0)
    rng = random.Random(11)
    n = 40_000
    counts = Counter(sampler.sample(rng) for _ in range(n))
    for rank in range(20):
        expected = n * sampler.probabilities[rank]
        sigma = math.sqrt(expected * (1 - sampler.probabilities[rank]))
        assert abs(counts[rank] - expected) < 5 * sigma, (rank, counts[rank], expected)
    assert counts[0] / counts[1] == pytest.approx(2.0, rel=0.1)
    assert counts[0] > counts[4] > counts[19]


def test_zipf_exponent_sets_the_skew() -> None:
    uniform = ZipfSampler(10, 0.0)
    assert all(p == pytest.approx(0.1) for p in uniform.probabilities)
    steep = ZipfSampler(10, 2.0)
    assert steep.probabilities[0] / steep.probabilities[1] == pytest.approx(4.0)
    with pytest.raises(ValueError):
        ZipfSampler(0, 1.0)


def test_sequence_document_popularity_is_zipf() -> None:
    requests = build_sequence(replace(SPEC, max_requests=5000, documents=10), random.Random(9))
    counts = Counter(r.document for r in requests)
    assert [doc for doc, _ in counts.most_common(3)] == [0, 1, 2]
    assert counts[0] / counts[9] == pytest.approx(10.0, rel=0.35)


def test_spec_refuses_short_documents() -> None:
    with pytest.raises(ValueError, match="longer than 2k"):
        DocQASpec(doc_tokens_min=MIN_DOCUMENT_TOKENS)


# -- ideal hit rate ------------------------------------------------------------------------------------
def test_ideal_hits_on_a_hand_made_sequence() -> None:
    # documents 0 and 1 share 10 and 7 tokens; blocks of 4: full shared blocks 8 and 4 tokens.
    documents = [0, 1, 0, 0, 1, 2]
    shared = [10, 7, 9]
    prompts = [12, 9, 13, 12, 9, 11]
    assert ideal_hits(documents, shared, prompts, 4) == [0, 0, 8, 8, 4, 0]
    assert ideal_hit_rate(documents, shared, prompts, 4) == pytest.approx(20 / 66)


def test_ideal_hit_is_capped_below_the_whole_prompt() -> None:
    """A prompt that is all shared still computes its last token: the hit stops a block short."""
    assert ideal_hits([0, 0], [8], [8, 8], 4) == [0, 4]
    assert ideal_hits([0, 0], [8], [9, 9], 4) == [0, 8]
    assert math.isnan(ideal_hit_rate([], [], [], 16))


@given(
    st.lists(st.integers(0, 5), min_size=1, max_size=40),
    st.lists(st.integers(1, 500), min_size=6, max_size=6),
    st.integers(1, 64),
)
@settings(max_examples=60, deadline=None)
def test_ideal_hits_stay_within_bounds(documents: list[int], shared: list[int], block: int) -> None:
    prompts = [shared[d] + 5 for d in documents]
    hits = ideal_hits(documents, shared, prompts, block)
    first_seen = {d: documents.index(d) for d in set(documents)}
    for i, (hit, prompt) in enumerate(zip(hits, prompts, strict=True)):
        assert 0 <= hit < prompt and hit % block == 0
        if first_seen[documents[i]] == i:
            assert hit == 0
    assert 0.0 <= ideal_hit_rate(documents, shared, prompts, block) < 1.0


def test_partitioned_hits_by_hand() -> None:
    """Blocks of 4. Documents 0 (twice as popular) and 1 go to different replicas; 2 shares replica 1 with
    document 1 and, the cache holding 2 blocks, evicts it; document 0 stays warm on replica 0."""
    documents = [0, 1, 0, 2, 1, 0, 0]
    shared = [8, 8, 8]
    prompts = [12, 12, 12, 12, 12, 12, 12]
    hits = partitioned_hits(documents, shared, prompts, 4, replicas=2, capacity_blocks=2)
    assert hits == [0, 0, 8, 0, 0, 8, 8]
    # one replica large enough for everything: the ideal's hits (each document's first request cold)
    roomy = partitioned_hits(documents, shared, prompts, 4, replicas=1, capacity_blocks=100)
    assert roomy == ideal_hits(documents, shared, prompts, 4)


@given(
    st.lists(st.integers(0, 5), min_size=1, max_size=60),
    st.lists(st.integers(1, 200), min_size=6, max_size=6),
    st.integers(1, 4),
    st.integers(0, 80),
)
@settings(max_examples=60, deadline=None)
def test_even_placement_on_lru_caches_never_beats_the_ceiling_nor_the_ceiling_the_ideal(
    documents: list[int], shared: list[int], replicas: int, capacity: int
) -> None:
    prompts = [shared[d] + 5 for d in documents]
    bound = partitioned_hits(documents, shared, prompts, 8, replicas=replicas, capacity_blocks=capacity)
    ideal = ideal_hits(documents, shared, prompts, 8)
    for hit, best in zip(bound, ideal, strict=True):
        assert 0 <= hit <= best
    ceiling = ceiling_hits(documents, shared, prompts, 8, cache_blocks=replicas * capacity)
    assert all(hit >= 0 for hit in ceiling)
    assert sum(bound) <= sum(ceiling) <= sum(ideal)


def test_ceiling_hits_by_hand() -> None:
    """One block per document, room for two. Document 2 arrives with 0 and 1 cached: the clairvoyant
    cache drops 1 (read again later than 0), so 0 hits next. LRU would have dropped 0 and hit nothing."""
    hits = ceiling_hits([0, 1, 2, 0, 1], [4, 4, 4], [8] * 5, 4, cache_blocks=2)
    assert hits == [0, 0, 0, 4, 0]
    assert partitioned_hits([0, 1, 2, 0, 1], [4, 4, 4], [8] * 5, 4, replicas=1, capacity_blocks=2) == [0] * 5
    # room for everything: the ideal; no room: nothing
    assert ceiling_hits([0, 1, 2, 0, 1], [4, 4, 4], [8] * 5, 4, cache_blocks=3) == [0, 0, 0, 4, 4]
    assert ceiling_hits([0, 1, 2, 0, 1], [4, 4, 4], [8] * 5, 4, cache_blocks=0) == [0] * 5


def _best_block_hits(reads: list[tuple[int, int, bool]], capacity: int) -> int:
    """By exhaustive search: the most hits (reads with ``counts``) over every choice of what to evict."""
    memo: dict[tuple[int, frozenset[tuple[int, int]]], int] = {}

    def best(position: int, cached: frozenset[tuple[int, int]]) -> int:
        if position == len(reads):
            return 0
        key = (position, cached)
        if key not in memo:
            document, block, counts = reads[position]
            read = (document, block)
            if read in cached:
                memo[key] = int(counts) + best(position + 1, cached)
            elif capacity == 0:
                memo[key] = best(position + 1, cached)
            elif len(cached) < capacity:
                memo[key] = best(position + 1, cached | {read})
            else:
                memo[key] = max(best(position + 1, (cached - {victim}) | {read}) for victim in cached)
        return memo[key]

    return best(0, frozenset())


@given(
    st.lists(st.integers(0, 2), min_size=1, max_size=7),
    st.lists(st.integers(4, 12), min_size=3, max_size=3),
    st.integers(0, 4),
)
@settings(max_examples=80, deadline=None)
def test_ceiling_hits_are_the_best_any_eviction_gets(
    documents: list[int], shared: list[int], capacity: int
) -> None:
    prompts = [shared[d] + 1 for d in documents]
    reads = [
        (d, b, b < (min(shared[d] // 4 * 4, (prompt - 1) // 4 * 4)) // 4)
        for d, prompt in zip(documents, prompts, strict=True)
        for b in range(shared[d] // 4)
    ]
    hits = ceiling_hits(documents, shared, prompts, 4, cache_blocks=capacity)
    assert sum(hits) == 4 * _best_block_hits(reads, capacity)


# -- corpus --------------------------------------------------------------------------------------------
async def _char_tokens(text: str) -> list[int]:
    """A stand-in tokenizer: one token per character, after a 3-token chat header."""
    await anyio.lowlevel.checkpoint()
    return [1, 2, 3, *map(ord, text)]


@pytest.mark.anyio
async def test_corpus_documents_reach_their_drawn_lengths() -> None:
    spec = DocQASpec(documents=5, doc_tokens_min=2100, doc_tokens_max=2400, seed=4)
    corpus = await build_corpus(spec, _char_tokens, random.Random(0))
    again = await build_corpus(spec, _char_tokens, random.Random(0))
    assert corpus == again
    assert len(set(corpus.texts)) == 5
    for text, shared in zip(corpus.texts, corpus.shared_tokens, strict=True):
        assert shared >= 2100
        # the shared part is the header, the document, the separator and "Question "
        assert shared == 3 + len(text) + len("\n\nQuestion ")
    # no two documents share their first block of 16 characters
    assert len({t[:16] for t in corpus.texts}) == 5
    assert corpus.blocks([0, 0, 1], 16) == corpus.shared_tokens[0] // 16 + corpus.shared_tokens[1] // 16


def test_common_prefix_length() -> None:
    assert common_prefix_length([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_length([], [1]) == 0
