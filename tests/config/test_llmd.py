"""llm-d's EndpointPickerConfig: every mapped plugin type, weights, refusals, both formats in one loader."""

from __future__ import annotations

import random
import textwrap
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from burstsched.config import (
    ConfigError,
    EndpointConfig,
    PoolConfig,
    RouterConfig,
    decode_config,
    load_config,
    parse_config_document,
    parse_config_text,
    read_config,
)
from burstsched.config.llmd_params import parse_duration_ms
from burstsched.framework import PluginContext, PluginRegistry
from burstsched.scheduling import Scheduler, build_scheduler
from burstsched.server.serve import running_router
from burstsched.sim import SimConfig, SimPool

REPO = Path(__file__).resolve().parents[2]
REGISTRY = PluginRegistry.discover()
HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"


def _llmd(body: str) -> str:
    return HEAD + textwrap.dedent(body)


def _build(config: RouterConfig) -> Scheduler:
    return build_scheduler(config, REGISTRY, PluginContext(rng=random.Random(0)))


def _issues(text: str) -> dict[str, str]:
    with pytest.raises(ConfigError) as excinfo:
        parse_config_text(text)
    return {issue.path: issue.message for issue in excinfo.value.issues}


def _spec(config: RouterConfig, name: str) -> tuple[str, dict[str, Any]]:
    spec = next(s for s in config.plugins if s.instance_name == name)
    return spec.type, dict(spec.parameters)


def _profile(config: RouterConfig) -> list[tuple[str, float | None]]:
    return [(ref.plugin_ref, ref.weight) for ref in config.profile.plugins]


def _parameters(config: RouterConfig, name: str) -> BaseModel:
    """A plugin's parameters as its type validates them (defaults filled in)."""
    spec = next(s for s in config.plugins if s.instance_name == name)
    factory = REGISTRY.get(spec.type)
    assert factory is not None
    return factory.Parameters.model_validate(spec.parameters)


def _shape(config: RouterConfig) -> tuple[list[tuple[str, BaseModel, float]], tuple[str, BaseModel]]:
    """The scheduler a config builds: each profile plugin's type, validated parameters and weight."""
    types = {s.instance_name: s.type for s in config.plugins}
    refs = [
        (types[r.plugin_ref], _parameters(config, r.plugin_ref), 1.0 if r.weight is None else r.weight)
        for r in config.profile.plugins
    ]
    return refs, (types[config.profile.picker], _parameters(config, config.profile.picker))


# --- the shipped example -----------------------------------------------------------------------------


def test_llmd_prefix_aware_builds_the_same_scheduler_as_prefix_aware() -> None:
    llmd = read_config(REPO / "config" / "llmd-prefix-aware.yaml")
    native = load_config(REPO / "config" / "prefix-aware.yaml")
    assert llmd.origin == "llm-d EndpointPickerConfig llm-d.ai/v1alpha1, translated"
    assert _shape(llmd.config) == _shape(native)
    # Everything else too, but the pool selector the file's InferencePool carries.
    assert llmd.config.pool.selector is not None
    assert llmd.config.pool.selector.match_labels == {"app": "vllm-llama3"}
    assert llmd.config.pool.selector.target_port == 8000
    # llm-d queues nothing without its flowControl feature gate, which the file leaves off; ours is on
    assert not llmd.config.flow_control.enabled and native.flow_control.enabled
    rest = {"plugins", "profile", "pool", "flow_control"}
    assert llmd.config.model_dump(exclude=rest) == native.model_dump(exclude=rest)
    assert llmd.config.flow_control.model_copy(update={"enabled": True}) == native.flow_control
    assert llmd.config.pool.model_copy(update={"selector": None}) == native.pool
    built_llmd, built_native = _build(llmd.config), _build(native)
    for slot in ("producers", "filters"):
        assert [type(p) for p in getattr(built_llmd.profile, slot)] == [
            type(p) for p in getattr(built_native.profile, slot)
        ]
    assert [(type(s.scorer), s.weight) for s in built_llmd.profile.scorers] == [
        (type(s.scorer), s.weight) for s in built_native.profile.scorers
    ]
    assert type(built_llmd.profile.picker) is type(built_native.profile.picker)


# --- every mapped plugin type ------------------------------------------------------------------------


