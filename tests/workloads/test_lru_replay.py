"""Replaying placements through vLLM's block pool, and the best fixed split (workloads/lru_replay.py)."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from burstsched.workloads.lru_replay import (
    Placed,
    balanced_owner,
    best_partition,
    partition,
    replay_hits,
    shared_blocks_of,
)
from burstsched.workloads.report_page import pct
from loadtests.lru_replay import capacity_of, main

BLOCK = 16


def prompt(blocks: int, extra: int = 5) -> int:
    return blocks * BLOCK + extra


def test_a_document_that_fits_hits_all_its_blocks_after_its_first_request() -> None:
    # Two documents of two blocks, and each request's partial last block: five blocks are enough.
    placed = [Placed(d, prompt(2), "a") for d in (0, 1, 0, 1, 0)]
    hits = replay_hits(placed, {0: 2, 1: 2}, block_size=BLOCK, capacity_blocks=5)
    assert hits == [0, 0, 32, 32, 32]
    # With four, the partial block of each request takes a cached one's place while it runs.
    assert replay_hits(placed, {0: 2, 1: 2}, block_size=BLOCK, capacity_blocks=4) != hits


def test_a_full_pool_evicts_the_least_recent_document_and_its_last_blocks_first() -> None:
    # Three full blocks and a partial one each, five in the pool: B takes A's partial block, the free
    # one and A's last two full blocks; A's first stays.
    placed = [Placed(0, prompt(3), "a"), Placed(1, prompt(3), "a"), Placed(0, prompt(3), "a")]
    hits = replay_hits(placed, {0: 3, 1: 3}, block_size=BLOCK, capacity_blocks=5)
    assert hits == [0, 0, BLOCK]


def test_the_output_holds_blocks_too() -> None:
    # 37 prompt tokens and 28 more with KV (29 generated): four full blocks and a partial one, all five
    # of a five-block pool, so B's answer evicts all of A; without outputs A's two blocks stay.
    quiet = [Placed(0, prompt(2), "a"), Placed(1, prompt(2), "a"), Placed(0, prompt(2), "a")]
    talkative = [Placed(0, prompt(2), "a", 29), Placed(1, prompt(2), "a", 29), Placed(0, prompt(2), "a")]
    assert replay_hits(quiet, {0: 2, 1: 2}, block_size=BLOCK, capacity_blocks=5) == [0, 0, 32]
    assert replay_hits(talkative, {0: 2, 1: 2}, block_size=BLOCK, capacity_blocks=5) == [0, 0, 0]


def test_a_hit_leaves_the_prompts_last_token_to_compute() -> None:
    exact = 3 * BLOCK  # the prompt is the document's three blocks and nothing else
    placed = [Placed(0, exact, "a"), Placed(0, exact, "a")]
    assert replay_hits(placed, {0: 3}, block_size=BLOCK, capacity_blocks=8) == [0, 2 * BLOCK]


def test_each_replica_has_its_own_cache_and_a_requests_own_blocks_hit_nobody() -> None:
    placed = [Placed(0, prompt(3), "a"), Placed(0, prompt(3), "b"), Placed(0, prompt(3), "a")]
    # Two of the three full blocks are the document's, the third is each request's own.
    assert replay_hits(placed, {0: 2}, block_size=BLOCK, capacity_blocks=8) == [0, 0, 2 * BLOCK]


def test_a_request_larger_than_the_pool_is_an_error() -> None:
    with pytest.raises(ValueError, match="cannot fit"):
        replay_hits([Placed(0, prompt(5), "a")], {0: 5}, block_size=BLOCK, capacity_blocks=4)


def test_shared_blocks_come_from_the_most_a_request_read_from_cache() -> None:
    seen = [(0, 100, 0), (0, 100, 64), (0, 90, 48), (1, 70, 0), (1, 60, 0)]
    # Document 1 never hit: its shortest prompt's full blocks (3) less one.
    assert shared_blocks_of(seen, BLOCK) == {0: 4, 1: 2}


# Found by a random search over small sequences: the even split puts documents 1, 2 and 3 (seven blocks)
# on a four-block replica, where they push each other out.
DOCUMENTS = [0, 0, 3, 0, 2, 1, 3, 0, 0, 1, 2, 3, 0, 0]
SIZES = {0: 2, 1: 2, 2: 2, 3: 3}
PROMPTS = [prompt(SIZES[d]) for d in DOCUMENTS]


def test_the_balanced_split_deals_the_most_asked_documents_out_first() -> None:
    assert balanced_owner(DOCUMENTS, ["a", "b"]) == {0: "a", 3: "b", 1: "b", 2: "b"}


def test_local_search_finds_a_split_that_hits_more_than_the_balanced_one_within_the_cap() -> None:
    replicas = ["a", "b"]
    even = partition(
        balanced_owner(DOCUMENTS, replicas), DOCUMENTS, PROMPTS, SIZES, block_size=BLOCK, capacity_blocks=4
    )
    best = best_partition(
        DOCUMENTS,
        PROMPTS,
        SIZES,
        replicas=replicas,
        block_size=BLOCK,
        capacity_blocks=4,
        max_share=0.75,
        rng=random.Random(0),
        starts=3,
    )
    assert best is not None
    assert best.hit_tokens > even.hit_tokens
    assert best.largest_share <= 0.75
    assert sum(best.requests.values()) == len(DOCUMENTS)
    again = partition(best.owner, DOCUMENTS, PROMPTS, SIZES, block_size=BLOCK, capacity_blocks=4)
    assert again == best  # what it reports is the replay of the split it returns
    assert sum(best.computed.values()) == best.prompt_tokens - best.hit_tokens


def test_a_cap_no_split_can_meet_gives_none() -> None:
    documents = [0] * 9 + [1]
    best = best_partition(
        documents,
        [prompt(2)] * 10,
        {0: 2, 1: 2},
        replicas=["a", "b"],
        block_size=BLOCK,
        capacity_blocks=4,
        max_share=0.5,
        rng=random.Random(0),
    )
    assert best is None


# Two runs of the same sequence: one router kept every document on one replica, the other split them.
PLACEMENTS = {
    "burstsched:cost": dict.fromkeys(SIZES, "vllm-0"),
    "sglang:cache_aware": {0: "vllm-0", 1: "vllm-1", 2: "vllm-1", 3: "vllm-1"},
}


def report(path: Path) -> Path:
    def request(index: int, document: int, replica: str, cached: int) -> dict[str, object]:
        return {
            "index": index,
            "document": document,
            "arrival_s": index * 0.1,
            "status": 200,
            "replica": replica,
            "prompt_tokens": prompt(SIZES[document]),
            "cached_tokens": cached,
        }

    runs = []
    for target in PLACEMENTS:
        requests = []
        seen: set[int] = set()
        for i, d in enumerate(DOCUMENTS):
            replica = PLACEMENTS[target][d]
            requests.append(request(i, d, replica, SIZES[d] * BLOCK if d in seen else 0))
            seen.add(d)
        runs.append({"rate": 2.0, "summary": {"target": target, "repeat": 1}, "requests": requests})
    data = {"setup": {"KV cache per replica": f"5 blocks of {BLOCK} tokens"}, "runs": runs}  # 4 usable
    out = path / "docqa.json.gz"
    with gzip.open(out, "wt") as handle:
        json.dump(data, handle)
    return out


def test_the_command_prints_each_runs_measured_and_replayed_hits_and_the_splits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(report(tmp_path)), "--max-share", "0.75", "--starts", "2"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("docqa")]
    assert len(lines) == 3  # two runs, one sequence
    cost, sglang, split = lines
    assert "burstsched:cost" in cost and "sglang:cache_aware" in sglang
    for line, target in ((cost, "burstsched:cost"), (sglang, "sglang:cache_aware")):
        placed = [Placed(d, prompt(SIZES[d]), PLACEMENTS[target][d]) for d in DOCUMENTS]
        hits = replay_hits(placed, SIZES, block_size=BLOCK, capacity_blocks=4)
        assert line.split()[-4] == pct(sum(hits) / sum(PROMPTS))
    assert cost.split()[-3:] == ["100%", "/", "0%"]  # every document on vllm-0: it computed everything
    assert "best split found, ≤0.75 on one" in out
    assert "on one)" in split


def test_the_cache_size_is_read_from_the_reports_set_up() -> None:
    assert capacity_of({"setup": {"KV cache per replica": "161 blocks of 128 tokens"}}) == (161, 128)
    with pytest.raises(ValueError, match="--kv-blocks"):
        capacity_of({"setup": {}})


def test_bad_caps_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main([str(report(tmp_path)), "--max-share", "1.5"])
    with pytest.raises(SystemExit):
        main([str(report(tmp_path)), "--max-share", "half"])


def test_the_splits_listing_names_each_replicas_documents_by_popularity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(report(tmp_path)), "--max-share", "0.75", "--starts", "2", "--show-splits"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in out if line.startswith("docqa") and " ≤0.75 " in line]
    assert [row[3] for row in rows] == ["vllm-0", "vllm-1"]
    assert sum(int(row[4]) for row in rows) == len(DOCUMENTS)
    ranks = sorted(int(rank) for row in rows for rank in row[9:])
    assert ranks == [1, 2, 3, 4]  # every document, once
    assert all(row[8] == "4" for row in rows)  # blocks / cache: the cache is four blocks
    assert sum(float(row[5].rstrip("%")) for row in rows) == pytest.approx(100, abs=0.2)
