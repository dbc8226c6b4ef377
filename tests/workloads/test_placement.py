"""Where a run's requests went by the replicas' own account, and where their documents were computed cold."""

from __future__ import annotations

import math

from burstsched.workloads.docqa_run import RequestRecord
from burstsched.workloads.placement import (
    ReplicaWatch,
    attach_replicas,
    by_document,
    by_session,
    cold_placements,
)
from burstsched.workloads.run_summary import per_replica_counts
from burstsched.workloads.tenants_run import TurnRecord


def _record(index: int, document: int, replica: str | None, cached: int, prompt: int = 1000) -> RequestRecord:
    record = RequestRecord(index, index * 0.1, document=document)
    record.status, record.ttft_ms, record.replica = 200, 50.0, replica
    record.prompt_tokens, record.cached_tokens = prompt, cached
    return record


def test_attach_names_only_unnamed_records_from_the_ids_received_since_the_run_began() -> None:
    records = [_record(0, 1, None, 0), _record(1, 1, "b", 900), _record(2, 2, None, 0)]
    records.append(_record(3, 3, None, 0))
    received = [["old-0", "run-2", "run-0"], ["old-1", "run-1"]]  # "old-*": an earlier run's ids
    named = attach_replicas(records, "run", ["a", "b"], [1, 1], received)
    assert named == 2
    assert [r.replica for r in records] == ["a", "b", "a", None]  # run-3 reached no replica
    assert [r.replica_source for r in records] == ["replicas", None, "replicas", None]
    # ids from before the run do not count: the same id in the old part names nothing
    stale = [_record(0, 1, None, 0)]
    assert attach_replicas(stale, "old", ["a", "b"], [1, 1], received) == 0


def test_cold_requests_split_by_where_their_documents_previous_request_went() -> None:
    records = [
        _record(0, 7, "a", 0),  # first sight of 7: cold, first
        _record(1, 7, "a", 900),  # warm where it lived
        _record(2, 7, "b", 0),  # cold on the other replica: moved
        _record(3, 7, "b", 100),  # cold again on b, where it went last: in place
        _record(4, 8, "b", 0),  # first sight of 8
        _record(5, 8, "a", 800),  # warm on the other replica (a copy there): not cold
        _record(6, 8, "a", 400, prompt=1000),  # 600 of 1000 computed: mostly cold, in place
        _record(7, 9, "a", 0),
    ]
    shares = cold_placements(records, by_document)
    assert (shares.moved, shares.in_place, shares.first) == (1 / 8, 2 / 8, 3 / 8)
    # arrival order is the records' index, whatever order the list is in
    assert cold_placements(list(reversed(records)), by_document) == shares


def test_unknown_replicas_or_failed_requests() -> None:
    records = [_record(0, 1, "a", 0), _record(1, 1, None, 0)]
    assert math.isnan(cold_placements(records, by_document).moved)
    failed = _record(1, 1, None, 0)
    failed.status = 503
    known = cold_placements([records[0], failed], by_document)  # a refused request has no usage to judge
    assert (known.moved, known.in_place, known.first) == (0.0, 0.0, 1.0)


def test_requests_per_replica_say_where_the_names_came_from() -> None:
    records = [_record(0, 1, "a", 0), _record(1, 2, "b", 0)]
    for record in records:
        record.replica_source = "replicas"
    assert per_replica_counts(records, {}) == ({"a": 1, "b": 1}, "replicas")
    records[1].replica_source = "header"
    assert per_replica_counts(records, {})[1] == "header+replicas"


def test_a_watch_names_from_the_ids_received_after_it_was_made() -> None:
    ids = [["old-0"], ["old-1"]]
    watch = ReplicaWatch(lambda: ids)
    ids[0].append("run-0")
    ids[1].append("run-1")
    records = [_record(0, 1, None, 0), _record(1, 1, None, 0)]
    assert watch.name(records, "run", ["a", "b"]) == 2
    assert [r.replica for r in records] == ["a", "b"]
    assert ReplicaWatch(None).name([_record(0, 1, None, 0)], "run", ["a"]) == 0


def test_conversations_are_a_tenants_user() -> None:
    pairs = [(7, 1), (7, 2), (8, 1)]
    turns = [TurnRecord(i, 0.0, tenant=1, user=u, turn=t) for i, (u, t) in enumerate(pairs)]
    assert [by_session(r) for r in turns] == [(1, 7), (1, 7), (1, 8)]