def test_approx_producer_maps_block_size_cap_and_capacity() -> None:
    config = parse_config_text(
        _llmd("""
        plugins:
          - type: approx-prefix-cache-producer
            name: approx
            parameters: {blockSizeTokens: 32, maxPrefixTokensToMatch: 4096, lruCapacityPerServer: 1000,
                         autoTune: true}
          - type: prefix-cache-scorer
            parameters: {prefixMatchInfoProducerName: approx}
          - type: max-score-picker
        schedulingProfiles:
          - name: default
            plugins: [{pluginRef: prefix-cache-scorer, weight: 5}, {pluginRef: max-score-picker}]
        """)
    )
    assert _spec(config, "approx") == ("approx-prefix-producer", {"default_capacity_blocks": 1000})
    assert (config.prefix_hashing.block_tokens, config.prefix_hashing.max_blocks) == (32, 128)
    assert _profile(config) == [("approx", None), ("health-filter", None), ("prefix-cache-scorer", 5.0)]
    assert config.admission.enabled is False
    _build(config)


def test_approx_producer_defaults_are_llmds_and_a_block_cap_applies_when_the_token_cap_is_zero() -> None:
    config = parse_config_text(
        _llmd("""
        plugins:
          - type: approx-prefix-cache-producer
          - type: max-score-picker
        schedulingProfiles: [{name: default, plugins: [{pluginRef: max-score-picker}]}]
        """)
    )
    assert (config.prefix_hashing.block_tokens, config.prefix_hashing.max_blocks) == (64, 131072 // 64)
    assert _spec(config, "approx-prefix-producer")[1] == {"default_capacity_blocks": 31250}
    blocks = parse_config_text(
        _llmd("""
        plugins:
          - type: approx-prefix-cache-producer
            parameters: {maxPrefixTokensToMatch: 0, maxPrefixBlocksToMatch: 100}
          - type: max-score-picker
        schedulingProfiles: [{name: default, plugins: [{pluginRef: max-score-picker}]}]
        """)
    )
    assert blocks.prefix_hashing.max_blocks == 100


def test_precise_producer_maps_block_size_speculation_and_event_streams() -> None:
    config = parse_config_text(
        _llmd("""
        plugins:
          - type: precise-prefix-cache-producer
            parameters:
              tokenProcessorConfig: {blockSize: 16, hashSeed: "42"}
              speculativeIndexing: true
              speculativeTTL: 3s
              indexerConfig: {kvBlockIndexConfig: {enableMetrics: true}}
              kvEventsConfig:
                engineType: vllm
                topicFilter: "kv@"
                concurrency: 8
                discoverPods: true
                podDiscoveryConfig: {socketPort: 5600}
          - type: prefix-cache-scorer
            parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
          - type: max-score-picker
        schedulingProfiles:
          - name: default
            plugins: [{pluginRef: prefix-cache-scorer, weight: 3}, {pluginRef: max-score-picker}]
        """)
    )
    assert _spec(config, "precise-prefix-producer") == (
        "precise-prefix-producer",
        {"speculative_ttl_ms": 3000.0, "block_size": 16},
    )
    assert config.kv_events.endpoint_template == "tcp://{host}:5600"
    assert config.kv_events.topic == "kv@"
    assert _profile(config)[0] == ("precise-prefix-producer", None)
    _build(config)
    off = parse_config_text(
        _llmd("""
        plugins:
          - type: precise-prefix-cache-producer
            parameters: {kvEventsConfig: {discoverPods: true}}
          - type: random-picker
        schedulingProfiles: [{name: default, plugins: [{pluginRef: random-picker}]}]
        """)
    )
    assert _spec(off, "precise-prefix-producer")[1] == {"speculative_ttl_ms": 0.0}
    assert off.kv_events.endpoint_template == "tcp://{host}:5557"


def test_burst_producer_becomes_burst_admission() -> None:
    config = parse_config_text(
        _llmd("""
        plugins:
          - type: burst-prefix-cache-producer
            parameters: {windowDurationMs: 20, maxPerReplica: 8, minColocateBlocks: 2, blockSizeTokens: 64}
          - type: prefix-cache-scorer
            parameters: {prefixMatchInfoProducerName: burst-prefix-cache-producer}
          - type: max-score-picker
        schedulingProfiles:
          - name: default
            plugins: [{pluginRef: prefix-cache-scorer, weight: 2}, {pluginRef: max-score-picker}]
        """)
    )
    admission = config.admission
    assert (
        admission.enabled,
        admission.window_ms,
        admission.max_per_endpoint,
        admission.min_shared_blocks,
    ) == (
        True,
        20.0,
        8,
        2,
    )
    # The scorer needs a persistent index too: llm-d's default, the approximate producer, is added.
    assert _profile(config)[:2] == [("approx-prefix-producer", None), ("health-filter", None)]
    assert any("burst admission" in note for note in parse_config_document(_burst_unlimited()).notes)
    assert parse_config_text(_burst_unlimited()).admission.max_per_endpoint == config.admission.max_batch
    _build(config)


def _burst_unlimited() -> str:
    return _llmd("""
        plugins:
          - type: burst-prefix-cache-producer
            parameters: {minColocateBlocks: 4}
          - type: max-score-picker
        schedulingProfiles: [{name: default, plugins: [{pluginRef: max-score-picker}]}]
        """)


@pytest.mark.parametrize(
    ("llmd_type", "burstsched_type"),
    [
        ("prefix-cache-scorer", "prefix-cache-scorer"),
        ("queue-scorer", "queue-scorer"),
        ("kv-cache-utilization-scorer", "kv-utilization-scorer"),
    ],
)
def test_scorers_map_with_their_weights(llmd_type: str, burstsched_type: str) -> None:
    config = parse_config_text(
        _llmd(f"""
        plugins:
          - type: {llmd_type}
            name: mine
          - type: max-score-picker
        schedulingProfiles:
          - name: default
            plugins: [{{pluginRef: mine, weight: 2.5}}, {{pluginRef: max-score-picker}}]
        """)
    )
    assert _spec(config, "mine") == (burstsched_type, {})
    assert ("mine", 2.5) in _profile(config)
    scheduler = _build(config)
    assert [(s.scorer.name, s.weight) for s in scheduler.profile.scorers] == [("mine", 2.5)]


def test_a_scorer_without_weight_weighs_one() -> None:
    config = parse_config_text(
        _llmd("""
        plugins: [{type: queue-scorer}, {type: max-score-picker}]
        schedulingProfiles: [{name: d, plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]}]
        """)
    )
    assert [s.weight for s in _build(config).profile.scorers] == [1.0]


@pytest.mark.parametrize("picker", ["max-score-picker", "random-picker", "weighted-random-picker"])
def test_pickers_map(picker: str) -> None:
    config = parse_config_text(
        _llmd(f"""
        plugins:
          - type: {picker}
            parameters: {{maxNumOfEndpoints: 1}}
        schedulingProfiles: [{{name: default, plugins: [{{pluginRef: {picker}}}]}}]
        """)
    )
    assert config.profile.picker == picker
    assert _spec(config, picker) == (picker, {})
    assert _build(config).profile.picker.name == picker


def test_no_picker_gets_llmds_default_max_score_picker() -> None:
    loaded = parse_config_document(
        _llmd("""
        plugins: [{type: queue-scorer}]
        schedulingProfiles: [{name: default, plugins: [{pluginRef: queue-scorer, weight: 1}]}]
        """)
    )
    assert loaded.config.profile.picker == "max-score-picker"
    assert any("max-score-picker" in note for note in loaded.notes)
    _build(loaded.config)
    # llm-d refreshes metrics every 50 ms; a translated config keeps that (burstsched's default is 1 s)
    assert loaded.config.pool.scrape_interval_ms == 50.0 != RouterConfig().pool.scrape_interval_ms
    assert any("scrape_interval_ms: 50" in note for note in loaded.notes)


def test_utilization_detector_in_the_profile_filters_stale_and_saturated_endpoints() -> None:
    config = parse_config_text(
        _llmd("""
        plugins:
          - type: utilization-detector
            name: detector
            parameters: {queueDepthThreshold: 5, kvCacheUtilThreshold: 0.8, headroom: 0.2,
                         metricsStalenessThreshold: 500ms}
          - type: queue-scorer
          - type: max-score-picker
        saturationDetector: {pluginRef: detector}
        schedulingProfiles:
          - name: default
            plugins:
              - {pluginRef: detector}
              - {pluginRef: queue-scorer, weight: 1}
              - {pluginRef: max-score-picker}
        """)
    )
    # llm-d keeps an endpoint while waiting < 5 x 1.2 = 6 and KV usage < 0.8 x 1.2 = 0.96.
    kind, parameters = _spec(config, "detector")
    assert kind == "saturation-filter"
    assert parameters["max_waiting"] == 6 and parameters["max_kv_usage"] == pytest.approx(0.96)
    assert _spec(config, "health-filter") == ("health-filter", {"drop_stale": True})
    assert config.pool.staleness_threshold_ms == 500.0
    assert [f.name for f in _build(config).profile.filters] == ["health-filter", "detector"]


def test_utilization_detector_outside_the_profile_sets_only_the_staleness() -> None:
    loaded = parse_config_document(
        _llmd("""
        plugins:
          - type: utilization-detector
            parameters: {metricsStalenessThreshold: 1s}
          - type: max-score-picker
          - type: single-profile-handler
        schedulingProfiles: [{name: default, plugins: [{pluginRef: max-score-picker}]}]
        """)
    )
    assert loaded.config.pool.staleness_threshold_ms == 1000.0
    assert [s.type for s in loaded.config.plugins] == ["health-filter", "max-score-picker"]
    assert _spec(loaded.config, "health-filter")[1] == {}
    assert any("filters no endpoint; its metricsStalenessThreshold applies" in n for n in loaded.notes)
    assert not loaded.config.flow_control.enabled  # no flowControl feature gate


def test_inference_pool_v1alpha2_selector_is_kept() -> None:
    text = _llmd("""
        plugins: [{type: random-picker}]
        schedulingProfiles: [{name: default, plugins: [{pluginRef: random-picker}]}]
        ---
        apiVersion: inference.networking.x-k8s.io/v1alpha2
        kind: InferencePool
        metadata: {name: pool, namespace: team-a}
        spec:
          selector: {app: vllm}
          targetPortNumber: 8080
          extensionRef: {name: epp}
        """)
    selector = parse_config_text(text).pool.selector
    assert selector is not None
    assert (selector.match_labels, selector.target_port, selector.namespace) == (
        {"app": "vllm"},
        8080,
        "team-a",
    )


# --- refusals name the plugin and the parameter ------------------------------------------------------

_PICKER_ONLY = "schedulingProfiles: [{name: default, plugins: [{pluginRef: max-score-picker}]}]\n"


@pytest.mark.parametrize(
    ("plugins", "path", "words"),
    [
        (
            "- {type: approx-prefix-cache-producer, name: ap, parameters: {autoTune: 'no'}}",
            "plugins[0].parameters.autoTune",
            ["approx-prefix-cache-producer 'ap'", "must be true or false"],
        ),
        (
            "- {type: approx-prefix-cache-producer, parameters: {bogus: 1}}",
            "plugins[0].parameters.bogus",
            ["approx-prefix-cache-producer", "unknown or unsupported parameter"],
        ),
        (
            "- {type: approx-prefix-cache-producer, parameters: {blockSizeTokens: '64'}}",
            "plugins[0].parameters.blockSizeTokens",
            ["must be an integer"],
        ),
        (
            "- {type: approx-prefix-cache-producer, parameters: {maxPrefixTokensToMatch: 0,"
            " maxPrefixBlocksToMatch: 0}}",
            "plugins[0].parameters.maxPrefixBlocksToMatch",
            ["prefix matching off"],
        ),
        (
            "- {type: prefix-cache-scorer, parameters: {prefixLengthWeight: 0.5}}",
            "plugins[0].parameters.prefixLengthWeight",
            ["prefix-cache-scorer", "not supported"],
        ),
        (
            "- {type: prefix-cache-scorer, parameters: {hashBlockSize: 64}}",
            "plugins[0].parameters.hashBlockSize",
            ["approx-prefix-cache-producer"],
        ),
        (
            "- {type: prefix-cache-scorer, parameters: {prefixMatchInfoProducerName: nobody}}",
            "plugins[0].parameters.prefixMatchInfoProducerName",
            ["'nobody'"],
        ),
        (
            "- {type: queue-scorer, name: q, parameters: {threshold: 3}}",
            "plugins[0].parameters.threshold",
            ["queue-scorer 'q'"],
        ),
        (
            "- {type: random-picker, parameters: {maxNumOfEndpoints: 3}}",
            "plugins[0].parameters.maxNumOfEndpoints",
            ["random-picker", "dispatch.max_attempts"],
        ),
        (
            "- {type: precise-prefix-cache-producer, parameters: {kvEventsConfig:"
            " {zmqEndpoint: '0.0.0.0:5557'}}}",
            "plugins[0].parameters.kvEventsConfig.zmqEndpoint",
            ["precise-prefix-cache-producer", "must be a ZMQ address"],
        ),
        (
            "- {type: precise-prefix-cache-producer, parameters: {kvEventsConfig:"
            " {discoverPods: true, engineType: sglang}}}",
            "plugins[0].parameters.kvEventsConfig.engineType",
            ["vllm"],
        ),
        (
            "- {type: precise-prefix-cache-producer, parameters: {kvEventsConfig: {discoverPods: true},"
            " speculativeTTL: soon}}",
            "plugins[0].parameters.speculativeTTL",
            ["duration"],
        ),
        (
            "- {type: utilization-detector, parameters: {stalenessPolicy: ignore}}",
            "plugins[0].parameters.stalenessPolicy",
            ["utilization-detector"],
        ),
        (
            "- {type: lora-affinity-filter}",
            "plugins[0].type",
            ["lora-affinity-filter", "not supported"],
        ),
    ],
)
def test_refusals_name_the_plugin_and_the_parameter(plugins: str, path: str, words: list[str]) -> None:
    text = _llmd(f"plugins:\n  {plugins}\n  - {{type: max-score-picker}}\n{_PICKER_ONLY}")
    issues = _issues(text)
    assert path in issues, issues
    for word in words:
        assert word in issues[path]


@pytest.mark.parametrize(
    ("extra", "path"),
    [
        ("featureGates: [flowControl]\nflowControl: {enableEviction: true}\n", "flowControl.enableEviction"),
        ("dataLayer: {discovery: {}}\n", "dataLayer.discovery"),
        ("featureGates: [someGate]\n", "featureGates[0]"),
        ("metadata: {name: x}\n", "metadata"),
    ],
)
def test_features_burstsched_lacks_are_refused(extra: str, path: str) -> None:
    text = _llmd(f"plugins: [{{type: max-score-picker}}]\n{_PICKER_ONLY}{extra}")
    assert path in _issues(text)


def test_harmless_and_disabled_feature_gates_pass() -> None:
    text = _llmd(
        "featureGates: [prepareDataPlugins, flowControl=false]\nplugins: [{type: max-score-picker}]\n"
    )
    parse_config_text(text + _PICKER_ONLY)


def test_profile_shape_refusals() -> None:
    issues = _issues(
        _llmd("""
        plugins:
          - {type: approx-prefix-cache-producer, name: a, parameters: {blockSizeTokens: 16}}
          - {type: precise-prefix-cache-producer, name: p, parameters: {kvEventsConfig: {discoverPods: true}}}
          - {type: queue-scorer}
          - {type: max-score-picker}
          - {type: random-picker}
        schedulingProfiles:
          - name: decode
            plugins:
              - {pluginRef: queue-scorer, weight: -1}
              - {pluginRef: a, weight: 2}
              - {pluginRef: max-score-picker}
              - {pluginRef: random-picker}
              - {pluginRef: missing}
          - name: prefill
            plugins: [{pluginRef: max-score-picker}]
        """)
    )
    assert "not supported" in issues["plugins[1].type"]  # a second prefix-cache producer
    assert "disagg-profile-handler" in issues["schedulingProfiles"]
    assert "at least 0" in issues["schedulingProfiles[0].plugins[0].weight"]
    assert "not a scorer" in issues["schedulingProfiles[0].plugins[1].weight"]
    assert "one picker" in issues["schedulingProfiles[0].plugins[3].pluginRef"]
    assert "'missing'" in issues["schedulingProfiles[0].plugins[4].pluginRef"]


def test_producers_must_agree_on_the_block_size() -> None:
    issues = _issues(
        _llmd("""
        plugins:
          - {type: approx-prefix-cache-producer, parameters: {blockSizeTokens: 32}}
          - {type: burst-prefix-cache-producer, parameters: {blockSizeTokens: 64, minColocateBlocks: 2}}
          - {type: max-score-picker}
        """)
        + _PICKER_ONLY
    )
    assert "must agree" in issues["plugins[1].parameters.blockSizeTokens"]


def test_unknown_api_version_and_kind_are_refused() -> None:
    assert "apiVersion" in _issues(
        "apiVersion: example.com/v9\nkind: EndpointPickerConfig\nplugins: [{type: max-score-picker}]\n"
        + _PICKER_ONLY
    )
    assert "kind" in _issues("apiVersion: v1\nkind: ConfigMap\ndata: {}\n")


def test_inference_pool_match_expressions_are_refused() -> None:
    text = _llmd(f"plugins: [{{type: max-score-picker}}]\n{_PICKER_ONLY}") + textwrap.dedent("""
        ---
        apiVersion: inference.networking.k8s.io/v1
        kind: InferencePool
        spec:
          selector: {matchLabels: {app: a}, matchExpressions: [{key: tier, operator: In, values: [x]}]}
          targetPorts: [{number: 8000}]
        """)
    assert "InferencePool.spec.selector.matchExpressions" in _issues(text)


@pytest.mark.parametrize(
    ("text", "ms"),
    [("200ms", 200.0), ("2s", 2000.0), ("1m30s", 90_000.0), ("1.5s", 1500.0), ("250us", 0.25), ("0", 0.0)],
)
def test_go_durations(text: str, ms: float) -> None:
    assert parse_duration_ms(text) == pytest.approx(ms)


@pytest.mark.parametrize("text", ["", "2", "s", "2 s", "-1s", "2sec", "1h-5m"])
def test_not_go_durations(text: str) -> None:
    assert parse_duration_ms(text) is None


# --- both formats through the same loader ------------------------------------------------------------


def test_load_config_reads_both_formats(tmp_path: Path) -> None:
    llmd, native = tmp_path / "llmd.yaml", tmp_path / "native.yaml"
    llmd.write_text(
        _llmd(f"plugins: [{{type: random-picker}}]\n{_PICKER_ONLY.replace('max-score', 'random')}")
    )
    native.write_text("plugins: [{type: random-picker}]\nprofile: {plugins: [], picker: random-picker}\n")
    endpoints = [EndpointConfig(name="a", url="http://127.0.0.1:8001")]
    for path in (llmd, native):
        config = load_config(path, endpoints=endpoints)
        assert config.profile.picker == "random-picker"
        assert [e.endpoint_name for e in config.endpoints] == ["a"]
    assert read_config(native).origin == "burstsched format"
    assert read_config(llmd).origin.startswith("llm-d EndpointPickerConfig")


def test_decode_config_takes_an_llmd_mapping_too() -> None:
    data = {
        "apiVersion": "llm-d.ai/v1",
        "kind": "EndpointPickerConfig",
        "plugins": [{"type": "queue-scorer"}, {"type": "max-score-picker"}],
        "schedulingProfiles": [{"name": "d", "plugins": [{"pluginRef": "queue-scorer", "weight": 2}]}],
    }
    assert ("queue-scorer", 2.0) in _profile(decode_config(data))


def test_several_documents_are_only_llmd() -> None:
    issues = _issues("pool: {}\n---\nlimits: {}\n")
    assert "one YAML document" in issues[""]


def test_every_issue_of_a_file_is_reported_at_once() -> None:
    issues = _issues(
        _llmd("""
        plugins:
          - {type: approx-prefix-cache-producer, parameters: {autoTune: 'no', blockSize: 256}}
          - {type: no-such-thing}
          - {type: max-score-picker}
        flowControl: {maxRequests: lots}
        """)
        + _PICKER_ONLY
    )
    assert {
        "plugins[0].parameters.autoTune",
        "plugins[0].parameters.blockSize",
        "plugins[1].type",
        "flowControl.maxRequests",
    } <= set(issues)


# --- end to end: the llm-d file routes real requests -------------------------------------------------


@pytest.mark.anyio
async def test_llmd_config_routes_seed_pairs_like_prefix_aware() -> None:
    """A router from the llm-d file on simulated replicas: each follow-up returns to its context's replica."""
    config = load_config(REPO / "config" / "llmd-prefix-aware.yaml")
    async with SimPool(2, SimConfig(time_scale=0.02)) as pool:
        endpoints = [EndpointConfig(name=n, url=u) for n, u in zip(pool.names, pool.urls, strict=True)]
        fast = PoolConfig(scrape_interval_ms=20, staleness_threshold_ms=2000, health_check_interval_ms=100)
        config = config.model_copy(update={"endpoints": endpoints, "pool": fast})
        async with (
            running_router(config, rng=random.Random(3)) as router,
            httpx.AsyncClient(base_url=router.url, timeout=30) as client,
        ):
            firsts: list[str] = []
            for i in range(4):
                context = f"Context {uuid.UUID(int=i)}. " + " ".join(f"fact {i}-{j}." for j in range(1500))
                bodies = [context + "\nQuestion: Summarize.", context + "\nQuestion: What next?"]
                answers = [
                    await client.post(
                        "/v1/chat/completions",
                        json={
                            "model": "kv-demo",
                            "messages": [{"role": "user", "content": b}],
                            "max_tokens": 2,
                        },
                    )
                    for b in bodies
                ]
                assert [a.status_code for a in answers] == [200, 200]
                first, follow = (a.headers["x-burstsched-endpoint"] for a in answers)
                assert follow == first
                firsts.append(first)
    assert set(Counter(firsts)) == set(pool.names)  # distinct cold contexts spread over both replicas
