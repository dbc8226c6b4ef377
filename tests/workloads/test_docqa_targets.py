"""Targets, the run summary and the report table, on hand-made inputs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from burstsched.workloads.docqa import Corpus
from burstsched.workloads.docqa_report import markdown_table
from burstsched.workloads.docqa_run import RequestRecord, summarize
from burstsched.workloads.replica_metrics import ReplicaCounters
from burstsched.workloads.targets import ClientRandomTarget, TargetSpec, burstsched_target, parse_targets

ENDPOINTS = [("a", "http://127.0.0.1:1"), ("b", "http://127.0.0.1:2"), ("c", "http://127.0.0.1:3")]


def test_parse_targets_keeps_order_and_options() -> None:
    specs = parse_targets("burstsched:config/default.yaml, random,sglang:cache_aware,vllm-router:cache_aware")
    assert specs == [
        TargetSpec("burstsched", "config/default.yaml"),
        TargetSpec("random"),
        TargetSpec("sglang", "cache_aware"),
        TargetSpec("vllm-router", "cache_aware"),
    ]
    assert [s.label for s in specs] == [
        "burstsched:default",
        "random",
        "sglang:cache_aware",
        "vllm-router:cache_aware",
    ]
    with pytest.raises(ValueError, match="twice"):
        parse_targets("random,random")
    with pytest.raises(ValueError, match="empty"):
        parse_targets("random,,sglang")
    assert burstsched_target(Path("config/burst.yaml")).label == "burstsched:burst"


@pytest.mark.anyio
async def test_client_random_is_seeded_per_request_and_spreads() -> None:
    async with ClientRandomTarget(seed=3).open(ENDPOINTS) as route:
        first = [route(i).replica for i in range(300)]
        again = [route(i).replica for i in reversed(range(300))][::-1]
    async with ClientRandomTarget(seed=4).open(ENDPOINTS) as other:
        different = [other(i).replica for i in range(300)]
    assert first == again
    assert first != different
    assert all(first.count(name) > 70 for name in "abc")
    async with ClientRandomTarget().open(ENDPOINTS) as route:
        assert route(0).base_url == dict(ENDPOINTS)[route(0).replica or ""]


def _record(
    index: int, document: int, replica: str | None, *, ok: bool = True, **kw: object
) -> RequestRecord:
    record = RequestRecord(index, index * 0.1, sent_s=index * 0.1, replica=replica, document=document)
    if ok:
        record.status, record.ttft_ms, record.e2e_ms = 200, 10.0 * (index + 1), 100.0
        record.prompt_tokens, record.completion_tokens = 40, 4
        record.cached_tokens = 32 if index else 0
    else:
        record.error = "boom"
    for key, value in kw.items():
        setattr(record, key, value)
    return record


def test_summary_combines_client_and_replica_measurements() -> None:
    corpus = Corpus(0, ("x", "y"), (36, 36))
    records = [_record(0, 0, "a"), _record(1, 0, "b"), _record(2, 0, "a"), _record(3, 1, None, ok=False)]
    deltas = {
        "a": ReplicaCounters(
            requests_finished=2, prefix_queries=80, prefix_hits=32, prefill_computed_tokens=48
        ),
        "b": ReplicaCounters(
            requests_finished=1, prefix_queries=40, prefix_hits=0, prefill_computed_tokens=40
        ),
    }
    s = summarize("t", 2.0, records, deltas, corpus, block_size=16)
    assert (s.requests, s.completed, s.failures) == (4, 3, 1)
    assert s.hit_rate == pytest.approx(32 / 120)
    assert s.ideal_hit_rate == pytest.approx(64 / 120)  # 2nd and 3rd requests of doc 0: 2 blocks of 16 each
    assert s.usage_hit_rate == pytest.approx(64 / 120)
    assert s.prefill_tokens_mean == pytest.approx(88 / 3)
    assert s.requests_per_replica == {"a": 2, "b": 1}
    assert s.replica_source == "client"
    assert s.ttft_p50_ms == pytest.approx(20.0)
    assert s.makespan_s == pytest.approx(0.3)
    assert s.throughput_rps == pytest.approx(10.0)
    assert s.output_tokens_per_s == pytest.approx(40.0)
    assert s.send_lag_p99_ms == pytest.approx(0.0)
    row = markdown_table([s]).splitlines()[-1]
    assert "26.7%" in row and "53.3%" in row and "2/1 (client)" in row
    assert math.isnan(s.cache_bound_hit_rate) and "| -" in row  # no partition given: no LRU affinity
    assert math.isnan(s.ceiling_hit_rate)
    # on 2 replicas of 2 blocks, document 0's 2 blocks stay cached: the ideal's hits
    roomy = summarize("t", 2.0, records, deltas, corpus, block_size=16, partition=(2, 2))
    assert roomy.cache_bound_hit_rate == pytest.approx(64 / 120)
    assert roomy.ceiling_hit_rate == pytest.approx(64 / 120)
    # only the document's first request computes more than half its prompt, in the run and under the ceiling
    assert roomy.ceiling_cold_share == pytest.approx(1 / 3)
    assert roomy.cold_ttft_p50_ms == pytest.approx(10.0)
    no_room = summarize("t", 2.0, records, deltas, corpus, block_size=16, partition=(1, 0))
    assert no_room.ceiling_cold_share == 1.0
    # a 1-block cache cannot hold a document: nothing hits
    tight = summarize("t", 2.0, records, deltas, corpus, block_size=16, partition=(2, 1))
    assert tight.cache_bound_hit_rate == 0.0
    # ... but the two caches' 2 blocks together could: the ceiling counts what any placement might keep
    assert tight.ceiling_hit_rate == pytest.approx(64 / 120)
    cells = [c.strip() for c in markdown_table([tight]).splitlines()[-1].split("|")]
    assert cells[7:10] == ["0.0%", "53.3%", "53.3%"]  # LRU affinity, ceiling, ideal
    assert cells[11:13] == ["33.3%", "10"]  # ceiling cold, cold TTFT p50


def test_summary_falls_back_to_counters_without_a_replica_name() -> None:
    corpus = Corpus(0, ("x",), (36,))
    records = [_record(0, 0, None), _record(1, 0, None)]
    deltas = {"a": ReplicaCounters(requests_finished=2), "b": ReplicaCounters()}
    s = summarize("peer", 1.0, records, deltas, corpus, block_size=16)
    assert s.requests_per_replica == {"a": 2, "b": 0}
    assert s.replica_source == "counters"
    assert math.isnan(s.hit_rate)
    with_header = [_record(0, 0, "b", headers={"x-burstsched-endpoint": "b"})]
    assert summarize("r", 1.0, with_header, deltas, corpus, 16).replica_source == "header"
