"""The highest rate a target serves within a TTFT objective, from several runs' summaries.

A run at one rate is one request sequence, and a tail percentile of one sequence moves by more between
sequences than between routers at the same rate (the capped doc-QA sweeps). So a target's limit is read
off every run given, conservatively:

- a point *holds* when its TTFT p95 is at most the objective and no request failed or was refused (a
  failed request has no TTFT, and a p95 over the others would hide it);
- **sustained**: the highest rate such that every point of the target at that rate or below held;
- **first miss**: the lowest rate at which some point missed (none: it held everywhere measured).

With several runs at one rate (``--repeats``, or several reports), the ``median`` rule judges a rate by the
median of its runs' p95s instead of by every run: one slow run of a noisy machine does not end a limit.

For a target whose p95 grows with the rate, its limit lies between the two. So ``sustained(A) / first
miss(B)`` is a lower bound on A's limit over B's: when it reaches a factor, A is shown to sustain that
factor more, whatever lies between the points measured.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True, slots=True)
class Point:
    """One target at one rate in one run."""

    target: str
    rate: float
    p95_ms: float
    failed: int
    source: str

    def holds(self, objective_ms: float) -> bool:
        return self.failed == 0 and not math.isnan(self.p95_ms) and self.p95_ms <= objective_ms


@dataclass(frozen=True, slots=True)
class Limit:
    """A target's limit as bracketed by its points (rates in requests/s; NaN: none)."""

    target: str
    sustained: float
    first_miss: float
    points: int


def points(report: Mapping[str, Any], source: str) -> list[Point]:
    """Every summary of a workload report's JSON as a point (failed: failures plus refusals)."""
    out = []
    for summary in report.get("summaries", []):
        failed = int(summary.get("failures", 0)) + int(summary.get("refused", 0))
        out.append(
            Point(
                target=str(summary["target"]),
                rate=float(summary["rate"]),
                p95_ms=float(summary.get("ttft_p95_ms", math.nan)),
                failed=failed,
                source=source,
            )
        )
    return out


Rule = Literal["every", "median"]
"""How the runs of a target at one rate decide whether it held there: every run held (``every``), or the
median of their p95s is within the objective, a failed run counting as an infinite p95 (``median``)."""


def limits(all_points: Iterable[Point], objective_ms: float, rule: Rule = "every") -> dict[str, Limit]:
    """Each target's sustained rate and first miss under ``objective_ms``, its runs at each rate (to the
    hundredth of a request per second) judged by ``rule``."""
    by_target: dict[str, dict[float, list[Point]]] = {}
    for point in all_points:
        by_target.setdefault(point.target, {}).setdefault(round(point.rate, 2), []).append(point)
    out = {}
    for target, by_rate in by_target.items():
        missed = [rate for rate, runs in by_rate.items() if not _held(runs, objective_ms, rule)]
        first_miss = min(missed, default=math.nan)
        below = [rate for rate in by_rate if math.isnan(first_miss) or rate < first_miss]
        points = sum(len(runs) for runs in by_rate.values())
        out[target] = Limit(target, max(below, default=math.nan), first_miss, points)
    return out


def _held(runs: Sequence[Point], objective_ms: float, rule: Rule) -> bool:
    if rule == "every":
        return all(p.holds(objective_ms) for p in runs)
    p95s = [p.p95_ms if p.failed == 0 and not math.isnan(p.p95_ms) else math.inf for p in runs]
    return statistics.median(p95s) <= objective_ms


def lower_bound_ratio(mine: Limit, peer: Limit) -> float:
    """How many times the peer's limit ``mine`` is shown to sustain at least (NaN: not bounded).

    The peer's first miss bounds its limit from above; with no miss the peer's limit is unknown."""
    if math.isnan(mine.sustained) or math.isnan(peer.first_miss):
        return math.nan
    return mine.sustained / peer.first_miss


def grid(all_points: Sequence[Point], objective_ms: float) -> tuple[list[str], list[tuple[str, ...]]]:
    """The header and rows of every point, by target then rate: its p95, failures and whether it held."""
    header = ["target", "rate r/s", "run", "TTFT p95 ms", "failed", "held"]
    rows: list[tuple[str, ...]] = [
        (
            p.target,
            f"{p.rate:.2f}",
            p.source,
            f"{p.p95_ms:.0f}",
            str(p.failed),
            "yes" if p.holds(objective_ms) else "no",
        )
        for p in sorted(all_points, key=lambda p: (p.target, p.rate, p.source))
    ]
    return header, rows
