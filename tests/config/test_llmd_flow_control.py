"""llm-d's flow control (``featureGates: [flowControl]``, ``flowControl``) → burstsched's ``flow_control``."""

from __future__ import annotations

import io
import random
import textwrap
from pathlib import Path

import httpx
import pytest

from burstsched.config import (
    ConfigError,
    EndpointConfig,
    LoadedConfig,
    PoolConfig,
    RouterConfig,
    parse_config_document,
)
from burstsched.config.llmd_params import parse_quantity
from burstsched.server.check import check_files
from burstsched.server.serve import running_router
from burstsched.sim import SimConfig, SimPool

CORPUS = Path(__file__).resolve().parent / "llmd_corpus"
HEAD = "apiVersion: llm-d.ai/v1\nkind: EndpointPickerConfig\n"
SCORING = """\
plugins:
- type: queue-scorer
- type: max-score-picker
{extra}
schedulingProfiles:
- name: default
  plugins: [{{pluginRef: queue-scorer}}, {{pluginRef: max-score-picker}}]
"""


def _load(extra_plugins: str = "", section: str = "", gate: bool = True) -> LoadedConfig:
    text = HEAD + ("featureGates: [flowControl]\n" if gate else "")
    text += SCORING.format(extra=textwrap.dedent(extra_plugins).strip())
    return parse_config_document(text + textwrap.dedent(section))


def _refused(extra_plugins: str = "", section: str = "", gate: bool = True) -> list[str]:
    with pytest.raises(ConfigError) as excinfo:
        _load(extra_plugins, section, gate)
    return [str(issue) for issue in excinfo.value.issues]


def test_each_flow_control_knob_becomes_its_burstsched_value() -> None:
    loaded = _load(
        """
        - type: round-robin-fairness-policy
        - type: concurrency-detector
          parameters: {maxConcurrency: 132, concurrencyMode: requests, headroom: 0.2}
        """,
        """
        flowControl:
          maxBytes: 10Gi
          maxRequests: 1k
          defaultRequestTTL: 45s
          noEndpointRequestTTL: 2m
          saturationDetector: {pluginRef: concurrency-detector}
          priorityBands:
          - {priority: 100, maxRequests: "500", fairnessPolicyRef: round-robin-fairness-policy}
          - {priority: 0, maxBytes: 1M, fairnessPolicyRef: round-robin-fairness-policy}
        """,
    )
    flow = loaded.config.flow_control
    assert flow.enabled
    assert (flow.max_requests, flow.max_bytes) == (1000, 10 * 1024**3)
    assert (flow.ttl_ms, flow.no_endpoint_wait_ms) == (45_000.0, 120_000.0)
    # a listed band takes llm-d's per-band defaults (5000 requests, 1 GB) for what it leaves out
    assert {p: (b.max_requests, b.max_bytes) for p, b in flow.bands.items()} == {
        100: (500, 1_000_000_000),
        0: (5000, 1_000_000),
    }
    assert flow.fairness == "round-robin"
    # concurrency-detector: full at maxConcurrency in flight (its headroom is for the filter only)
    assert flow.headroom.max_in_flight == 132
    assert flow.headroom.max_waiting is None


def test_llm_d_defaults_strict_fairness_the_utilization_detector_and_60s_ttls() -> None:
    flow = _load().config.flow_control
    assert flow.enabled and flow.fairness == "strict"  # global-strict-fairness-policy, llm-d's default
    assert (flow.ttl_ms, flow.no_endpoint_wait_ms) == (60_000.0, 60_000.0)
    # llm-d's default utilization-detector (queue 5, KV 0.8): full at 5 waiting or KV 0.8
    assert (flow.headroom.max_waiting, flow.headroom.max_kv_usage) == (4, 0.8)
    assert flow.headroom.max_in_flight is None
    assert flow.bands == {}
    # what llm-d leaves unbounded keeps burstsched's bounds
    assert (flow.max_requests, flow.max_bytes) == (RouterConfig().flow_control.max_requests, 1024**3)
    # noEndpointRequestTTL follows defaultRequestTTL when only that is set
    assert (
        _load(section="flowControl: {defaultRequestTTL: 5s}\n").config.flow_control.no_endpoint_wait_ms
        == 5000
    )


