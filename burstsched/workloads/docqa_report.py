"""The document-QA report as text: the markdown table of runs, with classes a table of rows per class, and
the report page around them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from burstsched.workloads.docqa_classes import ClassSummary
from burstsched.workloads.report_page import COLD_NOTE, aligned_table, report_page, shares
from burstsched.workloads.report_page import num as _num
from burstsched.workloads.report_page import pct as _pct
from burstsched.workloads.run_summary import RunSummary

COLUMNS = (
    "target",
    "rate r/s",
    "sent",
    "ok",
    "fail",
    "hit rate",
    "LRU affinity",
    "ceiling",
    "ideal",
    "TTFT p50 / p95 / p99 ms",
    "ceiling cold",
    "cold TTFT p50 ms",
    "req/s",
    "out tok/s",
    "prefill tok/req",
    "requests per replica",
    "cold: moved / in place",
    "send lag p99 ms",
    "router CPU ms/req",
)


def table_row(s: RunSummary) -> tuple[str, ...]:
    spread = "/".join(str(n) for n in s.requests_per_replica.values())
    return (
        s.row_label,
        _num(s.rate, 2),
        str(s.requests),
        str(s.completed),
        str(s.failures),
        _pct(s.hit_rate),
        _pct(s.cache_bound_hit_rate),
        _pct(s.ceiling_hit_rate),
        _pct(s.ideal_hit_rate),
        f"{_num(s.ttft_p50_ms)} / {_num(s.ttft_p95_ms)} / {_num(s.ttft_p99_ms)}",
        _pct(s.ceiling_cold_share),
        _num(s.cold_ttft_p50_ms),
        _num(s.throughput_rps, 2),
        _num(s.output_tokens_per_s, 1),
        _num(s.prefill_tokens_mean),
        f"{spread} ({s.replica_source})",
        shares(s.cold_moved_share, s.cold_in_place_share),
        _num(s.send_lag_p99_ms, 1),
        _num(s.router_cpu_ms, 2),
    )


def markdown_table(summaries: Sequence[RunSummary]) -> str:
    """One row per run, columns aligned."""
    return aligned_table(COLUMNS, [table_row(s) for s in summaries])


NOTES = (
    "hit rate: Σ Δ`vllm:prefix_cache_hits` / Σ Δ`vllm:prefix_cache_queries` over the replicas; LRU affinity: "
    "perfect document affinity on the replicas' own caches (each document on one replica, documents dealt "
    "out evenly by popularity, LRU eviction at the KV cache's size), over the same completed requests: "
    "what even placement that wastes no cache on copies gets, a yardstick rather than a ceiling (uneven "
    "placement keeps more documents where they are asked most); ceiling: the most any router could hit with "
    "these caches, a clairvoyant cache of all the replicas' blocks together that evicts the block read "
    "again furthest ahead (Belady), over the same completed requests; ideal: "
    "perfect document affinity with an infinite cache over the same completed requests (each document's "
    "first request cold, later ones hit every full block of the document part); TTFT client side "
    "(sending → first token: the first chunk carrying a choice, as vLLM's own benchmark times it); ceiling "
    "cold: the share of the same requests that the ceiling's cache serves mostly cold (more than half the "
    "prompt computed); above 5%, the p95 of any router is a cold prefill's; cold TTFT p50: the TTFT median "
    "of this run's requests that computed more than half their prompt (their usage); "
    "prefill tok/req: Δ`vllm:request_prefill_kv_computed_tokens_sum` / "
    "completed requests; requests per replica from the `x-burstsched-endpoint` header (header), the "
    "client's own choice (client), the request ids each replica received (replicas) or "
    "Δ`vllm:request_success_total` (counters); "
    + COLD_NOTE.format(unit="document")
    + "; send lag: how late the "
    "load generator sent a request after its scheduled arrival (large values mean the client, not the "
    "pool, was the bottleneck); router CPU: user + system time of the target's router processes over the "
    "run (from `/proc`, their idle work included) per completed request, none for client-side routing."
)


CLASS_COLUMNS = (
    "target",
    "rate r/s",
    "class",
    "headers",
    "sent",
    "ok",
    "429",
    "429 with Retry-After",
    "other fail",
    "timed out",
    "TTFT p50 / p95 / p99 ms",
    "good",
    "goodput r/s",
)

ClassRow = tuple[RunSummary, ClassSummary]
"""A class's row and the run it belongs to."""


def class_row(run: RunSummary, c: ClassSummary) -> tuple[str, ...]:
    return (
        run.row_label,
        _num(run.rate, 2),
        c.request_class,
        c.headers,
        str(c.sent),
        str(c.completed),
        str(c.refused_429),
        str(c.retry_after_429),
        str(c.other_failures),
        str(c.timed_out),
        f"{_num(c.ttft_p50_ms)} / {_num(c.ttft_p95_ms)} / {_num(c.ttft_p99_ms)}",
        str(c.good),
        _num(c.goodput_rps, 2),
    )


def class_table(rows: Sequence[ClassRow]) -> str:
    """One row per class of each run, columns aligned."""
    return aligned_table(CLASS_COLUMNS, [class_row(run, c) for run, c in rows])


def class_notes(slo_ms: float) -> str:
    return (
        "Per class: each class's requests send its headers (objective: `x-llm-d-inference-objective`, "
        "tenant: `x-llm-d-inference-fairness-id`); sent: the class's requests in the sequence; 429: "
        "answered 429, and how many of those carried `Retry-After`; other fail: neither completed nor "
        "answered 429 (other statuses, errors, cut streams, timeouts), timed out: those of them that ended "
        "on the client's or the drain's timeout; TTFT over the class's completed requests; good: completed "
        f"with TTFT ≤ {slo_ms:g} ms (wall clock); goodput: good per second of the run's makespan."
    )


QUEUE_COLUMNS = ("target", "rate r/s", "queue outcome", "requests", "longest wait ms", "most overtaken")
QUEUE_NOTES = (
    "flow queue: what burstsched's flow-control queue did over each run, from the router's "
    "`GET /admin/queue` (`since_start`): per outcome (released, shed, expired, full, cancelled, ...) the "
    "requests, the longest any waited in the queue and the most queued-before requests one was released "
    "ahead of; requests that went straight through are not counted."
)


def queue_table(summaries: Sequence[RunSummary]) -> str:
    """One row per run and flow-queue outcome, for the runs whose router had the queue on."""
    rows = [
        (
            run.row_label,
            _num(run.rate, 2),
            outcome,
            str(tally.get("requests", "")),
            _num(1000.0 * float(tally.get("longest_wait_s", math.nan))),
            str(tally.get("most_overtaken", "")),
        )
        for run in summaries
        if run.flow_queue
        for outcome, tally in sorted(run.flow_queue.items())
    ]
    return aligned_table(QUEUE_COLUMNS, rows)


def report_markdown(
    title: str,
    command: str,
    setup: Mapping[str, Any],
    summaries: Sequence[RunSummary],
    skipped: Mapping[str, str],
    plots: Sequence[str],
    *,
    classes: Sequence[ClassRow] = (),
    slo_ms: float = 2000.0,
) -> str:
    """The report page: how it was run, the table (and the one per class), what was skipped and why, the
    plots."""
    table = markdown_table(summaries)
    notes = NOTES
    if classes:
        table += "\n\n" + class_table(classes)
        notes += "\n\n" + class_notes(slo_ms)
    if any(run.flow_queue for run in summaries):
        table += "\n\n" + queue_table(summaries)
        notes += "\n\n" + QUEUE_NOTES
    return report_page(title, command, setup, table, notes, skipped, plots)
