"""A trace recorded past the pool's capacity replays as it ran.

``data/overloaded-sim.jsonl.gz``: document QA through ``config/default.yaml`` on 2 simulated replicas (the
simulator's default costs, time scale 1, 1293 KV blocks of 16 tokens each) at 3x their cold capacity for
60 s: 336 requests, hit rate 61.5%, TTFT p50 5.7 s and p95 14.2 s (``loadtests/reports/replay-overload-sim/``;
prompt text and decisions left out).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from burstsched.replay.calibrate import calibrate
from burstsched.replay.rebuild import rebuild_prompts
from burstsched.replay.runner import ReplayOptions
from burstsched.replay.trace import read_replicas, read_trace, simulated_cache, summarize_trace
from burstsched.replay.virtual_run import RecordedPlacement, run_config
from burstsched.sim import CostModel

TRACE = Path(__file__).parent / "data" / "overloaded-sim.jsonl.gz"


def test_an_overloaded_trace_calibrates_to_the_costs_that_recorded_it() -> None:
    """Nearly every request of the trace waited behind others' prefill and decoded beside it: fitted on all
    of them, the prefill came out 7x too fast, the front end 8x too slow and a slowdown of 0.62 per sequence
    appeared where the simulator has none. Fitted on those with no prompt ahead or beside, the costs are
    the simulator's own."""
    truth = CostModel()
    fitted = calibrate(read_trace([TRACE]))
    assert fitted is not None and fitted.points == 336
    cost = fitted.cost
    assert cost.step_overhead_s == pytest.approx(truth.step_overhead_s, rel=0.1)
    assert cost.load_slowdown < 0.005  # 50 sequences in a step: at most 1.25x where the simulator has 1x
    assert cost.prefill_s_per_token == pytest.approx(truth.prefill_s_per_token, rel=0.05)
    assert cost.frontend_s_per_prompt_token == pytest.approx(truth.frontend_s_per_prompt_token, rel=0.3)
    assert cost.jitter < 0.1
    assert 10 <= fitted.ttft_points < 40 and 10 <= fitted.step_points < 40  # few requests had the pool alone


def test_an_overloaded_trace_replays_its_recorded_latencies_with_its_recorded_placement() -> None:
    """Each request sent to the replica it was recorded on, on simulated replicas with the fitted costs: the
    queues grow as they did, so the TTFTs come back as recorded (with the costs fitted on every request:
    p50 2.7 s, p95 19.3 s)."""
    requests = read_trace([TRACE])
    cache = simulated_cache(read_replicas([TRACE]))
    fitted = calibrate(requests)
    assert cache is not None and fitted is not None
    options = ReplayOptions(
        replicas=2,
        virtual_time=True,
        time_scale=1.0,
        kv_blocks=cache.num_gpu_blocks,
        block_size=cache.block_size,
        cost=fitted.cost,
    )
    placed = RecordedPlacement()
    result = run_config(placed.label, placed, requests, rebuild_prompts(requests), options)
    recorded = summarize_trace(requests)
    assert result.ok == result.requests == 336
    assert result.hit_rate == pytest.approx(recorded.hit_rate, abs=0.02)
    assert result.ttft_p50_ms == pytest.approx(recorded.ttft_p50_ms, rel=0.1)
    assert result.ttft_p95_ms == pytest.approx(recorded.ttft_p95_ms, rel=0.1)