def test_the_utilization_detector_gates_at_its_thresholds_and_filters_with_headroom() -> None:
    """One definition, llm-d's two tiers: the filter at threshold x (1 + headroom), the gate at threshold."""
    loaded = parse_config_document(
        HEAD
        + textwrap.dedent("""
        featureGates: [flowControl]
        plugins:
        - type: utilization-detector
          name: detector
          parameters: {queueDepthThreshold: 5, kvCacheUtilThreshold: 0.8, headroom: 0.2}
        - type: queue-scorer
        - type: max-score-picker
        schedulingProfiles:
        - name: default
          plugins: [{pluginRef: detector}, {pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
        flowControl: {saturationDetector: {pluginRef: detector}}
        """)
    )
    config = loaded.config
    saturation = next(s for s in config.plugins if s.instance_name == "detector")
    assert saturation.type == "saturation-filter"
    assert saturation.parameters["max_waiting"] == 6  # dropped at 6 waiting = 5 x 1.2
    assert saturation.parameters["max_kv_usage"] == pytest.approx(0.96)
    # held at 5 waiting (room while at most 4) or KV 0.8: the detector's thresholds without headroom
    assert config.flow_control.headroom.max_waiting == 4
    assert config.flow_control.headroom.max_kv_usage == pytest.approx(0.8)


def test_a_static_usage_limit_scales_the_detector_thresholds() -> None:
    loaded = _load(
        """
        - type: concurrency-detector
          parameters: {maxConcurrency: 100}
        - type: static-usage-limit-policy
          name: limit
          parameters: {threshold: 0.5}
        """,
        """
        flowControl:
          saturationDetector: {pluginRef: concurrency-detector}
          usageLimitPolicyPluginRef: limit
        """,
    )
    assert loaded.config.flow_control.headroom.max_in_flight == 50


def test_the_deprecated_top_level_saturation_detector_is_used_when_the_section_names_none() -> None:
    loaded = _load(
        "- {type: concurrency-detector, name: cd, parameters: {maxConcurrency: 7}}",
        "saturationDetector: {pluginRef: cd}\n",
    )
    assert loaded.config.flow_control.headroom.max_in_flight == 7


def test_edf_ordering_loads_as_arrival_order_and_explain_says_why() -> None:
    loaded = _load(
        "- type: edf-ordering-policy",
        "flowControl: {priorityBands: [{priority: 0, orderingPolicyRef: edf-ordering-policy}]}\n",
    )
    assert loaded.config.flow_control.enabled
    edf = next(line for line in loaded.explain if line.startswith("edf-ordering-policy"))
    assert "keep arrival order" in edf
    assert any("warm prefix groups go first" in line for line in loaded.explain)


def test_without_the_feature_gate_the_section_is_read_and_noted_but_flow_control_stays_off() -> None:
    loaded = _load(section="flowControl: {maxRequests: 100}\n", gate=False)
    assert not loaded.config.flow_control.enabled
    assert any("feature gate is off" in note for note in loaded.notes)
    # a gate set to false is off too; an explicit true is on
    for gates, on in (("[flowControl=false]", False), ("[flowControl=true]", True)):
        text = HEAD + f"featureGates: {gates}\n" + SCORING.format(extra="")
        assert parse_config_document(text).config.flow_control.enabled is on


def test_a_sheddable_band_loads_with_a_note_on_how_burstsched_sheds() -> None:
    loaded = _load(section="flowControl: {priorityBands: [{priority: -10, maxRequests: 50}]}\n")
    assert loaded.config.flow_control.bands[-10].max_requests == 50
    assert any("priority -10 is sheddable" in note and "429 at once" in note for note in loaded.notes)


