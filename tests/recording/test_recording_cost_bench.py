"""The in-process recording bench (loadtests/recording_cost.py): its fake replica's answers, its variants,
its validity checks, and a tiny real run whose output has the expected shape and whose recording router
wrote one good line per request while the other wrote none. No timing value is asserted."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from burstsched.recording.line import usage_counts
from loadtests.recording_cost import (
    COMPLETION_TOKENS,
    Variant,
    VariantResult,
    answer_reads,
    parse_args,
    problems,
    variants,
)

ROOT = Path(__file__).resolve().parents[2]

TIMINGS = (
    "loop_off_us",
    "loop_on_us",
    "diff_median_us",
    "diff_p90_us",
    "flush_per_line_us",
    "total_us",
)


def test_streams_come_in_the_reads_asked_for_with_their_usage_at_the_end() -> None:
    for reads in (1, 2, 100):
        answer = answer_reads(Variant(stream=True, reads=reads), prompt_tokens=300)
        assert len(answer) == reads
        whole = b"".join(answer)
        assert whole.count(b"data: ") == reads + 2 and whole.endswith(b"data: [DONE]\n\n")
        assert usage_counts(whole) == (300, COMPLETION_TOKENS, 0)
    (body,) = answer_reads(Variant(stream=False), prompt_tokens=300)
    assert json.loads(body)["object"] == "chat.completion"
    assert usage_counts(body) == (300, COMPLETION_TOKENS, 0)


def test_both_kinds_by_default_or_one_when_asked() -> None:
    names = [v.name for v in variants(parse_args([]))]
    assert names == ["json", "stream, 1 read", "stream, 100 reads"]
    assert [v.name for v in variants(parse_args(["--no-stream"]))] == ["json"]
    assert [v.name for v in variants(parse_args(["--stream", "--reads", "7"]))] == ["stream, 7 reads"]


def test_missing_or_stray_lines_and_errors_make_a_run_invalid() -> None:
    good = VariantResult(
        variant="json",
        stream=False,
        reads=None,
        requests=10,
        warmup=2,
        loop_off_us=1,
        loop_on_us=1,
        diff_median_us=0,
        diff_p90_us=0,
        flush_per_line_us=1,
        total_us=1,
        target_us=10,
        passed=True,
        lines_on=12,
        lines_valid=12,
        lines_off=0,
        bad_responses=0,
    )
    assert problems([good]) == []
    assert problems([dataclasses.replace(good, lines_on=11, lines_valid=11)])
    assert problems([dataclasses.replace(good, lines_valid=11)])
    assert problems([dataclasses.replace(good, lines_off=1)])
    assert problems([dataclasses.replace(good, bad_responses=1)])
    # a timing past the target is reported, not an invalid run
    assert problems([dataclasses.replace(good, total_us=50, passed=False)]) == []


def test_tiny_run_has_every_variant_and_one_line_per_recorded_request(tmp_path: Path) -> None:
    """About 6 s: three variants of 20 measured + 5 warm-up requests per router."""
    out, report = tmp_path / "cost.json", tmp_path / "cost.md"
    args = ["--requests", "20", "--warmup", "5", "--reads", "1,3"]
    args += ["--json", str(out), "--report", str(report)]
    done = subprocess.run(
        [sys.executable, str(ROOT / "loadtests" / "recording_cost.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    rows = {row["variant"]: row for row in result["variants"]}
    assert list(rows) == ["json", "stream, 1 read", "stream, 3 reads"]
    kinds = {"json": (False, None), "stream, 1 read": (True, 1), "stream, 3 reads": (True, 3)}
    for name, row in rows.items():
        assert (row["stream"], row["reads"]) == kinds[name]
        assert row["requests"] == 20 and row["warmup"] == 5
        assert row["lines_on"] == row["lines_valid"] == 25, name  # warm-up and measured requests
        assert row["lines_off"] == 0 and row["bad_responses"] == 0, name
        assert all(isinstance(row[key], float | int) for key in TIMINGS), name
        assert row["target_us"] == 10 and row["passed"] is (row["total_us"] <= 10)
        verdict = "pass" if row["passed"] else "FAIL"
        assert f"| {name} |" in done.stdout and f"| {verdict} |" in done.stdout
    markdown = report.read_text()
    assert "| variant | loop off µs |" in markdown and markdown.count("| ≤ 10 |") == 3
