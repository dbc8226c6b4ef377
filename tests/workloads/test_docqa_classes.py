"""Document-QA classes: exact, seeded shares with their headers; a noisy tenant on top of the same base
requests; the row per class; the headers sent and the Retry-After kept, through the open loop."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from dataclasses import replace

import httpx
import pytest

from burstsched.workloads.docqa import Corpus, DocQARequest, DocQASpec, build_sequence
from burstsched.workloads.docqa_classes import (
    FAIRNESS_HEADER,
    OBJECTIVE_HEADER,
    ClassPlan,
    NoisyTenant,
    RequestClass,
    class_counts,
    classed_sequence,
    parse_classes,
    parse_noisy_tenant,
    plan_of,
    summarize_classes,
)
from burstsched.workloads.docqa_report import class_table, report_markdown
from burstsched.workloads.docqa_run import RequestRecord, run_sequence, summarize
from burstsched.workloads.targets import Dispatch

SPEC = DocQASpec(documents=40, rate=5.0, duration_s=1000.0, max_requests=400, seed=3)
CLASSES = "urgent:0.3:objective=urgent,batch:0.2:objective=batch:tenant=b,rest:0.5:tenant=r"


def _sequence(plan: ClassPlan, spec: DocQASpec = SPEC) -> list[DocQARequest]:
    return classed_sequence(spec, build_sequence(spec, random.Random(spec.seed)), plan)


def _base(requests: list[DocQARequest], noisy: str) -> list[tuple[object, ...]]:
    """What makes a base request itself (everything but its index), the noisy tenant's left out."""
    return [
        (r.document, r.question, r.arrival_s, r.request_class, r.headers)
        for r in requests
        if r.request_class != noisy
    ]


# -- parsing -------------------------------------------------------------------------------------------
def test_classes_parse_with_their_headers() -> None:
    urgent, batch, rest = parse_classes(CLASSES)
    assert urgent == RequestClass("urgent", 0.3, objective="urgent")
    assert urgent.headers() == ((OBJECTIVE_HEADER, "urgent"),)
    assert batch.headers() == ((OBJECTIVE_HEADER, "batch"), (FAIRNESS_HEADER, "b"))
    assert rest.headers() == ((FAIRNESS_HEADER, "r"),)
    assert parse_classes("all:1")[0].headers() == ()
    assert [c.describe() for c in (urgent, batch, parse_classes("all:1")[0])] == [
        "objective=urgent",
        "objective=batch tenant=b",
        "-",
    ]
    assert parse_noisy_tenant("loud:5") == NoisyTenant("loud", 5.0)
    assert parse_noisy_tenant("loud:2.5:objective=batch").objective == "batch"


