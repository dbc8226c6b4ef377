from __future__ import annotations

import httpx
import pytest

from burstsched.config import EndpointConfig, PoolConfig
from burstsched.dispatch import HttpxUpstream, getter
from burstsched.pool import EndpointPool, MetricsFormatError, MetricsParser, parse_vllm_metrics

VLLM_PAGE = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 1234.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 2.0
vllm:num_requests_waiting{engine="1",model_name="tiny"} 5.0
# HELP vllm:num_requests_waiting_by_reason Waiting by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 99.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.5
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0",num_cpu_blocks="None",\
num_gpu_blocks="80"} 1.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 5000.0
"""


def test_parse_vllm_metrics_sums_engines_and_reads_cache_config() -> None:
    metrics = parse_vllm_metrics(VLLM_PAGE)
    assert (metrics.waiting, metrics.running) == (7, 4)
    assert metrics.kv_usage == 0.5
    assert (metrics.block_size, metrics.num_gpu_blocks) == (128, 80)
    assert metrics.model_names == frozenset({"tiny"})


def test_parse_rejects_pages_without_queue_gauges() -> None:
    with pytest.raises(MetricsFormatError):
        parse_vllm_metrics("# TYPE foo gauge\nfoo 1\n")
    with pytest.raises(MetricsFormatError):
        parse_vllm_metrics("vllm:num_requests_waiting{ 1\n")


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Replica:
    """An httpx MockTransport handler for one or two replicas, with switchable failures."""

    def __init__(self) -> None:
        self.metrics_status = 200
        self.refuse = False

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.refuse:
            raise httpx.ConnectError("refused", request=request)
        if request.url.path == "/health":
            return httpx.Response(200)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "tiny", "object": "model"}]})
        if request.url.path == "/metrics":
            return httpx.Response(self.metrics_status, text=VLLM_PAGE)
        return httpx.Response(404)


@pytest.mark.anyio
async def test_pool_scrapes_marks_stale_and_degrades_without_halting() -> None:
    replica, clock = _Replica(), _Clock()
    config = PoolConfig(staleness_threshold_ms=200)
    fetch = getter(HttpxUpstream(httpx.MockTransport(replica)))
    pool = EndpointPool([EndpointConfig(url="http://r1:8000", name="r1")], config, fetch, clock=clock)
    assert pool.snapshots()[0].healthy is False
    await pool.refresh()
    snap = pool.snapshot("r1")
    assert snap.healthy and not snap.stale
    assert (snap.waiting, snap.kv_usage, snap.block_size, snap.num_gpu_blocks) == (7, 0.5, 128, 80)
    assert pool.model_ids() == ["tiny"] and pool.knows_model("tiny") and not pool.knows_model("other")

    replica.metrics_status = 500
    clock.now += 0.5
    await pool.scrape("r1")
    snap = pool.snapshot("r1")
    assert snap.healthy and snap.stale and snap.metrics_age == pytest.approx(0.5)

    pool.acquire("r1")
    pool.acquire("r1")
    pool.release("r1")
    assert pool.snapshot("r1").in_flight == 1

    replica.refuse = True
    await pool.scrape("r1")
    assert not pool.snapshot("r1").healthy
    assert pool.healthy_count() == 0

    replica.refuse = False
    replica.metrics_status = 200
    await pool.refresh()
    assert pool.snapshot("r1").healthy and not pool.snapshot("r1").stale


@pytest.mark.anyio
async def test_repeated_dispatch_failures_mark_unhealthy_until_the_next_check() -> None:
    replica, clock = _Replica(), _Clock()
    fetch = getter(HttpxUpstream(httpx.MockTransport(replica)))
    pool = EndpointPool([EndpointConfig(url="http://r1:8000", name="r1")], PoolConfig(), fetch, clock=clock)
    await pool.refresh()
    pool.report_failure("r1", unreachable=False)
    pool.report_failure("r1", unreachable=False)
    assert pool.snapshot("r1").healthy
    pool.report_failure("r1", unreachable=False)
    assert not pool.snapshot("r1").healthy
    clock.now += 1.0  # the circuit's wait (a passing health check does not close it)
    await pool.check_health("r1")
    assert pool.snapshot("r1").healthy
    pool.report_failure("r1", unreachable=True)  # a refused connection counts at once
    assert not pool.snapshot("r1").healthy


@pytest.mark.anyio
async def test_configured_models_override_the_replicas() -> None:
    fetch = getter(HttpxUpstream(httpx.MockTransport(_Replica())))
    pool = EndpointPool(
        [EndpointConfig(url="http://r1:8000")], PoolConfig(), fetch, clock=_Clock(), models=["alias"]
    )
    await pool.refresh()
    assert pool.model_ids() == ["alias"]
    assert pool.knows_model("alias") and not pool.knows_model("tiny")
    assert pool.names == ["r1:8000"]


def test_parser_reuses_an_unchanged_cache_config_and_rereads_a_changed_one() -> None:
    parser = MetricsParser()
    first = parser.parse(VLLM_PAGE)
    again = parser.parse(VLLM_PAGE.replace("} 2.0\n", "} 4.0\n", 1))
    assert (again.block_size, again.num_gpu_blocks) == (first.block_size, first.num_gpu_blocks) == (128, 80)
    assert again.waiting == 9
    changed = parser.parse(VLLM_PAGE.replace('num_gpu_blocks="80"', 'num_gpu_blocks="160"'))
    assert changed.num_gpu_blocks == 160
    without = parser.parse(VLLM_PAGE.replace("vllm:cache_config_info{", "vllm:other_info{"))
    assert (without.block_size, without.num_gpu_blocks) == (None, None)
