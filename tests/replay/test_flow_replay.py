"""``burstsched replay`` through a config with ``flow_control`` on: the router's queue on virtual time."""

from __future__ import annotations

from pathlib import Path

import yaml

from burstsched.config import RouterConfig
from burstsched.config.flow_control import FlowControlConfig
from burstsched.replay.rebuild import rebuild_prompts
from burstsched.replay.runner import ReplayOptions
from burstsched.replay.trace import read_replicas, read_trace, simulated_cache
from burstsched.replay.virtual_run import run_config

from .test_overload import TRACE

REPO = Path(__file__).resolve().parents[2]


def test_flow_control_replays_on_virtual_time_holding_requests_and_losing_none() -> None:
    """The router's queue runs on the replay's clock (its release passes and waits are loop timers): the first
    150 requests of the overloaded trace through ``config/default.yaml`` with ``flow_control`` on. The queue
    holds requests and releases every one (none expires, none is lost), every request completes, the waits
    are seconds of the replay's time, and a second replay gives the same figures to the last digit."""
    requests = read_trace([TRACE])[:150]
    cache = simulated_cache(read_replicas([TRACE]))
    assert cache is not None
    options = ReplayOptions(
        replicas=2,
        virtual_time=True,
        time_scale=1.0,
        kv_blocks=cache.num_gpu_blocks,
        block_size=cache.block_size,
    )
    queue = {"enabled": True, "headroom": {"ride_along_tokens": 0}}  # warm requests wait for room too
    config = RouterConfig.model_validate(
        {**yaml.safe_load((REPO / "config" / "default.yaml").read_text()), "flow_control": queue}
    )
    prompts = rebuild_prompts(requests)
    first = run_config("flow", config, requests, prompts, options)
    again = run_config("flow", config, requests, prompts, options)
    assert first.ok == first.requests == 150
    held = first.flow_outcomes.get("released", 0)
    assert set(first.flow_outcomes) == {"released"} and held >= 50
    # the waits are the replay's time (seconds each), not the host's: the whole replay takes a few seconds
    assert first.flow_wait_s / held > 0.5 and first.flow_wait_s > 5 * first.wall_s
    assert first.ttft_by_request_ms == again.ttft_by_request_ms
    assert (first.hit_rate, first.flow_outcomes) == (again.hit_rate, again.flow_outcomes)
    unqueued = run_config(
        "default",
        config.model_copy(update={"flow_control": FlowControlConfig(enabled=False)}),
        requests,
        prompts,
        options,
    )
    assert unqueued.ok == 150 and not unqueued.flow_outcomes
