"""The highest rate within a TTFT objective, read off several runs (burstsched/workloads/slo_rate.py)."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from burstsched.workloads.slo_rate import Limit, Point, grid, limits, lower_bound_ratio, points
from loadtests.slo_rate import main


def _point(target: str, rate: float, p95: float, failed: int = 0) -> Point:
    return Point(target, rate, p95, failed, "run")


def test_a_point_holds_only_within_the_objective_and_with_nothing_failed() -> None:
    assert _point("a", 1.0, 1000.0).holds(1000.0)
    assert not _point("a", 1.0, 1000.1).holds(1000.0)
    assert not _point("a", 1.0, 200.0, failed=1).holds(1000.0)
    assert not _point("a", 1.0, math.nan).holds(1000.0)


def test_the_sustained_rate_stops_below_the_first_miss_even_if_a_higher_rate_held() -> None:
    found = limits(
        [_point("a", 2.0, 400.0), _point("a", 6.0, 900.0), _point("a", 4.0, 1500.0), _point("a", 8.0, 700.0)],
        1000.0,
    )
    assert found["a"] == Limit("a", sustained=2.0, first_miss=4.0, points=4)


def test_a_target_that_held_everywhere_has_no_first_miss() -> None:
    found = limits([_point("a", 2.0, 400.0), _point("a", 5.0, 900.0)], 1000.0)
    assert found["a"].sustained == 5.0
    assert math.isnan(found["a"].first_miss)


def test_a_target_that_missed_at_its_lowest_rate_sustains_none() -> None:
    found = limits([_point("a", 2.0, 1200.0), _point("a", 5.0, 900.0)], 1000.0)
    assert math.isnan(found["a"].sustained)
    assert found["a"].first_miss == 2.0


def test_two_runs_at_one_rate_must_both_hold() -> None:
    found = limits([_point("a", 3.0, 400.0), _point("a", 3.0, 1100.0), _point("a", 1.0, 300.0)], 1000.0)
    assert found["a"].sustained == 1.0
    assert found["a"].first_miss == 3.0


def test_the_ratio_is_bounded_by_the_peers_first_miss_and_unknown_without_one() -> None:
    mine = Limit("a", sustained=12.0, first_miss=math.nan, points=3)
    assert lower_bound_ratio(mine, Limit("b", sustained=8.0, first_miss=10.0, points=3)) == pytest.approx(1.2)
    assert math.isnan(lower_bound_ratio(mine, Limit("b", sustained=8.0, first_miss=math.nan, points=3)))
    nothing = Limit("a", sustained=math.nan, first_miss=1.0, points=1)
    assert math.isnan(lower_bound_ratio(nothing, Limit("b", sustained=8.0, first_miss=10.0, points=3)))


def test_a_reports_summaries_become_points_with_refusals_counted_as_failures() -> None:
    report = {
        "summaries": [
            {"target": "x", "rate": 2.5, "ttft_p95_ms": 300.0, "failures": 1, "refused": 2},
            {"target": "y", "rate": 2.5, "ttft_p95_ms": 250.0, "failures": 0, "refused": 0},
        ]
    }
    assert points(report, "f") == [Point("x", 2.5, 300.0, 3, "f"), Point("y", 2.5, 250.0, 0, "f")]


def test_the_grid_marks_each_point_held_or_not() -> None:
    header, rows = grid([_point("b", 2.0, 1200.0), _point("a", 1.0, 300.0)], 1000.0)
    assert header[-1] == "held"
    assert [(r[0], r[-1]) for r in rows] == [("a", "yes"), ("b", "no")]


def _report(path: Path, summaries: list[dict[str, object]]) -> Path:
    with gzip.open(path, "wt") as handle:
        json.dump({"summaries": summaries}, handle)
    return path


def test_the_command_compares_the_target_with_each_peer_over_several_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def row(target: str, rate: float, p95: float) -> dict[str, object]:
        return {"target": target, "rate": rate, "ttft_p95_ms": p95, "failures": 0, "refused": 0}

    first = _report(tmp_path / "one.json.gz", [row("me", 5.0, 400.0), row("peer", 5.0, 900.0)])
    second = _report(tmp_path / "two.json.gz", [row("me", 12.0, 950.0), row("peer", 10.0, 1500.0)])
    assert main([str(first), str(second), "--target", "me"]) == 0
    out = capsys.readouterr().out
    summary = out.split("\n\n")[1].splitlines()
    assert summary[1].split() == ["me", "2", "12.00", "-", "-"]
    assert summary[2].split() == ["peer", "2", "5.00", "10.00", "1.20"]


def test_a_missing_report_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        main([str(tmp_path / "absent.json.gz")])
    assert exited.value.code == 2


def test_the_median_rule_lets_one_slow_run_of_three_pass_and_counts_a_failed_run_as_slow() -> None:
    runs = [_point("a", 3.0, 400.0), _point("a", 3.0, 1400.0), _point("a", 3.0, 500.0)]
    runs.append(_point("a", 5.0, 900.0))
    strict = limits(runs, 1000.0, "every")["a"]
    assert math.isnan(strict.sustained) and strict.first_miss == 3.0 and strict.points == 4
    median = limits(runs, 1000.0, "median")["a"]
    assert median.sustained == 5.0 and math.isnan(median.first_miss)
    failing = [_point("a", 3.0, 400.0), _point("a", 3.0, 300.0, failed=1), _point("a", 3.0, 1200.0)]
    assert limits(failing, 1000.0, "median")["a"].first_miss == 3.0


def test_rates_within_a_hundredth_are_one_rate() -> None:
    runs = [_point("a", 10.391, 400.0), _point("a", 10.389, 1400.0), _point("a", 10.4, 1500.0)]
    found = limits(runs, 1000.0, "median")["a"]
    assert found.first_miss == 10.4 and found.sustained == 10.39
