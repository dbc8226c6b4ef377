from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from burstsched.workloads.replica_metrics import ReplicaCounters, parse_counters
from burstsched.workloads.stats import percentile

EXPOSITION = """\
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 3.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 2.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 640.0
# HELP vllm:request_prefill_kv_computed_tokens Histogram of new KV tokens computed during prefill.
# TYPE vllm:request_prefill_kv_computed_tokens histogram
vllm:request_prefill_kv_computed_tokens_bucket{engine="0",le="+Inf",model_name="m"} 5.0
vllm:request_prefill_kv_computed_tokens_count{engine="0",model_name="m"} 5.0
vllm:request_prefill_kv_computed_tokens_sum{engine="0",model_name="m"} 360.0
"""


def test_parse_counters_sums_label_sets() -> None:
    counters = parse_counters(EXPOSITION)
    assert counters.requests_finished == 5.0
    assert counters.prefix_queries == 1000.0
    assert counters.prefix_hits == 640.0
    assert counters.prefill_computed_tokens == 360.0


def test_counter_difference_is_field_by_field() -> None:
    delta = ReplicaCounters(2, 10, 5, 7, 1) - ReplicaCounters(1, 4, 5, 2, 0)
    assert delta == ReplicaCounters(1, 6, 0, 5, 1)


def test_percentile_matches_linear_interpolation() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([5.0], 95) == 5.0
    assert percentile(list(range(101)), 95) == pytest.approx(95.0)
    assert math.isnan(percentile([], 50))


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_lies_between_min_and_max(values: list[float], q: float) -> None:
    p = percentile(values, q)
    assert min(values) - 1e-6 <= p <= max(values) + 1e-6
