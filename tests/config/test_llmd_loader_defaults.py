"""llm-d's loader defaults and llm-d's scorers, each checked against llm-d's documented behaviour."""

from __future__ import annotations

import io
import random
import textwrap
from pathlib import Path

from burstsched_plugins.active_request_scorer import ActiveRequestParameters, ActiveRequestScorer
from burstsched_plugins.load_aware_scorer import LoadAwareParameters, LoadAwareScorer
from burstsched_plugins.no_hit_lru import NoHitLruParameters, NoHitLruScorer

from burstsched.config import parse_config_document
from burstsched.framework import CycleState, EndpointSnapshot, PluginContext, PrefixMatch, SchedRequest
from burstsched.framework.types import ApiKind
from burstsched.server.check import check_files

CORPUS = Path(__file__).resolve().parent / "llmd_corpus"
HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
CONTEXT = PluginContext(rng=random.Random(0))


def _request(request_id: str = "r") -> SchedRequest:
    return SchedRequest(request_id=request_id, model="m", api=ApiKind.CHAT)


def _endpoints(*names: str, **fields: dict[str, int]) -> list[EndpointSnapshot]:
    return [EndpointSnapshot(name=n, url=f"http://{n}", **fields.get(n, {})) for n in names]  # type: ignore[arg-type]


def test_discover_pods_defaults_to_true_as_in_llmd() -> None:
    text = HEAD + "plugins:\n- {type: precise-prefix-cache-producer}\n- {type: prefix-cache-scorer}\n"
    config = parse_config_document(text).config
    assert config.kv_events.endpoint_template == "tcp://{host}:5557"


def test_missing_scheduling_profiles_gets_llmds_default_profile() -> None:
    text = (
        HEAD
        + "plugins:\n- {type: queue-scorer}\n- {type: kv-cache-utilization-scorer}\n- {type: random-picker}\n"
    )
    loaded = parse_config_document(text)
    refs = [(r.plugin_ref, r.weight) for r in loaded.config.profile.plugins]
    assert refs == [("health-filter", None), ("queue-scorer", None), ("kv-utilization-scorer", None)]
    assert loaded.config.profile.picker == "random-picker"
    assert any("schedulingProfiles: missing" in note for note in loaded.notes)


def test_llmds_burst_example_loads_as_burst_admission() -> None:
    loaded = parse_config_document((CORPUS / "router-deploy-epp-burst-prefix-cache-config.yaml").read_text())
    admission = loaded.config.admission
    assert admission.enabled and admission.window_ms == 100.0 and admission.min_shared_blocks == 1
    assert loaded.config.tokenizer.source == "remote"


def test_disagg_routes_by_the_decode_profile() -> None:
    loaded = parse_config_document((CORPUS / "guide-pd-disaggregation-scheduler.yaml").read_text())
    refs = [(r.plugin_ref, r.weight) for r in loaded.config.profile.plugins]
    assert ("active-request-scorer", 2.0) in refs and ("prefix-cache-scorer", 2.0) in refs
    assert not any(r[0] in ("queue-scorer", "kv-utilization-scorer") for r in refs)  # prefill's only


def test_a_prefill_stage_without_its_role_filter_is_refused_as_disaggregated_serving(tmp_path: Path) -> None:
    text = HEAD + textwrap.dedent("""\
        plugins:
        - {type: always-disagg-pd-decider}
        - {type: disagg-profile-handler, parameters: {deciders: {prefill: always-disagg-pd-decider}}}
        - {type: queue-scorer}
        schedulingProfiles:
        - {name: prefill, plugins: [{pluginRef: queue-scorer}]}
        - {name: decode, plugins: [{pluginRef: queue-scorer}]}
        """)
    out, err = io.StringIO(), io.StringIO()
    path = tmp_path / "disagg.yaml"
    path.write_text(text)
    assert check_files([path], out=out, err=err) == 1
    lines = err.getvalue().splitlines()[1:]
    assert len(lines) == 1 and "disaggregated serving" in lines[0]


def test_check_explain_names_what_each_llmd_plugin_became() -> None:
    out, err = io.StringIO(), io.StringIO()
    path = CORPUS / "router-deploy-epp-precise-prefix-cache-config.yaml"
    assert check_files([path], out=out, err=err, explain=True) == 0
    text = out.getvalue()
    assert "precise-prefix-cache-producer 'precise-prefix-cache-producer': precise-prefix-producer" in text
    assert "metrics-data-source 'metrics-data-source': nothing: burstsched scrapes" in text


def test_active_request_scorer_follows_llmds_formula() -> None:
    scorer = ActiveRequestScorer("a", ActiveRequestParameters(idle_threshold=1, max_busy_score=0.5), CONTEXT)
    endpoints = _endpoints(
        "idle", "mid", "busy", idle={"in_flight": 1}, mid={"in_flight": 2}, busy={"in_flight": 4}
    )
    assert scorer.score(_request(), endpoints, CycleState()) == {"idle": 1.0, "mid": 0.25, "busy": 0.0}


def test_load_aware_scorer_follows_llmds_piecewise_line() -> None:
    scorer = LoadAwareScorer("l", LoadAwareParameters(threshold=10), CONTEXT)
    endpoints = _endpoints("a", "b", "c", b={"waiting": 5}, c={"waiting": 12})
    assert scorer.score(_request(), endpoints, CycleState()) == {"a": 0.5, "b": 0.25, "c": 0.0}


def test_no_hit_lru_spreads_cold_requests_and_leaves_warm_ones_neutral() -> None:
    scorer = NoHitLruScorer("n", NoHitLruParameters(), CONTEXT)
    endpoints = _endpoints("a", "b", "c")
    first = scorer.score(_request("1"), endpoints, CycleState())
    assert first == {"a": 1.0, "b": 0.5, "c": 0.0}  # never used: in candidate order
    scorer.on_dispatch(_request("1"), endpoints[0])
    second = scorer.score(_request("2"), endpoints, CycleState())
    assert second == {"b": 1.0, "c": 0.5, "a": 0.0}  # a took the last cold request
    scorer.on_dispatch(_request("2"), endpoints[1])
    assert scorer.score(_request("3"), endpoints, CycleState()) == {"c": 1.0, "a": 0.5, "b": 0.0}
    warm = CycleState()
    warm.put("b", PrefixMatch(matched_blocks=2, total_blocks=4, block_tokens=64))
    assert scorer.score(_request("4"), endpoints, warm) == {"a": 0.5, "b": 0.5, "c": 0.5}
    scorer.on_dispatch(_request("4"), endpoints[2])  # warm: the LRU does not move
    assert scorer.score(_request("5"), endpoints, CycleState()) == {"c": 1.0, "a": 0.5, "b": 0.0}
