"""The saturation filter: a warm but overloaded endpoint stops pulling its prefix's requests."""

from __future__ import annotations

import random

from burstsched_plugins.saturation_filter import SaturationFilter, SaturationFilterParameters
from hypothesis import given
from hypothesis import strategies as st

from burstsched.config import parse_config_text
from burstsched.framework import CycleState, EndpointSnapshot, PluginContext

from .helpers import sched_request, scheduler_for

CTX = PluginContext(rng=random.Random(0))
PARAMS = SaturationFilterParameters(max_waiting=16, max_kv_usage=0.9, max_in_flight=64)


def ep(name: str, **fields: object) -> EndpointSnapshot:
    return EndpointSnapshot(name, f"http://{name}", **fields)  # type: ignore[arg-type]


def test_drops_long_queues_full_kv_and_busy_stale_endpoints() -> None:
    f = SaturationFilter("s", PARAMS, CTX)
    endpoints = [
        ep("queue", waiting=10, pending=6),
        ep("kv", kv_usage=0.9),
        ep("stale-busy", stale=True, waiting=0, in_flight=64),
        ep("stale-idle", stale=True, waiting=500, in_flight=1),
        ep("ok", waiting=15, kv_usage=0.89),
    ]
    kept = f.filter(sched_request(), endpoints, CycleState())
    assert [e.name for e in kept] == ["stale-idle", "ok"]


@given(st.lists(st.tuples(st.integers(0, 40), st.floats(0, 1)), min_size=1, max_size=6))
def test_never_drops_every_endpoint(loads: list[tuple[int, float]]) -> None:
    f = SaturationFilter("s", PARAMS, CTX)
    endpoints = [ep(f"e{i}", waiting=w, kv_usage=kv) for i, (w, kv) in enumerate(loads)]
    kept = f.filter(sched_request(), endpoints, CycleState())
    assert kept
    assert all(not f.saturated(e) for e in kept) or len(kept) == len(endpoints)


PROFILE = """
plugins:
  - type: approx-prefix-producer
  - type: health-filter
  - type: saturation-filter
    parameters: {max_waiting: 16}
  - type: prefix-cache-scorer
  - type: queue-scorer
  - type: kv-utilization-scorer
  - type: max-score-picker
profile:
  plugins:
    - plugin_ref: approx-prefix-producer
    - plugin_ref: health-filter
    - plugin_ref: saturation-filter
    - plugin_ref: prefix-cache-scorer
      weight: 3
    - plugin_ref: queue-scorer
      weight: 2
    - plugin_ref: kv-utilization-scorer
      weight: 2
  picker: max-score-picker
"""


def test_a_warm_group_leaves_its_saturated_replica_and_stays_when_it_is_not() -> None:
    without = PROFILE.replace("    - plugin_ref: saturation-filter\n", "")
    group = sched_request(range(1, 40), group_size=8)
    for text, busy_goes_to in ((PROFILE, "cold"), (without, "warm")):
        scheduler = scheduler_for(parse_config_text(text))
        warm, cold = ep("warm"), ep("cold")
        scheduler.on_dispatch(group, warm)
        assert scheduler.schedule(group, [warm, cold]).endpoint.name == "warm"
        busy = [ep("warm", waiting=40), ep("cold", waiting=2)]
        assert scheduler.schedule(group, busy).endpoint.name == busy_goes_to
