"""The cache probe (loadtests/cache_probe.py) on the simulator: its engine and the block-pool replay agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtests.cache_probe import main, parse_args


def test_the_simulators_engine_reads_from_cache_what_the_replay_predicts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "probe.json"
    # 60 prompts of ~2,600 tokens in 40 blocks of 128: documents evict each other, partial blocks too.
    args = ["--backend", "sim", "--requests", "60", "--kv-blocks", "40", "--json", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "requests with exactly the replay's cached tokens: 60/60" in printed
    rows = json.loads(out.read_text())["requests"]
    assert len(rows) == 60
    assert all(r["cached_tokens"] == r["replayed_cached_tokens"] for r in rows)
    hits = [r for r in rows if r["cached_tokens"] > 0]
    misses = [
        r
        for r in rows[1:]
        if r["cached_tokens"] == 0 and r["document"] in {x["document"] for x in rows[: r["index"]]}
    ]
    assert hits and misses  # some documents were found again, some had been evicted


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--doc-tokens", "long"])
    with pytest.raises(SystemExit):
        parse_args(["--requests", "0"])
