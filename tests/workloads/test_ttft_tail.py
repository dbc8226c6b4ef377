"""The tail of a workload run sorted by what placement could have done, read from a workload report."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from loadtests.ttft_tail import KINDS, main, rows, tail_kinds


def _request(replica: str | None, sent_s: float, ttft_ms: float, prompt: int, cached: int) -> dict[str, Any]:
    return {
        "replica": replica,
        "sent_s": sent_s,
        "ttft_ms": ttft_ms,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
    }


REQUESTS = [
    _request("a", 0.0, 300, 3000, 0),  # nothing else in prefill: cold, replica free
    _request("b", 0.1, 300, 3000, 0),  # the first is in its prefill on a, b is free: cold, replica free
    _request("a", 0.2, 280, 3000, 0),  # both replicas in a long prefill: cold, all busy
    _request("a", 1.0, 300, 3000, 0),  # cold, replica free
    _request("a", 1.1, 290, 3000, 0),  # a busy with the one before, b free: placement had room
    _request("a", 1.2, 200, 3000, 2950),  # warm, a busy, b free
    _request("b", 2.0, 10, 100, 0),  # too short to make b busy, and not in the tail
    _request("b", 2.1, 150, 3000, 2950),  # warm, nothing busy: other
]


def test_each_tail_request_is_sorted_by_what_placement_could_have_done() -> None:
    p95, kinds = tail_kinds(REQUESTS, share=0.5)
    assert p95 == pytest.approx(300.0)
    assert kinds == {KINDS[0]: 3, KINDS[1]: 1, KINDS[2]: 1, KINDS[3]: 1, KINDS[4]: 1}


def test_only_the_share_of_the_p95_counts() -> None:
    _, kinds = tail_kinds(REQUESTS, share=0.95)
    assert sum(kinds.values()) == 4  # 300, 300, 300, 290
    assert kinds[KINDS[0]] == 3 and kinds[KINDS[1]] == 1


def test_runs_without_replicas_are_left_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = {
        "runs": [
            {"summary": {"target": "burstsched:cost", "rate": 3.8}, "requests": REQUESTS},
            {
                "summary": {"target": "sglang:cache_aware", "rate": 3.8},
                "requests": [_request(None, 0.0, 300, 3000, 0)],
            },
        ]
    }
    table = rows(report, 0.5)
    assert [row[:3] for row in table] == [("burstsched:cost @ 3.80/s", "300", "7")]
    path = tmp_path / "run.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump(report, handle)
    assert main([str(path), "--share", "0.5", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "burstsched:cost @ 3.80/s" in out and "sglang" not in out
    assert main([str(path), "--share", "0.5"]) == 0  # a plain-text table, its columns aligned
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("run ") and lines[1].startswith("burstsched:cost @ 3.80/s  300 ")
    assert lines[0].index("p95 ms") == lines[1].index("300")
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"runs": [report["runs"][1]]}))
    assert main([str(empty)]) == 1
