"""PNG plots of document-QA runs: TTFT CDF per target, and hit rate and TTFT p95 against offered load.

matplotlib's object API with the Agg canvas (no pyplot, no global backend switch); matplotlib is a dev
extra, so only the load-test scripts import this module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from burstsched.workloads.run_summary import RunSummary


def ttft_cdf(ttfts_ms: Mapping[str, Sequence[float]], title: str, path: Path) -> None:
    """One empirical CDF of TTFT per target (log x axis: cold and warm requests differ by ~10×)."""
    figure = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for label, values in ttfts_ms.items():
        ordered = sorted(v for v in values if not math.isnan(v))
        if not ordered:
            continue
        fractions = [(i + 1) / len(ordered) for i in range(len(ordered))]
        axes.step(ordered, fractions, where="post", label=f"{label} (n={len(ordered)})")
    axes.set_xscale("log")
    axes.set_xlabel("TTFT (ms, client side)")
    axes.set_ylabel("fraction of requests")
    axes.set_ylim(0, 1.0)
    axes.grid(True, which="both", alpha=0.3)
    axes.set_title(title)
    axes.legend(loc="lower right", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def load_curves(summaries: Sequence[RunSummary], title: str, path: Path, capacity_rps: float | None) -> None:
    """Hit rate (left) and TTFT p95 (right) against offered load, one line per target."""
    figure = Figure(figsize=(11, 4.5))
    FigureCanvasAgg(figure)
    hit_axes, p95_axes = figure.subplots(1, 2)
    by_target: dict[str, list[RunSummary]] = {}
    for summary in summaries:
        by_target.setdefault(summary.target, []).append(summary)

    def load(rate: float) -> float:
        return rate / capacity_rps if capacity_rps else rate

    for label, runs in by_target.items():
        runs = sorted(runs, key=lambda s: s.rate)
        xs = [load(s.rate) for s in runs]
        hit_axes.plot(xs, [100 * s.hit_rate for s in runs], marker="o", label=label)
        p95_axes.plot(xs, [s.ttft_p95_ms for s in runs], marker="o", label=label)
    first_per_rate: dict[float, RunSummary] = {}
    for summary in summaries:
        first_per_rate.setdefault(summary.rate, summary)
    firsts = [first_per_rate[rate] for rate in sorted(first_per_rate)]
    bounds = (
        ("ideal_hit_rate", ":", "ideal (infinite cache)"),
        ("ceiling_hit_rate", "--", "ceiling (these caches, clairvoyant)"),
    )
    for field, linestyle, label in bounds:
        known = [s for s in firsts if not math.isnan(getattr(s, field))]
        if known:
            hit_axes.plot(
                [load(s.rate) for s in known],
                [100 * getattr(s, field) for s in known],
                linestyle=linestyle,
                color="grey",
                label=label,
            )
    xlabel = "offered load (× cold capacity)" if capacity_rps else "offered rate (requests/s)"
    hit_axes.set_xlabel(xlabel)
    hit_axes.set_ylabel("prefix-cache hit rate (%)")
    hit_axes.set_ylim(0, 100)
    p95_axes.set_xlabel(xlabel)
    p95_axes.set_ylabel("TTFT p95 (ms)")
    p95_axes.set_yscale("log")
    for axes in (hit_axes, p95_axes):
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize="small")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
