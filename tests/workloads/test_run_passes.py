"""Several passes over a workload's targets at one rate (``--repeats``), in alternating order."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

from burstsched.workloads.docqa_report import markdown_table
from burstsched.workloads.open_loop import RequestRecord
from burstsched.workloads.run_summary import RunSummary, TargetRun, as_repeat
from burstsched.workloads.targets import ClientRandomTarget, Target, burstsched_target
from burstsched.workloads.tenants_report import markdown_table as tenants_table
from loadtests.peers import PeerUnavailable
from loadtests.run_targets import add_run_arguments, passes, run_passes


def test_every_other_pass_runs_the_targets_in_reverse_order() -> None:
    assert passes(["a", "b", "c"], 1) == [(1, "a"), (1, "b"), (1, "c")]
    assert passes(["a", "b"], 3) == [(1, "a"), (1, "b"), (2, "b"), (2, "a"), (3, "a"), (3, "b")]


def test_repeats_must_be_at_least_one(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser, "random")
    assert parser.parse_args([]).repeats == 1
    assert parser.parse_args(["--repeats", "3"]).repeats == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["--repeats", "0"])
    assert "must be >= 1" in capsys.readouterr().err


def _summary(target: str) -> RunSummary:
    nan = math.nan
    return RunSummary(
        target, 2.0, 10, 10, 0, 0, 0.5, 0.9, 0.5, 10, 20, 30, 40, 50, 60, 5.0, 80.0, 100.0, {"a": 10},
        "header", 2.0, 1.0, nan, nan, nan, nan, nan, nan, nan,
    )  # fmt: skip


def test_a_later_pass_keeps_its_target_and_is_labelled_in_the_tables() -> None:
    run: TargetRun[RequestRecord] = TargetRun(_summary("burstsched:cost"), [], {})
    second = as_repeat(run, 2)
    assert second.summary.target == "burstsched:cost" and second.summary.repeat == 2
    assert second.summary.as_json()["repeat"] == 2
    assert run.summary.row_label == "burstsched:cost"
    assert second.summary.row_label == "burstsched:cost #2"
    for table in (markdown_table, tenants_table):
        rows = table([run.summary, second.summary]).splitlines()[2:]
        assert [r.split("|")[1].strip() for r in rows] == ["burstsched:cost", "burstsched:cost #2"]


@pytest.mark.anyio
async def test_a_target_that_cannot_run_is_skipped_with_its_reason_and_not_tried_again() -> None:
    router, client_side = burstsched_target(Path("config/cost.yaml")), ClientRandomTarget(0)
    tried: list[str] = []

    async def run_one(target: Target) -> tuple[TargetRun[RequestRecord], list[float]]:
        tried.append(target.label)
        if target.label == "random":
            raise PeerUnavailable("not installed here")
        return TargetRun(_summary(target.label), [], {}), [1.0]

    skipped: dict[str, str] = {}
    done = await run_passes([router, client_side], 3, skipped, run_one)
    assert tried == ["burstsched:cost", "random", "burstsched:cost", "burstsched:cost"]
    assert skipped == {"random": "not installed here"}
    assert [(run.summary.row_label, lags) for run, lags in done] == [
        ("burstsched:cost", [1.0]),
        ("burstsched:cost #2", [1.0]),
        ("burstsched:cost #3", [1.0]),
    ]
