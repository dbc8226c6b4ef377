"""The PNG plots of a workload's runs: a TTFT CDF per rate (one line per target) and, when several rates
ran, hit rate and TTFT p95 against offered load. Shared by the workload scripts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from burstsched.workloads.docqa_plots import load_curves, ttft_cdf
from burstsched.workloads.open_loop import RequestRecord
from burstsched.workloads.run_summary import TargetRun


def write_plots(
    out: Path,
    tag: str,
    title: str,
    runs: Sequence[tuple[float, TargetRun[RequestRecord]]],
    capacity_rps: float | None,
) -> list[str]:
    """Write the plots under ``out`` (file names start with ``tag``); returns their file names."""
    plots: list[str] = []
    rates = sorted({rate for rate, _ in runs})
    for rate in rates:
        name = f"{tag}-ttft-cdf" + (f"-{rate:.2f}" if len(rates) > 1 else "") + ".png"
        ttfts = {
            run.summary.row_label: [r.ttft_ms for r in run.records if r.ok and r.ttft_ms is not None]
            for rr, run in runs
            if rr == rate
        }
        ttft_cdf(ttfts, f"TTFT, {title}, {rate:.2f} requests/s", out / name)
        plots.append(name)
    if len(rates) > 1:
        name = f"{tag}-load.png"
        load_curves([run.summary for _, run in runs], title, out / name, capacity_rps)
        plots.append(name)
    return plots
