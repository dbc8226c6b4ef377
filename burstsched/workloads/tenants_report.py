"""The multi-tenant chat report as text: the markdown table of runs and the report page around it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from burstsched.workloads.report_page import COLD_NOTE, aligned_table, num, pct, report_page, shares
from burstsched.workloads.run_summary import RunSummary

COLUMNS = (
    "target",
    "rate r/s",
    "sent",
    "ok",
    "failed",
    "refused",
    "hit rate",
    "ideal",
    "TTFT p50 / p95 / p99 ms",
    "TTFT p95 bursts / others ms",
    "e2e p50 / p95 / p99 ms",
    "req/s",
    "out tok/s",
    "prefill tok/req",
    "max/mean",
    "requests per replica",
    "cold: moved / in place",
    "send lag p99 ms",
    "router CPU ms/req",
)

NOTES = (
    "hit rate: Σ Δ`vllm:prefix_cache_hits` / Σ Δ`vllm:prefix_cache_queries` over the replicas; ideal: "
    "perfect affinity with an infinite cache over the same completed requests in arrival order (each "
    "prompt hits every full block it shares with any earlier prompt: its tenant's system prompt, its own "
    "conversation so far), computed from the prompts as the serving tokenizer renders them; TTFT client "
    "side (sending → first token: the first chunk carrying a choice, as vLLM's own benchmark times it), "
    "bursts: the requests that arrived in a burst (a burst user's first turn), others: every other request; "
    "e2e sending → end of stream; failed: transport errors, errors in "
    "the stream, unfinished; refused: answered with an HTTP error status; prefill tok/req: "
    "Δ`vllm:request_prefill_kv_computed_tokens_sum` / completed requests; max/mean: the busiest "
    "replica's completed requests over the mean; requests per replica from the `x-burstsched-endpoint` "
    "header (header), the client's own choice (client), the request ids each replica received (replicas) "
    "or Δ`vllm:request_success_total` (counters); "
    + COLD_NOTE.format(unit="conversation (tenant and user)")
    + "; send lag: how late the load generator sent a request after it could be sent (its arrival, or the "
    "end of "
    "the user's previous turn); router CPU: user + system time of the target's router processes over the "
    "run (from `/proc`, their idle work included) per completed request, none for client-side routing."
)


def table_row(s: RunSummary) -> tuple[str, ...]:
    spread = "/".join(str(n) for n in s.requests_per_replica.values())
    return (
        s.row_label,
        num(s.rate, 2),
        str(s.requests),
        str(s.completed),
        str(s.failures - s.refused),
        str(s.refused),
        pct(s.hit_rate),
        pct(s.ideal_hit_rate),
        f"{num(s.ttft_p50_ms)} / {num(s.ttft_p95_ms)} / {num(s.ttft_p99_ms)}",
        f"{num(s.burst_ttft_p95_ms)} / {num(s.other_ttft_p95_ms)}",
        f"{num(s.e2e_p50_ms)} / {num(s.e2e_p95_ms)} / {num(s.e2e_p99_ms)}",
        num(s.throughput_rps, 2),
        num(s.output_tokens_per_s, 1),
        num(s.prefill_tokens_mean),
        num(s.replica_max_over_mean, 2),
        f"{spread} ({s.replica_source})",
        shares(s.cold_moved_share, s.cold_in_place_share),
        num(s.send_lag_p99_ms, 1),
        num(s.router_cpu_ms, 2),
    )


def markdown_table(summaries: Sequence[RunSummary]) -> str:
    """One row per run, columns aligned."""
    return aligned_table(COLUMNS, [table_row(s) for s in summaries])


def report_markdown(
    title: str,
    command: str,
    setup: Mapping[str, Any],
    summaries: Sequence[RunSummary],
    skipped: Mapping[str, str],
    plots: Sequence[str],
) -> str:
    """The report page: how it was run, the table, what was skipped and why, the plots."""
    return report_page(title, command, setup, markdown_table(summaries), NOTES, skipped, plots)
