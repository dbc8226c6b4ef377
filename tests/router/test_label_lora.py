"""label-selector-filter and lora-affinity-scorer against llm-d's documented behaviour, the scrape of
``vllm:lora_requests_info``, and the labels and adapters an endpoint's snapshot carries."""

from __future__ import annotations

from collections.abc import Mapping

import anyio
import pytest
from burstsched_plugins.label_selector import LabelSelectorFilter, LabelSelectorParameters
from burstsched_plugins.lora_affinity import LoraAffinityParameters, LoraAffinityScorer
from pydantic import ValidationError

from burstsched.config import EndpointConfig, PoolConfig
from burstsched.discovery.inference_pool import pool_endpoints
from burstsched.discovery.kubernetes import pod_endpoints, slice_endpoints
from burstsched.discovery.source import endpoint_key
from burstsched.framework import CycleState, EndpointSnapshot, PluginContext, SchedRequest
from burstsched.framework.types import ApiKind
from burstsched.pool import EndpointPool
from burstsched.pool.scrape import MetricsParser, parse_vllm_metrics

# --- label-selector-filter ------------------------------------------------------------------------------


def _labelled(**labels: dict[str, str]) -> list[EndpointSnapshot]:
    return [EndpointSnapshot(name=n, url=f"http://{n}", labels=lab) for n, lab in labels.items()]


def _kept(parameters: Mapping[str, object], endpoints: list[EndpointSnapshot]) -> list[str]:
    flt = LabelSelectorFilter("f", LabelSelectorParameters.model_validate(parameters), PluginContext())
    request = SchedRequest(request_id="r", model="m", api=ApiKind.CHAT)
    return [e.name for e in flt.filter(request, endpoints, CycleState())]


POOL = _labelled(
    h100_decode={"hardware-type": "H100", "inference-role": "decode"},
    h100_spot={"hardware-type": "H100", "inference-role": "decode", "tier": "spot"},
    a100={"hardware-type": "A100", "inference-role": "decode"},
    bare={},
)


def test_match_labels_keep_endpoints_with_every_pair() -> None:
    # llm-d's README example: all pairs must match (AND)
    selector = {"match_labels": {"inference-role": "decode", "hardware-type": "H100"}}
    assert _kept(selector, POOL) == ["h100_decode", "h100_spot"]


def test_match_expressions_follow_kubernetes_operators() -> None:
    def kept(op: str, values: list[str], key: str = "tier") -> list[str]:
        return _kept({"match_expressions": [{"key": key, "operator": op, "values": values}]}, POOL)

    assert kept("In", ["spot", "reserved"]) == ["h100_spot"]
    assert kept("NotIn", ["spot"]) == ["h100_decode", "a100", "bare"]  # absent labels match NotIn
    assert kept("Exists", []) == ["h100_spot"]
    assert kept("DoesNotExist", []) == ["h100_decode", "a100", "bare"]
    both = {
        "match_labels": {"hardware-type": "H100"},
        "match_expressions": [{"key": "tier", "operator": "NotIn", "values": ["spot"]}],
    }
    assert _kept(both, POOL) == ["h100_decode"]


def test_an_empty_selector_keeps_every_endpoint_and_none_may_match() -> None:
    assert _kept({}, POOL) == ["h100_decode", "h100_spot", "a100", "bare"]
    assert _kept({"match_labels": {"hardware-type": "B200"}}, POOL) == []  # the scheduler then fails open