@pytest.mark.parametrize(
    ("plugins", "section", "path", "words"),
    [
        (
            "- {type: program-aware-fairness, parameters: {strategy: wfq}}",
            "flowControl: {defaultPriorityBand: {fairnessPolicyRef: program-aware-fairness}}",
            "plugins[2].parameters.strategy",
            ["las"],
        ),
        (
            "- type: slo-deadline-ordering-policy",
            "flowControl: {priorityBands: [{priority: 1, orderingPolicyRef: slo-deadline-ordering-policy}]}",
            "flowControl.priorityBands[0].orderingPolicyRef",
            ["x-llm-d-slo-ttft-ms", "not built"],
        ),
        (
            "- type: priority-holdback-policy",
            "flowControl: {usageLimitPolicyPluginRef: priority-holdback-policy}",
            "plugins[2].parameters.minCeiling",
            ["required"],
        ),
        (
            "- {type: priority-holdback-policy, parameters: {minCeiling: 0.8, maxCeiling: 0.6}}",
            "flowControl: {usageLimitPolicyPluginRef: priority-holdback-policy}",
            "plugins[2].parameters.minCeiling",
            ["below maxCeiling"],
        ),
        (
            "- {type: soft-reflective-ceiling-policy, parameters: {threshold: 0.5}}",
            "flowControl: {usageLimitPolicyPluginRef: soft-reflective-ceiling-policy}",
            "plugins[2].parameters.threshold",
            ["unknown"],
        ),
        ("", "flowControl: {enableEviction: true}", "flowControl.enableEviction", ["in-flight eviction"]),
        ("", "flowControl: {defaultRequestTTL: 0s}", "flowControl.defaultRequestTTL", ["no limit"]),
        ("", "flowControl: {noEndpointRequestTTL: 0s}", "flowControl.noEndpointRequestTTL", ["no limit"]),
        (
            "",
            "flowControl: {defaultPriorityBand: {maxRequests: 10}}",
            "flowControl.defaultPriorityBand",
            ["bands not listed"],
        ),
        (
            "- type: round-robin-fairness-policy",
            "flowControl:\n  priorityBands:\n"
            "  - {priority: 1, fairnessPolicyRef: round-robin-fairness-policy}\n  - {priority: 0}",
            "flowControl",
            ["different fairness policies", "one fairness policy for every band"],
        ),
        (
            "- {type: concurrency-detector, parameters: {concurrencyMode: tokens}}",
            "flowControl: {saturationDetector: {pluginRef: concurrency-detector}}",
            "plugins[2].parameters.concurrencyMode",
            ["not supported", "tokens"],
        ),
        (
            "",
            "flowControl: {saturationDetector: {pluginRef: nowhere}}",
            "flowControl.saturationDetector.pluginRef",
            ["unknown saturation detector 'nowhere'"],
        ),
        (
            "- type: fcfs-ordering-policy",
            "flowControl: {saturationDetector: {pluginRef: fcfs-ordering-policy}}",
            "flowControl.saturationDetector.pluginRef",
            ["is not a saturation detector"],
        ),
        ("", "flowControl: {maxRequests: lots}", "flowControl.maxRequests", ["quantity"]),
        ("", "flowControl: {priorityBands: [{maxRequests: 5}]}", "flowControl.priorityBands[0].priority", []),
        ("", "flowControl: {queueing: on}", "flowControl.queueing", ["unknown"]),
        (
            "- {type: probabilistic-admitter, parameters: {power: 0}}",
            "",
            "plugins[2].parameters.power",
            ["must be"],
        ),
        (
            "- {type: probabilistic-admitter, name: a}\n- {type: probabilistic-admitter, name: b}",
            "",
            "plugins",
            ["more than one probabilistic admitter"],
        ),
    ],
)
def test_what_burstsched_cannot_honour_is_refused_in_one_line(
    plugins: str, section: str, path: str, words: list[str]
) -> None:
    lines = _refused(plugins, section + "\n")
    assert len(lines) == 1, lines
    assert lines[0].startswith(path + ": "), lines
    for word in words:
        assert word in lines[0], lines


def test_a_concurrency_detector_in_a_scheduling_profile_is_refused_once() -> None:
    text = HEAD + textwrap.dedent("""
        plugins:
        - type: concurrency-detector
        - type: max-score-picker
        schedulingProfiles:
        - name: default
          plugins: [{pluginRef: concurrency-detector}, {pluginRef: max-score-picker}]
        """)
    with pytest.raises(ConfigError) as excinfo:
        parse_config_document(text)
    lines = [str(issue) for issue in excinfo.value.issues]
    assert len(lines) == 1 and "not supported as a scheduling filter" in lines[0]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500", 500),
        (500, 500),
        ("1k", 1000),
        ("10Gi", 10 * 1024**3),
        ("1M", 10**6),
        ("1e3", 1000),
        ("1.5k", 1500),
    ],
)
def test_kubernetes_quantities(text: object, value: int) -> None:
    assert parse_quantity(text) == value


def test_not_quantities() -> None:
    assert [parse_quantity(v) for v in ("lots", "1 k", True, None, "")] == [None] * 5


def test_check_explains_the_flow_control_guide_and_shows_its_queue() -> None:
    out, err = io.StringIO(), io.StringIO()
    status = check_files([CORPUS / "guide-flow-control.yaml"], out=out, err=err, explain=True)
    text = out.getvalue()
    assert status == 0, err.getvalue()
    assert "  queue:     on: an endpoint has room with" in text and "under 132 in flight" in text
    assert "fairness round-robin" in text and "bands -10: 50 requests" in text
    assert "concurrency-detector 'concurrency-detector': flow control's gate" in text
    assert "flowControl (featureGates: [flowControl]): flow_control.enabled" in text


