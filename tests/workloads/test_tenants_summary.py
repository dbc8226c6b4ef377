"""The multi-tenant row splits TTFT p95 between the requests that arrived in a burst and the rest."""

from __future__ import annotations

import pytest

from burstsched.workloads.replica_metrics import ReplicaCounters
from burstsched.workloads.tenants_report import markdown_table
from burstsched.workloads.tenants_run import TurnRecord, summarize


def turn(index: int, ttft_ms: float, *, turn: int, burst: int | None) -> TurnRecord:
    record = TurnRecord(index, float(index), tenant=0, user=index, turn=turn, burst=burst)
    record.sent_s = float(index)
    record.status = 200
    record.ttft_ms = ttft_ms
    record.e2e_ms = ttft_ms + 50.0
    return record


def test_burst_arrivals_and_other_requests_get_their_own_p95() -> None:
    records = [turn(i, 100.0 + i, turn=1, burst=1) for i in range(8)]  # a burst's 8 arrivals
    records += [turn(8, 900.0, turn=2, burst=1)]  # a burst user's later turn counts with the others
    records += [turn(9 + i, 10.0 + i, turn=1, burst=None) for i in range(20)]
    prompts = [[1, 2, 3, 4]] * len(records)
    deltas = {"r0": ReplicaCounters(requests_finished=len(records))}
    summary = summarize("t", 1.0, records, deltas, prompts, block_size=2)
    assert summary.burst_ttft_p95_ms == pytest.approx(100.0 + 0.95 * 7)
    others = sorted([900.0] + [10.0 + i for i in range(20)])
    rank = 0.95 * (len(others) - 1)
    expected = others[int(rank)] + (others[int(rank) + 1] - others[int(rank)]) * (rank - int(rank))
    assert summary.other_ttft_p95_ms == pytest.approx(expected)
    table = markdown_table([summary])
    assert "TTFT p95 bursts / others ms" in table
    assert "107 / " in table
