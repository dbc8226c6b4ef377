"""The per-kind comparison of a recorded-placement replay with the recording."""

from __future__ import annotations

import math

import pytest

from burstsched.replay.fidelity import fidelity_rows, fidelity_table
from burstsched.replay.trace import TracedRequest


def _request(t: float, ttft_ms: float, e2e_ms: float, cached: int, endpoint: str = "a") -> TracedRequest:
    return TracedRequest(
        t=t,
        api="completions",
        blocks=(1, 2),
        prompt_tokens=128,
        block_tokens=64,
        bytes_per_token=4,
        max_tokens=8,
        output_tokens=8,
        stream=True,
        input_tokens=1000,
        cached_tokens=cached,
        ttft_ms=ttft_ms,
        e2e_ms=e2e_ms,
        endpoint=endpoint,
    )


def test_requests_are_split_by_cache_and_by_what_their_endpoint_was_serving() -> None:
    requests = [
        _request(0.0, 300.0, 1000.0, cached=0),  # cold, alone on a
        _request(0.5, 40.0, 200.0, cached=900),  # warm, a is serving the first (until t=1.0)
        _request(0.6, 50.0, 100.0, cached=800, endpoint="b"),  # warm, b idle
        _request(2.0, 400.0, 500.0, cached=100),  # cold, alone again (a is idle by then)
        _request(2.1, 80.0, 90.0, cached=0, endpoint="b"),  # no replayed TTFT: left out
    ]
    replayed = [150.0, 80.0, 50.0, 200.0, None]
    rows = {r.kind: r for r in fidelity_rows(requests, replayed)}
    assert list(rows) == ["warm, endpoint idle", "warm, endpoint busy", "cold, endpoint idle", "all"]
    cold = rows["cold, endpoint idle"]
    assert cold.requests == 2
    assert cold.recorded_p50_ms == pytest.approx(350.0)
    assert cold.replayed_p50_ms == pytest.approx(175.0)
    assert cold.ratio_median == pytest.approx(0.5)
    assert rows["warm, endpoint busy"].ratio_median == pytest.approx(2.0)
    assert rows["warm, endpoint idle"].ratio_median == pytest.approx(1.0)
    assert rows["all"].requests == 4
    assert rows["all"].ratio_median == pytest.approx(0.75)  # ratios 0.5, 0.5, 1.0, 2.0
    table = fidelity_table(list(rows.values()))
    assert table[2] == ("cold, endpoint idle", "2", "350 / 390 ms", "175 / 195 ms", "0.50")


def test_one_replayed_value_per_recorded_request_is_required() -> None:
    with pytest.raises(ValueError, match="one replayed TTFT"):
        fidelity_rows([_request(0.0, 1.0, 2.0, 0)], [])
    assert fidelity_rows([], []) == []
    assert not math.isnan(fidelity_rows([_request(0.0, 1.0, 2.0, 0)], [1.0])[0].ratio_median)