@pytest.mark.anyio
async def test_the_flow_control_guide_runs_a_router_whose_queue_is_on() -> None:
    loaded = parse_config_document((CORPUS / "guide-flow-control.yaml").read_text(encoding="utf-8"))
    async with SimPool(1, SimConfig(time_scale=0.02)) as pool:
        endpoints = [EndpointConfig(name=n, url=u) for n, u in zip(pool.names, pool.urls, strict=True)]
        fast = PoolConfig(scrape_interval_ms=20, staleness_threshold_ms=2000, health_check_interval_ms=100)
        config = loaded.config.model_copy(update={"endpoints": endpoints, "pool": fast})
        async with (
            running_router(config, rng=random.Random(0)) as router,
            httpx.AsyncClient(base_url=router.url, timeout=30) as client,
        ):
            queue = (await client.get("/admin/queue")).json()
            assert queue["enabled"] is True and queue["requests"] == 0
            answer = await client.post(
                "/v1/chat/completions",
                json={"model": "kv-demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            )
            assert answer.status_code == 200


def test_program_aware_fairness_becomes_least_attained_service_with_its_parameters() -> None:
    loaded = _load(
        """
        - type: program-aware-fairness
          parameters: {strategy: las, lasWeightService: 0.6, lasWeightHeadWait: 0.4, lasHalfLifeSeconds: 30,
                       evictionTtlSeconds: 600, evictionSweepSeconds: 60}
        """,
        "flowControl: {defaultPriorityBand: {fairnessPolicyRef: program-aware-fairness}}\n",
    )
    flow = loaded.config.flow_control
    assert flow.fairness == "program-aware"
    aware = flow.program_aware
    assert (aware.weight_service, aware.weight_head_wait, aware.half_life_s, aware.forget_after_s) == (
        0.6,
        0.4,
        30.0,
        600.0,
    )
    line = next(x for x in loaded.explain if x.startswith("program-aware-fairness"))
    assert "least attained service" in line and "half-life 30 s" in line
    # llm-d's defaults when the plugin has no parameters
    plain = _load(
        "- type: program-aware-fairness",
        "flowControl: {defaultPriorityBand: {fairnessPolicyRef: program-aware-fairness}}\n",
    ).config.flow_control.program_aware
    assert (plain.weight_service, plain.weight_head_wait, plain.half_life_s, plain.forget_after_s) == (
        0.8,
        0.2,
        60.0,
        3600.0,
    )


def test_usage_limit_policies_become_per_priority_ceilings() -> None:
    holdback = _load(
        """
        - type: priority-holdback-policy
          name: hold
          parameters: {shape: linear, domain: value, minCeiling: 0.4, maxCeiling: 0.9}
        """,
        "flowControl: {usageLimitPolicyPluginRef: hold}\n",
    )
    ceilings = holdback.config.flow_control.ceilings
    assert ceilings is not None
    assert (ceilings.policy, ceilings.min_ceiling, ceilings.max_ceiling, ceilings.domain) == (
        "priority-holdback",
        0.4,
        0.9,
        "value",
    )
    assert any(
        "flowControl usage limit 'hold': flow_control.ceilings priority-holdback" in x
        for x in holdback.explain
    )
    soft = _load(
        "- type: soft-reflective-ceiling-policy",
        "flowControl: {usageLimitPolicyPluginRef: soft-reflective-ceiling-policy}\n",
    ).config.flow_control
    assert soft.ceilings is not None and soft.ceilings.policy == "soft-reflective"
    # the default (static) usage limit sets no ceilings
    assert _load().config.flow_control.ceilings is None


def test_the_probabilistic_admitter_loads_with_or_without_the_flow_control_gate() -> None:
    """llm-d runs admitters at the admission point whether or not its flowControl gate is on."""
    plugin = """
        - type: probabilistic-admitter
          parameters: {queueDepthThreshold: 8, kvCacheUtilThreshold: 0.9, power: 3, k: 100}
        """
    for gate in (False, True):
        flow = _load(plugin, gate=gate).config.flow_control
        assert flow.enabled is gate
        assert flow.admitter is not None
        admitter = flow.admitter
        assert (admitter.queue_depth_threshold, admitter.kv_usage_threshold, admitter.power, admitter.k) == (
            8,
            0.9,
            3.0,
            100.0,
        )
    defaults = _load("- type: probabilistic-admitter", gate=False).config.flow_control.admitter
    assert defaults is not None and (defaults.queue_depth_threshold, defaults.power, defaults.k) == (
        5,
        5.0,
        300.0,
    )
    assert _load().config.flow_control.admitter is None


def test_check_says_what_the_admitter_example_does() -> None:
    out, err = io.StringIO(), io.StringIO()
    path = CORPUS / "router-deploy-probabilistic-admitter-epp-config.yaml"
    status = check_files([path], out=out, err=err, explain=True)
    text = out.getvalue()
    assert status == 0, err.getvalue()
    assert "queue:     off" in text and "refused with probability min(saturation^5 x 300, 1)" in text
    assert "probabilistic-admitter 'probabilistic-admitter': flow_control.admitter" in text
