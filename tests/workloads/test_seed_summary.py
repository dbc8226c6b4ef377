from __future__ import annotations

import pytest

from burstsched.workloads.replica_metrics import ReplicaCounters
from burstsched.workloads.seed import PairRecord, Served, format_table, summarize
from burstsched.workloads.stream_client import StreamResult


def served(replica: str, ttft_s: float, hits: float, queries: float, computed: float) -> Served:
    delta = ReplicaCounters(
        requests_finished=1, prefix_queries=queries, prefix_hits=hits, prefill_computed_tokens=computed
    )
    return Served(replica=replica, result=StreamResult(status=200, ttft_s=ttft_s), delta=delta)


def test_summary_counts_returns_hits_and_splits_warm_and_cold() -> None:
    records = [
        PairRecord(served("a", 2.0, 0, 5000, 5000), served("a", 0.1, 4992, 5000, 8)),
        PairRecord(served("b", 2.0, 0, 5000, 5000), served("a", 2.1, 0, 5000, 5000)),
        PairRecord(served("b", 2.0, 0, 5000, 5000), served("b", 0.2, 4992, 5000, 8)),
    ]
    s = summarize("random", records)
    assert s.returned == 2
    assert s.pairs == 3
    assert s.hit_rate == pytest.approx(2 * 4992 / 15000)
    assert s.prefill_tokens_mean == pytest.approx((8 + 5000 + 8) / 3)
    assert s.warm_ttft_p50_ms == pytest.approx(150.0)
    assert s.cold_ttft_p50_ms == pytest.approx(2100.0)
    assert s.first_requests_per_replica == {"a": 1, "b": 2}
    table = format_table([s])
    assert "2/3 (66.7%)" in table
    assert "66.56%" in table


def test_policy_order_follows_the_seed_and_rotates() -> None:
    from burstsched.workloads.demo import policy_order

    two = ["random", "prefix-aware"]
    assert [policy_order(two, r) for r in range(3)] == [two, two[::-1], two]
    three = ["a", "b", "c"]
    assert [policy_order(three, r)[0] for r in range(3)] == ["a", "b", "c"]
