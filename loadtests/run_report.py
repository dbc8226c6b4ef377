"""A workload run's outputs: ``TAG.json`` (command, setup, capacity, every run and its records), ``TAG.md``
(the report page with its plots) and the table on stdout. Shared by the workload scripts, each with its
own table columns and page."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from burstsched.workloads.capacity import Capacity
from burstsched.workloads.open_loop import RequestRecord
from burstsched.workloads.run_summary import RunSummary, TargetRun
from loadtests.run_plots import write_plots

Table = Callable[[Sequence[RunSummary]], str]
Page = Callable[[str, str, Mapping[str, Any], Sequence[RunSummary], Mapping[str, str], Sequence[str]], str]


def write_run_report(
    out: Path,
    tag: str,
    title: str,
    plot_title: str,
    setup: dict[str, Any],
    runs: Sequence[tuple[float, TargetRun[RequestRecord]]],
    attempts: Sequence[list[float]],
    skipped: dict[str, str],
    capacity: Capacity | None,
    *,
    table: Table,
    page: Page,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Write the JSON (with ``extra``'s keys, a workload's own), the plots and the markdown page under
    ``out``; print the table."""
    out.mkdir(parents=True, exist_ok=True)
    summaries: list[RunSummary] = [run.summary for _, run in runs]
    capacity_rps = capacity.requests_per_s if capacity is not None else None
    plots = write_plots(out, tag, plot_title, runs, capacity_rps)
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    document = {
        "command": command,
        "setup": setup,
        "capacity": None if capacity is None else capacity.as_json(),
        "skipped": skipped,
        "summaries": [s.as_json() for s in summaries],
        "runs": [
            {"rate": rate, "send_lag_p99_ms_per_attempt": lags, **run.as_json()}
            for (rate, run), lags in zip(runs, attempts, strict=True)
        ],
        **(extra or {}),
    }
    (out / f"{tag}.json").write_text(json.dumps(document, separators=(",", ":")) + "\n")
    (out / f"{tag}.md").write_text(page(title, command, setup, summaries, skipped, plots))
    print()
    print(table(summaries))
    for label, why in skipped.items():
        print(f"skipped {label}: {why}")
    print(f"\nwrote {out / (tag + '.json')}, {out / (tag + '.md')} and {len(plots)} plot(s)")
