"""The document-QA report as text: the markdown table of runs and the report page around it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from burstsched.workloads.docqa_run import RunSummary

COLUMNS = (
    "target",
    "rate r/s",
    "sent",
    "ok",
    "fail",
    "hit rate",
    "ideal",
    "TTFT p50 / p95 / p99 ms",
    "req/s",
    "out tok/s",
    "prefill tok/req",
    "requests per replica",
    "send lag p99 ms",
)


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.1f}%"


def _num(value: float, digits: int = 0) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def table_row(s: RunSummary) -> tuple[str, ...]:
    spread = "/".join(str(n) for n in s.requests_per_replica.values())
    return (
        s.target,
        _num(s.rate, 2),
        str(s.requests),
        str(s.completed),
        str(s.failures),
        _pct(s.hit_rate),
        _pct(s.ideal_hit_rate),
        f"{_num(s.ttft_p50_ms)} / {_num(s.ttft_p95_ms)} / {_num(s.ttft_p99_ms)}",
        _num(s.throughput_rps, 2),
        _num(s.output_tokens_per_s, 1),
        _num(s.prefill_tokens_mean),
        f"{spread} ({s.replica_source})",
        _num(s.send_lag_p99_ms, 1),
    )


def markdown_table(summaries: Sequence[RunSummary]) -> str:
    """One row per run, columns aligned."""
    rows = [COLUMNS, *(table_row(s) for s in summaries)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["| " + " | ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def report_markdown(
    title: str,
    command: str,
    setup: Mapping[str, Any],
    summaries: Sequence[RunSummary],
    skipped: Mapping[str, str],
    plots: Sequence[str],
) -> str:
    """The report page: how it was run, the table, what was skipped and why, the plots."""
    lines = [f"# {title}", "", "```", command, "```", "", "## Setup", ""]
    lines += [f"- {key}: {value}" for key, value in setup.items()]
    lines += ["", "## Results", "", markdown_table(summaries), ""]
    lines += [
        "hit rate: Σ Δ`vllm:prefix_cache_hits` / Σ Δ`vllm:prefix_cache_queries` over the replicas; ideal: "
        "perfect document affinity with an infinite cache over the same completed requests (each document's "
        "first request cold, later ones hit every full block of the document part); TTFT client side "
        "(sending → first content); prefill tok/req: Δ`vllm:request_prefill_kv_computed_tokens_sum` / "
        "completed requests; requests per replica from the `x-burstsched-endpoint` header (header), the "
        "client's own choice (client) or Δ`vllm:request_success_total` (counters); send lag: how late the "
        "load generator sent a request after its scheduled arrival (large values mean the client, not the "
        "pool, was the bottleneck).",
        "",
    ]
    if skipped:
        lines += ["## Skipped targets", ""]
        lines += [f"- {label}: {reason}" for label, reason in skipped.items()]
        lines.append("")
    if plots:
        lines += ["## Plots", ""]
        lines += [f"![{name}]({name})" for name in plots]
        lines.append("")
    return "\n".join(lines)
