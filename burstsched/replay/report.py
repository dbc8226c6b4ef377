"""The replay's outputs: the side-by-side table, the best config under an objective, markdown, JSON, PNGs."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from burstsched.replay.fidelity import HEADER as FIDELITY_HEADER
from burstsched.replay.fidelity import fidelity_rows, fidelity_table
from burstsched.replay.runner import ReplayOptions, ReplayResult
from burstsched.replay.trace import TracedRequest, TraceSummary

Objective = Literal["ttft_p50", "ttft_p95", "ttft_p99", "hit_rate", "prefill"]
OBJECTIVES: dict[str, tuple[str, bool]] = {
    "ttft_p50": ("ttft_p50_ms", False),
    "ttft_p95": ("ttft_p95_ms", False),
    "ttft_p99": ("ttft_p99_ms", False),
    "hit_rate": ("hit_rate", True),
    "prefill": ("prefill_tokens_per_request", False),
}
"""Objective name → (result field, higher is better)."""

HEADER = ("config", "ok", "hit rate", "TTFT p50", "TTFT p95", "TTFT p99", "prefill tok/req", "req/replica")


def best(results: Sequence[ReplayResult], objective: str) -> ReplayResult | None:
    """The result that does best on ``objective`` (complete runs first; NaN never wins)."""
    field_name, higher = OBJECTIVES[objective]
    ranked = [r for r in results if not math.isnan(r.metric(field_name))]
    if not ranked:
        return None
    complete = [r for r in ranked if r.ok == r.requests] or ranked
    return (max if higher else min)(complete, key=lambda r: r.metric(field_name))


def _ms(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.0f} ms"


def _pct(value: float) -> str:
    return "–" if math.isnan(value) else f"{value * 100:.1f}%"


def row(r: ReplayResult) -> tuple[str, ...]:
    spread = "/".join(str(n) for n in r.requests_per_replica.values())
    prefill = "–" if math.isnan(r.prefill_tokens_per_request) else f"{r.prefill_tokens_per_request:.0f}"
    return (
        r.label,
        f"{r.ok}/{r.requests}",
        _pct(r.hit_rate),
        _ms(r.ttft_p50_ms),
        _ms(r.ttft_p95_ms),
        _ms(r.ttft_p99_ms),
        prefill,
        spread,
    )


def recorded_row(s: TraceSummary) -> tuple[str, ...]:
    spread = "/".join(str(n) for n in s.requests_per_endpoint.values())
    return (
        "recorded",
        str(s.requests),
        _pct(s.hit_rate),
        _ms(s.ttft_p50_ms),
        _ms(s.ttft_p95_ms),
        _ms(s.ttft_p99_ms),
        "–",
        spread,
    )


def text_table(rows: Sequence[tuple[str, ...]], header: tuple[str, ...] = HEADER) -> str:
    table = [header, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table)


def markdown_table(rows: Sequence[tuple[str, ...]], header: tuple[str, ...] = HEADER) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def placement_fidelity(requests: Sequence[TracedRequest], placement: ReplayResult) -> list[tuple[str, ...]]:
    """The recorded-placement replay against the recorded TTFTs, by kind of request (strings)."""
    return fidelity_table(fidelity_rows(requests, placement.ttft_by_request_ms))


def write_report(
    out: Path,
    trace_name: str,
    summary: TraceSummary,
    results: Sequence[ReplayResult],
    options: ReplayOptions,
    objective: str,
    skipped: Sequence[str] = (),
    elapsed_s: float | None = None,
    placement: ReplayResult | None = None,
    requests: Sequence[TracedRequest] = (),
) -> dict[str, Path]:
    """``replay.md``, ``replay.json`` and the plots under ``out``; returns their paths by kind."""
    out.mkdir(parents=True, exist_ok=True)
    winner = best(results, objective)
    rows = [
        recorded_row(summary),
        *([] if placement is None else [row(placement)]),
        *(row(r) for r in results),
    ]
    paths = {"markdown": out / "replay.md", "json": out / "replay.json"}
    payload: dict[str, Any] = {
        "trace": trace_name,
        "recorded": _fields(summary),
        "options": _fields(options),
        "objective": objective,
        "best": None if winner is None else winner.label,
        "skipped": list(skipped),
        "elapsed_s": elapsed_s,
        "results": [r.as_json(with_samples=True) for r in results],
        "recorded_placement": None if placement is None else placement.as_json(with_samples=True),
    }
    paths["json"].write_text(json.dumps(payload, indent=2, default=_nan_safe))
    plots = _plots(out, results)
    paths.update(plots)
    if options.virtual_time:
        how = (
            "in one process on virtual time (a discrete-event run: the router's own CPU time is not counted)"
        )
    else:
        how = (
            f"in real time through a router process, simulator time scale {options.time_scale:g} "
            "(latencies divided by it, so they read in the trace's time)"
        )
    lines = [
        f"# Replay of {trace_name}",
        "",
        f"{summary.requests} recorded requests over {summary.duration_s:.0f} s, replayed on "
        f"{options.replicas} simulated replicas (KV blocks: {options.kv_blocks or 'simulator default'}), "
        f"speed ×{options.speed:g}, {how}. Hit rate: the replicas' prefix-cache hits over queries "
        "(recorded: cached over prompt tokens from the responses' usage).",
        "",
        markdown_table(rows),
        "",
    ]
    if placement is not None:
        lines += [
            "`recorded placement`: each request sent straight to the replica standing for the endpoint it "
            "was recorded on, no router: how closely the simulator reproduces the recorded pool by itself.",
            "",
        ]
        if requests:
            lines += [
                "Recorded placement against the recording, request by request (warm: at least half the "
                "prompt cached on the recorded replica; busy: its endpoint was serving other requests when "
                "it arrived):",
                "",
                markdown_table(placement_fidelity(requests, placement), FIDELITY_HEADER),
                "",
            ]
    held = [line for line in map(flow_line, results) if line]
    if held:
        lines += ["Flow control:", "", *(f"- {line}" for line in held), ""]
    if elapsed_s is not None:
        lines += [f"Wall time of the replays: {elapsed_s:.0f} s.", ""]
    if winner is not None:
        lines += [f"Best under `{objective}`: **{winner.label}**.", ""]
    if skipped:
        lines += ["Not run (time budget): " + ", ".join(f"`{s}`" for s in skipped) + ".", ""]
    lines += [f"![{kind}]({p.name})" for kind, p in plots.items()]
    paths["markdown"].write_text("\n".join(lines) + "\n")
    return paths


def flow_line(result: ReplayResult) -> str | None:
    """What the router's flow-control queue did in one replay (None: it held nothing, or was off)."""
    outcomes = result.flow_outcomes
    if not outcomes:
        return None
    parts = ", ".join(f"{outcome} {count}" for outcome, count in outcomes.items())
    held = sum(outcomes.values())
    return (
        f"{result.label}: {held} requests held in the router's queue ({parts}), "
        f"{result.flow_wait_s / held:.2f} s each on average"
    )


def _fields(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__slots__}


def _nan_safe(value: Any) -> Any:
    return _fields(value) if hasattr(value, "__slots__") else str(value)


def _plots(out: Path, results: Sequence[ReplayResult]) -> dict[str, Path]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from burstsched.workloads.docqa_plots import ttft_cdf

    cdf = out / "replay-ttft-cdf.png"
    ttft_cdf({r.label: r.ttfts_ms for r in results}, "Replayed TTFT per config", cdf)
    bars = out / "replay-configs.png"
    figure = Figure(figsize=(max(6.0, 0.6 * len(results) + 3), 4.5))
    FigureCanvasAgg(figure)
    left, right = figure.subplots(1, 2)
    labels = [r.label for r in results]
    positions = list(range(len(results)))
    left.bar(positions, [r.hit_rate * 100 for r in results])
    left.set_ylabel("prefix-cache hit rate (%)")
    right.bar(positions, [r.ttft_p95_ms for r in results], color="tab:orange")
    right.set_ylabel("TTFT p95 (ms)")
    for axes in (left, right):
        axes.set_xticks(positions, labels, rotation=60, ha="right", fontsize="small")
        axes.grid(True, axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(bars, dpi=110)
    return {"ttft_cdf": cdf, "configs": bars}
