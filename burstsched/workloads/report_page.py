"""A workload report as markdown: the aligned table of runs and the page around it.

Each workload picks its columns and writes its notes; the page's shape (how it was run, the setup, the
table, what the columns mean, the skipped targets, the plots) is the same for all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.1f}%"


def num(value: float, digits: int = 0) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def shares(first: float, second: float) -> str:
    """Two shares as ``a% / b%``, or ``-`` when unknown (the cold placements' column)."""
    return "-" if math.isnan(first) or math.isnan(second) else f"{pct(first)} / {pct(second)}"


COLD_NOTE = (
    "cold: moved / in place: the shares of the completed requests that computed more than half their "
    "prompt on another replica than the previous request of their {unit} in the run went to, and on the "
    "same one (it had been evicted there); - where some request's replica is unknown"
)


def aligned_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table with every column padded to its widest cell."""
    lines_of = [tuple(header), *(tuple(row) for row in rows)]
    widths = [max(len(row[i]) for row in lines_of) for i in range(len(header))]
    lines = [
        "| " + " | ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) + " |" for row in lines_of
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table for a terminal: columns padded to their widest cell, two spaces apart."""
    lines_of = [tuple(header), *(tuple(row) for row in rows)]
    widths = [max(len(row[i]) for row in lines_of) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) for row in lines_of)


def table(header: Sequence[str], rows: Sequence[Sequence[str]], *, markdown: bool) -> str:
    """``rows`` under ``header``: a markdown table (:func:`aligned_table`) or text for a terminal."""
    return aligned_table(header, rows) if markdown else text_table(header, rows)


def report_page(
    title: str,
    command: str,
    setup: Mapping[str, Any],
    table: str,
    notes: str,
    skipped: Mapping[str, str],
    plots: Sequence[str],
) -> str:
    """The report page: how it was run, the table and what its columns mean, what was skipped and why,
    the plots."""
    lines = [f"# {title}", "", "```", command, "```", "", "## Setup", ""]
    lines += [f"- {key}: {value}" for key, value in setup.items()]
    lines += ["", "## Results", "", table, "", notes, ""]
    if skipped:
        lines += ["## Skipped targets", ""]
        lines += [f"- {label}: {reason}" for label, reason in skipped.items()]
        lines.append("")
    if plots:
        lines += ["## Plots", ""]
        lines += [f"![{name}]({name})" for name in plots]
        lines.append("")
    return "\n".join(lines)
