"""A replica's /metrics re-renders only the families that changed; the text is the full exposition's."""

from __future__ import annotations

from prometheus_client import generate_latest

from burstsched.sim.config import SimConfig
from burstsched.sim.metrics import SimMetrics


def test_every_render_is_the_whole_registry_s_exposition() -> None:
    metrics = SimMetrics(SimConfig())
    first = metrics.render(num_running=1, num_waiting=0, kv_cache_usage=0.5)
    assert first == generate_latest(metrics.registry)
    metrics.prefix_cache_lookup(10, 5)
    metrics.step(3)
    metrics.preemption()
    changed = metrics.render(num_running=2, num_waiting=1, kv_cache_usage=0.25)
    assert changed == generate_latest(metrics.registry)
    assert changed != first
    assert b"vllm:prefix_cache_hits_total" in changed and b"vllm:num_preemptions_total" in changed
    # nothing changed but the gauges: the cached families stay exact
    again = metrics.render(num_running=0, num_waiting=0, kv_cache_usage=0.0)
    assert again == generate_latest(metrics.registry)
