"""A tiny trace replayed through two configs on the simulator; the sweep's grid and its choice."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from burstsched.config import AdmissionConfig, RouterConfig
from burstsched.recording import hex_chain
from burstsched.replay.cli import replay_all
from burstsched.replay.report import best, write_report
from burstsched.replay.runner import ReplayOptions, ReplayResult
from burstsched.replay.sweep import SweepError, grid, parse_axis
from burstsched.replay.trace import read_trace, summarize_trace

REPO = Path(__file__).resolve().parents[2]


def _write_trace(path: Path, count: int = 10, gap_s: float = 0.2) -> None:
    rng = random.Random(5)
    document = [rng.getrandbits(64) for _ in range(12)]
    with path.open("w") as handle:
        for i in range(count):
            line = {
                "v": 1,
                "t": 1_700_000_000.0 + gap_s * i,
                "api": "chat",
                "model": "m",
                "stream": True,
                "block_tokens": 64,
                "bytes_per_token": 4,
                "blocks": hex_chain(tuple(document)),
                "prompt_tokens": 12 * 64 + 20,
                "input_tokens": 790,
                "cached_tokens": 0 if i == 0 else 768,
                "max_tokens": 4,
                "output_tokens": 4,
                "endpoint": "e0",
                "outcome": "ok",
                "ttft_ms": 50.0,
                "e2e_ms": 60.0,
            }
            handle.write(json.dumps(line) + "\n")


@pytest.mark.anyio
async def test_a_tiny_trace_replays_through_two_configs_into_a_table(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    _write_trace(trace)
    requests = read_trace([trace])
    assert [r.t for r in requests][:2] == [0.0, pytest.approx(0.2)]
    configs = [
        ("prefix-aware", RouterConfig()),
        ("random", RouterConfig.model_validate_json(json.dumps(_random_config()))),
    ]
    options = ReplayOptions(replicas=2, time_scale=0.05)
    results, skipped, _ = await replay_all(configs, requests, options, progress=False)
    assert not skipped
    assert [r.label for r in results] == ["prefix-aware", "random"]
    for result in results:
        assert result.ok == result.requests == 10
        assert sum(result.requests_per_replica.values()) == 10
        assert not math.isnan(result.ttft_p95_ms)
        assert 0.0 <= result.hit_rate <= 1.0
    # one shared document: the prefix-aware config keeps it on one replica and hits from the second request
    assert results[0].hit_rate > 0.5
    paths = write_report(
        tmp_path / "out", "trace.jsonl", summarize_trace(requests), results, options, "ttft_p95"
    )
    text = paths["markdown"].read_text()
    assert "| recorded |" in text and "| prefix-aware |" in text and "| random |" in text
    assert paths["ttft_cdf"].stat().st_size > 0
    assert json.loads(paths["json"].read_text())["best"] in ("prefix-aware", "random")


def _random_config() -> dict[str, object]:
    import yaml

    return dict(yaml.safe_load((REPO / "config" / "random.yaml").read_text()))


def _result(label: str, p95: float, hit: float, ok: int = 10) -> ReplayResult:
    return ReplayResult(label, 10, ok, hit, p95 / 2, p95, p95 * 2, 100.0, {"sim-0": ok}, 1.0)


def test_the_best_config_is_the_one_the_objective_prefers() -> None:
    results = [
        _result("a", 300, 0.5),
        _result("b", 120, 0.4),
        _result("c", 90, 0.2, ok=7),
        _result("d", 200, 0.9),
    ]
    assert best(results, "ttft_p95") is results[1]  # c is faster but lost requests
    assert best(results, "hit_rate") is results[3]
    assert best([_result("n", math.nan, math.nan)], "ttft_p95") is None


def test_the_sweep_grid_is_validated_against_the_config_model() -> None:
    axes = [
        parse_axis("admission.window_ms=5,10,20"),
        parse_axis("profile.plugins.prefix-cache-scorer.weight=1,3"),
    ]
    points = grid(RouterConfig(), axes)
    assert len(points) == 6
    label, config = points[-1]
    assert label == "window_ms=20 prefix-cache-scorer=3"
    assert config.admission == AdmissionConfig(window_ms=20)
    weights = {p.plugin_ref: p.weight for p in config.profile.plugins}
    assert weights["prefix-cache-scorer"] == 3
    with pytest.raises(SweepError):
        grid(RouterConfig(), [parse_axis("admission.window_ms=0")])  # must be > 0
    with pytest.raises(SweepError):
        grid(RouterConfig(), [parse_axis("admission.no_such_key=1")])
