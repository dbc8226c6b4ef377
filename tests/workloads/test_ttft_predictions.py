"""The predicted-against-actual TTFT table read from a workload report."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from loadtests.ttft_predictions import load, main, pairs, rows


def _request(predicted: float | None, actual: float, prompt: int, cached: int) -> dict[str, object]:
    headers = {} if predicted is None else {"x-burstsched-predicted-ttft-ms": f"{predicted:.1f}"}
    return {"ttft_ms": actual, "prompt_tokens": prompt, "cached_tokens": cached, "headers": headers}


REPORT: dict[str, Any] = {
    "runs": [
        {
            "summary": {"target": "burstsched:cost", "rate": 2.0},
            "requests": [
                _request(None, 300.0, 3000, 0),  # before its replica was fitted
                _request(150.0, 200.0, 3000, 0),
                _request(250.0, 200.0, 3000, 0),
                _request(30.0, 40.0, 3000, 2944),
                _request(30.0, 20.0, 3000, 2944),
            ],
        },
        {"summary": {"target": "sglang:cache_aware", "rate": 2.0}, "requests": [_request(None, 50, 10, 0)]},
    ]
}


def test_pairs_keep_requests_with_a_prediction_and_tell_warm_from_cold() -> None:
    found = pairs(REPORT["runs"][0]["requests"])
    assert found == [(150.0, 200.0, False), (250.0, 200.0, False), (30.0, 40.0, True), (30.0, 20.0, True)]


def test_rows_give_bias_and_errors_per_kind(tmp_path: Path) -> None:
    table = {r[0]: r for r in rows(REPORT)}
    assert set(table) == {
        "burstsched:cost @ 2.00/s all",
        "burstsched:cost @ 2.00/s warm",
        "burstsched:cost @ 2.00/s cold",
    }
    cold = table["burstsched:cost @ 2.00/s cold"]
    assert cold[1:] == ("5", "2", "200", "250", "+0", "50", "0.25 / 0.25")
    warm = table["burstsched:cost @ 2.00/s warm"]
    assert warm[5:7] == ("+0", "10")
    path = tmp_path / "run.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump(REPORT, handle)
    assert load(path) == REPORT
    assert main([str(path), "--markdown"]) == 0
    empty = tmp_path / "none.json"
    empty.write_text(json.dumps({"runs": [REPORT["runs"][1]]}))
    assert main([str(empty)]) == 1
