"""The burst-split bench (loadtests/burst_split.py): its mode order, its table, a whole run on the sim."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from loadtests.burst_split import HEADER, Sample, alternating, main, summary_rows


def test_modes_alternate_so_each_leads_as_often_as_it_follows() -> None:
    order = alternating("a", "b", 4)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert Counter(order) == {"a": 4, "b": 4}


def _sample(mode: str, trial: int, ttft_ms: float, cached: int | None = 100) -> Sample:
    return Sample("warm burst", mode, trial, "r0", ttft_ms, ttft_ms + 50, 200, cached)


def test_the_table_has_one_row_per_mode_with_the_mean_of_each_trials_slowest() -> None:
    samples = [
        _sample("one", 0, 100),
        _sample("one", 0, 300),
        _sample("one", 3, 200),
        _sample("one", 3, 500),
        _sample("split", 1, 80, cached=None),
        _sample("split", 1, 120, cached=None),
    ]
    rows = summary_rows(samples)
    assert [row[:4] for row in rows] == [["warm burst", "one", "2", "4"], ["warm burst", "split", "1", "2"]]
    assert all(len(row) == len(HEADER) for row in rows)
    assert rows[0][5] == "400"  # (300 + 500) / 2
    assert rows[1][5] == "120"
    assert rows[0][7] == "100"
    assert rows[1][7] == "-"  # no replica reported cached tokens


def test_a_run_on_the_simulator_places_every_mode_as_it_says(tmp_path: Path) -> None:
    out = tmp_path / "split"
    args = ["--backend", "sim", "--time-scale", "0.02", "--trials", "1", "--system-words", "300"]
    assert main([*args, "--out", str(out)]) == 0
    payload = json.loads(Path(f"{out}.json").read_text())
    samples = [Sample(**s) for s in payload["samples"]]
    by_mode = Counter((s.phase, s.mode) for s in samples)
    assert by_mode == {
        ("warm burst", "one replica"): 8,
        ("warm burst", "split"): 8,
        ("cold prefill", "alone"): 1,
        ("cold prefill", "beside another"): 2,
        ("cold burst", "straight"): 8,
        ("cold burst", "through burstsched"): 8,
    }
    for trial in {s.trial for s in samples if s.phase == "warm burst"}:
        burst = [s for s in samples if s.phase == "warm burst" and s.trial == trial]
        spread = sorted(Counter(s.replica for s in burst).values())
        assert spread == ([8] if burst[0].mode == "one replica" else [4, 4])
        # the warm-up put the system prompt on both replicas: every member finds it cached
        assert all(s.cached_tokens is not None and s.cached_tokens >= 256 for s in burst)
    cold = [s for s in samples if s.phase == "cold prefill"]
    assert all(s.cached_tokens == 0 for s in cold)
    through = [s for s in samples if s.mode == "through burstsched"]
    assert {s.replica for s in through} <= {"sim-0", "sim-1"}  # the router's header names the replica
    assert Path(f"{out}.md").read_text().count("| warm burst") == 2


def test_the_pool_must_have_two_replicas() -> None:
    with pytest.raises(SystemExit):
        main(["--replicas", "3"])