@pytest.mark.parametrize(
    "parameters",
    [
        {"match_expressions": [{"key": "tier", "operator": "In", "values": []}]},
        {"match_expressions": [{"key": "tier", "operator": "Exists", "values": ["x"]}]},
        {"match_expressions": [{"key": "tier", "operator": "Gt", "values": ["1"]}]},
        {"match_labels": {"bad key": "v"}},
        {"match_labels": {"k": "bad value!"}},
        {"match_labels": {"Example.com/k": "v"}},  # a prefix is a lower-case DNS subdomain
    ],
)
def test_invalid_selectors_are_refused(parameters: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        LabelSelectorParameters.model_validate(parameters)


# --- lora-affinity-scorer -------------------------------------------------------------------------------


def _adapters(name: str, running: set[str], waiting: set[str], max_adapters: int) -> EndpointSnapshot:
    return EndpointSnapshot(
        name=name,
        url=f"http://{name}",
        running_adapters=frozenset(running),
        waiting_adapters=frozenset(waiting),
        max_adapters=max_adapters,
    )


def _lora_scores(model: str, endpoints: list[EndpointSnapshot]) -> dict[str, float]:
    scorer = LoraAffinityScorer("l", LoraAffinityParameters(), PluginContext())
    return dict(
        scorer.score(SchedRequest(request_id="r", model=model, api=ApiKind.CHAT), endpoints, CycleState())
    )


def test_lora_affinity_scores_running_room_waiting_full_as_llmd() -> None:
    # llm-d's own cases: active 1.0, room for one more 0.8, waiting without room 0.6, full 0.0
    endpoints = [
        _adapters("pod1", {"lora-1"}, set(), 5),
        _adapters("pod2", {"lora-2"}, {"lora-1"}, 5),  # waiting here, but room wins: 0.8
        _adapters("pod3", {"lora-2"}, set(), 2),
        _adapters("pod4", {"lora-3"}, {"lora-1"}, 2),
        _adapters("pod5", {"lora-4", "lora-5"}, set(), 2),
    ]
    assert _lora_scores("lora-1", endpoints) == {
        "pod1": 1.0,
        "pod2": 0.8,
        "pod3": 0.8,
        "pod4": 0.6,
        "pod5": 0.0,
    }


def test_lora_affinity_without_lora_metrics_scores_every_endpoint_zero() -> None:
    endpoints = [_adapters("a", set(), set(), 0), _adapters("b", set(), set(), 0)]
    assert _lora_scores("base-model", endpoints) == {"a": 0.0, "b": 0.0}


# --- the scrape -----------------------------------------------------------------------------------------


# vLLM's exposition with LoRA on: one series per label combination ever set, each valued at the time it was
# last set (set_to_current_time); no model_name/engine labels on this family.
def _lora_line(running: str, waiting: str, at: str) -> str:
    labels = f'max_lora="2",running_lora_adapters="{running}",waiting_lora_adapters="{waiting}"'
    return f"vllm:lora_requests_info{{{labels}}} {at}\n"


MODEL = 'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"'
LORA_PAGE = (
    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    f"vllm:num_requests_running{{{MODEL}}} 3.0\n"
    "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
    "# TYPE vllm:num_requests_waiting gauge\n"
    f"vllm:num_requests_waiting{{{MODEL}}} 1.0\n"
    "# HELP vllm:lora_requests_info Running stats on lora requests.\n"
    "# TYPE vllm:lora_requests_info gauge\n"
    + _lora_line("", "", "1.7650e+09")
    + _lora_line("sql-lora", "", "1.765000120e+09")
    + _lora_line("sql-lora,tweet-lora", "chat-lora", "1.765000130e+09")
    + _lora_line("tweet-lora", "", "1.765000125e+09")
    + "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    f"vllm:kv_cache_usage_perc{{{MODEL}}} 0.25\n"
)


def test_scrape_reads_the_latest_lora_series() -> None:
    metrics = parse_vllm_metrics(LORA_PAGE)
    assert metrics.running_adapters == {"sql-lora", "tweet-lora"}
    assert metrics.waiting_adapters == {"chat-lora"}
    assert metrics.max_adapters == 2
    assert (metrics.running, metrics.waiting, metrics.kv_usage) == (3, 1, 0.25)


def test_scrape_without_lora_and_after_it_changes() -> None:
    parser = MetricsParser()
    plain = parser.parse(LORA_PAGE.replace("vllm:lora_requests_info", "vllm:other_info"))
    assert (plain.running_adapters, plain.waiting_adapters, plain.max_adapters) == (
        frozenset(),
        frozenset(),
        0,
    )
    later = LORA_PAGE + _lora_line("", "", "1.765000200e+09")
    idle = parser.parse(later)
    assert (idle.running_adapters, idle.waiting_adapters, idle.max_adapters) == (frozenset(), frozenset(), 2)


# --- labels from discovery and in the pool's snapshots --------------------------------------------------

POD = {
    "metadata": {"name": "vllm-0", "labels": {"app": "vllm", "hardware-type": "H100"}},
    "status": {"podIP": "10.0.0.5", "conditions": [{"type": "Ready", "status": "True"}]},
}


def test_pods_bring_their_labels_and_slices_none() -> None:
    (pod,) = pod_endpoints(POD, "http", 8000)
    assert pod.labels == {"app": "vllm", "hardware-type": "H100"}
    assert [e.labels for e in pool_endpoints(POD, "http", [8000, 8001])] == [pod.labels, pod.labels]
    endpoint_slice = {
        "ports": [{"port": 8000}],
        "endpoints": [{"addresses": ["10.0.0.5"], "targetRef": {"kind": "Pod", "name": "vllm-0"}}],
    }
    assert [e.labels for e in slice_endpoints(endpoint_slice, "http", 8000)] == [{}]
    relabelled = EndpointConfig(url=pod.url, name=pod.name, labels={"app": "vllm"})
    assert endpoint_key([pod]) != endpoint_key([relabelled])  # a relabelled pod is a change


def test_endpoint_config_labels_are_checked() -> None:
    with pytest.raises(ValidationError):
        EndpointConfig(url="http://10.0.0.5:8000", labels={"bad key": "v"})


class _Replica:
    async def __call__(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        if url.endswith("/metrics"):
            return 200, LORA_PAGE.encode()
        return (200, b"") if url.endswith("/health") else (404, b"")


@pytest.mark.anyio
async def test_snapshots_carry_labels_and_adapters_and_follow_relabelling() -> None:
    changes: list[str] = []
    config = PoolConfig(scrape_interval_ms=5.0, health_check_interval_ms=5.0)
    first = EndpointConfig(url="http://10.0.0.5:8000", name="a", labels={"hardware-type": "H100"})
    pool = EndpointPool([first], config, _Replica(), clock=anyio.current_time, on_change=changes.append)
    async with anyio.create_task_group() as tg:
        tg.start_soon(pool.run)
        with anyio.fail_after(5):
            while pool.snapshot("a").max_adapters != 2:  # noqa: ASYNC110 - the pool's scrape task sets it
                await anyio.sleep(0.005)
        snap = pool.snapshot("a")
        assert dict(snap.labels) == {"hardware-type": "H100"}
        assert snap.running_adapters == {"sql-lora", "tweet-lora"} and snap.waiting_adapters == {"chat-lora"}
        pool.sync([EndpointConfig(url=first.url, name="a", labels={"hardware-type": "A100"})], source="k8s")
        assert dict(pool.snapshot("a").labels) == {"hardware-type": "A100"}
        assert changes == ["relabelled"]
        pool.sync([EndpointConfig(url=first.url, name="a", labels={"hardware-type": "A100"})], source="k8s")
        assert changes == ["relabelled"]  # a repeat changes nothing
        tg.cancel_scope.cancel()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