@pytest.mark.parametrize(
    ("classes", "noisy", "message"),
    [
        ("a:0.5,b:0.4", None, "sum to 1"),
        ("a:0.5,a:0.5", None, "distinct"),
        ("a:0.5:prio=x,b:0.5", None, "objective="),
        ("a:0.5:tenant=x:tenant=y,b:0.5", None, "twice"),
        ("a:half,b:0.5", None, "name:share"),
        ("a", None, "name:share"),
        ("a:0,b:1", None, "share"),
        ("a b:1", None, "without spaces"),
        ("a:1:tenant=", None, "non-empty"),
        ("a:1", "a:5", "a class has that name"),
        ("a:1:tenant=t", "t:5", "already sends as it"),
        (None, "t:-1", "factor"),
        (None, "t", "NAME:FACTOR"),
        (None, "t:2:tenant=x", "objective="),
    ],
)
def test_bad_specs_are_refused(classes: str | None, noisy: str | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_of(classes, noisy)


def test_no_classes_no_plan_and_a_noisy_tenant_alone_gets_one_base_class() -> None:
    assert plan_of(None, None) is None
    plan = plan_of(None, "loud:5")
    assert plan is not None and plan.classes == (RequestClass("base", 1.0),)
    # no class names a tenant: the others are the whole sequence, one flow
    assert plan.others_rate(4.0) == 4.0 and plan.noisy_rate(4.0) == 20.0


def test_the_others_rate_is_the_mean_base_tenant_rate() -> None:
    plan = plan_of("a:0.2:tenant=x,b:0.3:tenant=x,c:0.4:tenant=y,d:0.1", "loud:5")
    assert plan is not None
    assert plan.tenants() == ["x", "y"]
    assert plan.others_rate(10.0) == pytest.approx(4.5)  # (5 + 4) / 2 requests/s per tenant
    assert plan.noisy_rate(10.0) == pytest.approx(22.5)


# -- assignment ----------------------------------------------------------------------------------------
def test_class_counts_are_exact_by_largest_remainders() -> None:
    classes = parse_classes(CLASSES)
    assert class_counts(classes, 400) == [120, 80, 200]
    assert class_counts(classes, 7) == [2, 1, 4]  # 2.1, 1.4, 3.5: the two largest remainders get one more
    thirds = parse_classes("a:0.333334,b:0.333333,c:0.333333")
    assert class_counts(thirds, 4) == [2, 1, 1]  # equal remainders: the earlier class
    assert class_counts(thirds, 0) == [0, 0, 0]


def test_assignment_is_exact_seeded_and_the_same_at_every_rate() -> None:
    plan = plan_of(CLASSES, None)
    assert plan is not None
    requests = _sequence(plan)
    assert len(requests) == SPEC.max_requests
    assert Counter(r.request_class for r in requests) == {"urgent": 120, "batch": 80, "rest": 200}
    assert _sequence(plan) == requests  # the same for every target
    by_class = {c.name: c.headers() for c in plan.classes}
    assert all(r.headers == by_class[r.request_class] for r in requests)
    # the base sequence is untouched, only classed
    base = build_sequence(SPEC, random.Random(SPEC.seed))
    assert [replace(r, request_class="", headers=()) for r in requests] == base
    # request i has one class at every rate, and a sequence cut short keeps its prefix's classes
    faster = _sequence(plan, replace(SPEC, rate=20.0))
    assert [r.request_class for r in faster] == [r.request_class for r in requests]
    short = _sequence(plan, replace(SPEC, duration_s=20.0))
    assert 50 < len(short) < 150
    assert [r.request_class for r in short] == [r.request_class for r in requests[: len(short)]]
    # the classes are shuffled over the sequence, not dealt in runs
    assert {r.request_class for r in requests[:40]} == {"urgent", "batch", "rest"}
    # another seed, another deal
    other = _sequence(plan, replace(SPEC, seed=4))
    assert [r.request_class for r in other] != [r.request_class for r in requests]


# -- the noisy tenant ----------------------------------------------------------------------------------
def test_a_noisy_tenant_adds_its_requests_on_top_of_the_same_base() -> None:
    quiet = plan_of(CLASSES, None)
    loud = plan_of(CLASSES, "loud:5")
    assert quiet is not None and loud is not None
    without, with_ = _sequence(quiet), _sequence(loud)
    assert _base(with_, "loud") == _base(without, "loud")  # the base requests, identical
    assert [r.index for r in with_] == list(range(len(with_)))
    assert [r.arrival_s for r in with_] == sorted(r.arrival_s for r in with_)
    extra = [r for r in with_ if r.request_class == "loud"]
    assert all(r.headers == ((FAIRNESS_HEADER, "loud"),) for r in extra)
    assert len({r.question for r in with_}) == len(with_)  # every question still asked once
    assert all(0 <= r.document < SPEC.documents for r in extra)
    # within the base sequence's span (it stopped at max_requests), at 5x a tenant's mean rate
    span = without[-1].arrival_s
    assert all(r.arrival_s < span for r in extra)
    expected = loud.noisy_rate(SPEC.rate) * span  # 5 x (0.7 x 5 / 2) requests/s
    assert len(extra) == pytest.approx(expected, rel=4 / math.sqrt(expected))
    # the same requests at another rate, only their times scaled
    faster = [r for r in _sequence(loud, replace(SPEC, rate=20.0)) if r.request_class == "loud"]
    assert [(r.document, r.question) for r in faster] == [(r.document, r.question) for r in extra]
    for slow, fast in zip(extra, faster, strict=True):
        assert slow.arrival_s == pytest.approx(4 * fast.arrival_s)
    assert _sequence(loud) == with_


def test_a_noisy_tenant_stops_at_the_duration_when_the_base_does() -> None:
    plan = plan_of(None, "loud:2:objective=batch")
    assert plan is not None
    spec = replace(SPEC, duration_s=10.0)
    requests = _sequence(plan, spec)
    extra = [r for r in requests if r.request_class == "loud"]
    assert 60 < len(extra) < 140  # ~100 at 10 requests/s for 10 s
    assert all(r.arrival_s < 10.0 for r in extra)
    assert extra[0].headers == ((OBJECTIVE_HEADER, "batch"), (FAIRNESS_HEADER, "loud"))
    assert {r.request_class for r in requests} == {"base", "loud"}


# -- the row per class ---------------------------------------------------------------------------------
def _record(index: int, klass: str, **fields: object) -> RequestRecord:
    record = RequestRecord(index, 0.1 * index, sent_s=0.1 * index, document=0, request_class=klass)
    for key, value in fields.items():
        setattr(record, key, value)
    return record


def _ok(index: int, klass: str, ttft_ms: float) -> RequestRecord:
    return _record(index, klass, status=200, ttft_ms=ttft_ms, e2e_ms=ttft_ms + 50, prompt_tokens=40)


def test_summary_per_class_counts_outcomes_and_goodput() -> None:
    plan = plan_of("urgent:0.5:objective=urgent,batch:0.5:objective=batch", "loud:5")
    assert plan is not None
    records = [
        _ok(0, "urgent", 100.0),
        _ok(1, "urgent", 300.0),
        _ok(2, "urgent", 2500.0),  # completed, but past the objective
        _record(3, "urgent", error="ReadTimeout: timed out"),
        _record(4, "batch", status=429, headers={"retry-after": "2"}),
        _record(5, "batch", status=429, headers={"retry-after": "1"}),
        _record(6, "batch", status=429),
        _record(7, "batch", status=503),
        _ok(8, "batch", 1000.0),
        _record(9, "loud", error="not finished within the drain timeout"),
        _record(10, "loud", status=200, error="upstream cut the stream", ttft_ms=20.0),
    ]
    rows = summarize_classes(plan, records, slo_ms=2000.0, makespan_s=2.0)
    urgent, batch, loud = rows
    assert (urgent.request_class, urgent.headers) == ("urgent", "objective=urgent")
    assert (urgent.sent, urgent.completed, urgent.refused_429) == (4, 3, 0)
    assert (urgent.other_failures, urgent.timed_out) == (1, 1)
    assert urgent.ttft_p50_ms == 300.0 and urgent.ttft_p99_ms == pytest.approx(2456.0)
    assert (urgent.good, urgent.goodput_rps) == (2, 1.0)
    assert (batch.sent, batch.completed, batch.refused_429, batch.retry_after_429) == (5, 1, 3, 2)
    assert (batch.other_failures, batch.timed_out) == (1, 0)  # the 503
    assert batch.ttft_p95_ms == 1000.0 and batch.good == 1
    assert (loud.request_class, loud.headers) == ("loud", "tenant=loud")
    assert (loud.sent, loud.completed, loud.other_failures, loud.timed_out) == (2, 0, 2, 1)
    assert math.isnan(loud.ttft_p50_ms) and loud.good == 0
    assert sum(r.sent for r in rows) == len(records)
    assert json.loads(json.dumps(batch.as_json()))["retry_after_429"] == 2
    # the table and the page
    run = summarize("burstsched:x", 5.0, records, {}, Corpus(0, ("x",), (36,)), 16)
    table = class_table([(run, c) for c in rows])
    cells = [c.strip() for c in table.splitlines()[3].split("|")[1:-1]]
    assert cells == [
        "burstsched:x",
        "5.00",
        "batch",
        "objective=batch",
        "5",
        "1",
        "3",
        "2",
        "1",
        "0",
        "1000 / 1000 / 1000",
        "1",
        "0.50",
    ]
    page = report_markdown("t", "cmd", {}, [run], {}, [], classes=[(run, c) for c in rows], slo_ms=1500)
    assert table in page and "TTFT ≤ 1500 ms" in page
    assert "429 with Retry-After" not in report_markdown("t", "cmd", {}, [run], {}, [])
    # the flow queue's tally, when the router had one
    assert "queue outcome" not in page
    queued = replace(
        run, flow_queue={"released": {"requests": 4, "longest_wait_s": 1.2345, "most_overtaken": 3}}
    )
    page = report_markdown("t", "cmd", {}, [queued], {}, [])
    row = next(line for line in page.splitlines() if "| released" in line)
    assert [c.strip() for c in row.split("|")[1:-1]] == ["burstsched:x", "5.00", "released", "4", "1234", "3"]
    # the records' JSON names their class
    assert records[4].as_json()["request_class"] == "batch"
    assert "request_class" not in RequestRecord(0, 0.0, document=0).as_json()


# -- through the open loop -----------------------------------------------------------------------------
def _sse(text: str) -> bytes:
    chunk = {"choices": [{"index": 0, "delta": {"content": text}}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 1}}
    return f"data: {json.dumps(chunk)}\n\ndata: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode()


@pytest.mark.anyio
@pytest.mark.timeout(20)
async def test_each_request_sends_its_class_headers_and_a_refusal_keeps_retry_after() -> None:
    """A fake upstream that sheds ``objective: batch`` with 429 and Retry-After, and serves the rest."""
    plan = plan_of(CLASSES, "loud:1")
    assert plan is not None
    spec = replace(SPEC, rate=2000.0, max_requests=30)
    requests = _sequence(plan, spec)
    seen: dict[str, dict[str, str]] = {}

    def answer(request: httpx.Request) -> httpx.Response:
        seen[request.headers["x-request-id"]] = dict(request.headers)
        if request.headers.get(OBJECTIVE_HEADER) == "batch":
            return httpx.Response(429, json={"error": {"message": "shed"}}, headers={"Retry-After": "3"})
        return httpx.Response(200, content=_sse("ok"), headers={"content-type": "text/event-stream"})

    corpus = Corpus(spec.seed, tuple(f"document {d}" for d in range(spec.documents)), (0,) * spec.documents)
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        records = await run_sequence(
            client,
            lambda _: Dispatch("http://router"),
            corpus,
            requests,
            "m",
            max_tokens=1,
            tag="t",
            drain_timeout_s=5.0,
        )
    assert len(seen) == len(requests)
    for request, record in zip(requests, records, strict=True):
        sent = seen[f"t-{request.index}"]
        assert record.request_class == request.request_class
        for name in (OBJECTIVE_HEADER, FAIRNESS_HEADER):
            assert sent.get(name) == dict(request.headers).get(name)
        if request.request_class == "batch":
            assert record.status == 429 and record.headers == {"retry-after": "3"}
        else:
            assert record.ok
    rows = summarize_classes(plan, records, 2000.0, 1.0)
    assert {r.request_class: (r.refused_429, r.retry_after_429) for r in rows}["batch"][0] > 0
    assert all(r.retry_after_429 == r.refused_429 for r in rows)
    assert {r.request_class for r in records} == {"urgent", "batch", "rest", "loud"}
