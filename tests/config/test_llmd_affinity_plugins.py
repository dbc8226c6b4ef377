"""The llm-d plugins behind the guides' configs, each against llm-d's documented behaviour.

token-load-scorer (``1 − min(1, tokens / queueThresholdTokens)`` over in-flight plus this request's uncached
tokens), prefix-cache-affinity-filter (sticky at ``matched/total ≥ affinityThreshold``, kept all when none is,
the TTFT gate ``tokens / peakPrefillThroughput`` and the earlier in-flight tokens gate), session affinity (the
base64 endpoint token echoed and sent back; session ids bound on dispatch, kept when the picker merely chose
another, moved when the bound endpoint was gone, dropped after the TTL), and what their llm-d files become.
"""

from __future__ import annotations

import base64
import random
import textwrap

import pytest
from burstsched_plugins.prefix_affinity_filter import PrefixAffinityFilter, PrefixAffinityParameters
from burstsched_plugins.session_affinity import (
    SessionAffinityFilter,
    SessionAffinityParameters,
    SessionAffinityScorer,
)
from burstsched_plugins.token_load_scorer import TokenLoadParameters, TokenLoadScorer
from starlette.types import Message

from burstsched.config import parse_config_document
from burstsched.framework import CycleState, EndpointSnapshot, PluginContext, PrefixMatch, SchedRequest
from burstsched.framework.types import ApiKind
from burstsched.front.plugin_headers import echo_endpoint, plugin_request_headers
from burstsched.server.check import check_files


def _request(
    request_id: str = "r", prompt_tokens: int = 0, headers: tuple[tuple[str, str], ...] = ()
) -> SchedRequest:
    return SchedRequest(
        request_id=request_id,
        model="m",
        api=ApiKind.COMPLETIONS,
        prompt_tokens=prompt_tokens,
        block_tokens=64,
        headers=headers,
    )


def _endpoints(**queued: int) -> list[EndpointSnapshot]:
    return [EndpointSnapshot(name=n, url=f"http://{n}", queued_prefill_tokens=q) for n, q in queued.items()]


def _matches(**matched: int) -> CycleState:
    state = CycleState()
    for name, blocks in matched.items():
        state.put(name, PrefixMatch(blocks, 10, 64))
    return state


# --- token-load-scorer ----------------------------------------------------------------------------------


def test_token_load_scores_in_flight_plus_this_requests_uncached_tokens_against_the_threshold() -> None:
    scorer = TokenLoadScorer("t", TokenLoadParameters(queue_threshold_tokens=1000), PluginContext())
    endpoints = _endpoints(idle=0, half=500, over=5000)
    # 640 prompt tokens (10 blocks of 64); "idle" holds 5 blocks: 320 uncached there, 640 elsewhere
    scores = scorer.score(_request(prompt_tokens=640), endpoints, _matches(idle=5, half=0, over=0))
    assert scores == {"idle": pytest.approx(1 - 320 / 1000), "half": pytest.approx(0.0), "over": 0.0}
    empty = scorer.score(_request(prompt_tokens=0), _endpoints(a=0, b=250), CycleState())
    assert empty == {"a": 1.0, "b": pytest.approx(0.75)}


# --- prefix-cache-affinity-filter ---------------------------------------------------------------------


def _affinity(**parameters: float) -> PrefixAffinityFilter:
    return PrefixAffinityFilter(
        "f", PrefixAffinityParameters.model_validate(parameters), PluginContext(rng=random.Random(0))
    )


def _kept(flt: PrefixAffinityFilter, endpoints: list[EndpointSnapshot], state: CycleState) -> list[str]:
    return [e.name for e in flt.filter(_request(), endpoints, state)]


def test_affinity_filter_keeps_the_endpoints_at_or_above_the_threshold() -> None:
    flt = _affinity(affinity_threshold=0.8)
    assert _kept(flt, _endpoints(a=0, b=0, c=0), _matches(a=8, b=10, c=7)) == ["a", "b"]


def test_affinity_filter_keeps_all_when_none_is_sticky_or_one_candidate() -> None:
    flt = _affinity(affinity_threshold=0.8)
    assert _kept(flt, _endpoints(a=0, b=0), _matches(a=7, b=0)) == ["a", "b"]
    assert _kept(flt, _endpoints(a=0, b=0), CycleState()) == ["a", "b"]  # no producer: scores 0
    assert _kept(flt, _endpoints(b=0), _matches(b=0)) == ["b"]
    assert _kept(_affinity(affinity_threshold=0.0), _endpoints(a=0, b=0), _matches(a=10)) == ["a", "b"]


def test_affinity_ttft_gate_breaks_stickiness_past_the_penalty() -> None:
    # 1000 tokens/s: 2000 more tokens in flight on the warm endpoint is 2000 ms more TTFT
    flt = _affinity(max_ttft_penalty_ms=1500, peak_prefill_throughput=1000)
    assert _kept(flt, _endpoints(warm=2000, cold=0), _matches(warm=10)) == ["warm", "cold"]
    assert _kept(flt, _endpoints(warm=1500, cold=0), _matches(warm=10)) == ["warm"]  # not more than
    always = _affinity(max_ttft_penalty_ms=0, peak_prefill_throughput=1000)
    assert _kept(always, _endpoints(warm=10**9, cold=0), _matches(warm=10)) == ["warm"]


def test_affinity_tokens_gate_of_earlier_llmd() -> None:
    flt = _affinity(max_ttft_penalty_ms=0, max_tokens_in_flight_penalty=100)
    assert _kept(flt, _endpoints(warm=150, cold=40), _matches(warm=10)) == ["warm", "cold"]
    assert _kept(flt, _endpoints(warm=140, cold=40), _matches(warm=10)) == ["warm"]


def test_affinity_exploration_keeps_every_candidate_at_its_probability() -> None:
    flt = _affinity(exploration_probability=1.0)
    assert _kept(flt, _endpoints(a=0, b=0), _matches(a=10)) == ["a", "b"]


# --- session affinity -----------------------------------------------------------------------------------


def _token(name: str) -> str:
    return base64.b64encode(name.encode()).decode()


def test_encoded_endpoint_header_scores_the_endpoint_the_token_names() -> None:
    scorer = SessionAffinityScorer("s", SessionAffinityParameters(), PluginContext())
    assert scorer.request_headers == ("x-session-token",) and scorer.echo_headers == ("x-session-token",)
    endpoints = _endpoints(a=0, b=0)
    pinned = _request(headers=(("x-session-token", _token("b")),))
    assert scorer.score(pinned, endpoints, CycleState()) == {"a": 0.0, "b": 1.0}
    for headers in ((), (("x-session-token", "not base64!"),), (("x-session-token", _token("gone")),)):
        assert scorer.score(_request(headers=headers), endpoints, CycleState()) == {"a": 0.0, "b": 0.0}


def test_session_filter_keeps_only_the_session_endpoint_when_it_is_a_candidate() -> None:
    flt = SessionAffinityFilter("s", SessionAffinityParameters(), PluginContext())
    endpoints = _endpoints(a=0, b=0)
    pinned = _request(headers=(("x-session-token", _token("b")),))
    assert [e.name for e in flt.filter(pinned, endpoints, CycleState())] == ["b"]
    gone = _request(headers=(("x-session-token", _token("c")),))
    assert [e.name for e in flt.filter(gone, endpoints, CycleState())] == ["a", "b"]


def test_session_id_binds_on_dispatch_keeps_moves_and_expires() -> None:
    now = [0.0]
    params = SessionAffinityParameters(strategy="session_id", eviction_ttl_s=300.0)
    scorer = SessionAffinityScorer("s", params, PluginContext(clock=lambda: now[0]))
    assert scorer.request_headers == ("x-session-id",) and scorer.echo_headers == ()
    a, b, c = _endpoints(a=0, b=0, c=0)
    session = (("x-session-id", "chat-1"),)
    first = _request("1", headers=session)
    assert scorer.score(first, [a, b], CycleState()) == {"a": 0.0, "b": 0.0}  # unbound: no preference
    scorer.on_dispatch(first, b)
    second = _request("2", headers=session)
    assert scorer.score(second, [a, b], CycleState()) == {"a": 0.0, "b": 1.0}
    scorer.on_dispatch(second, a)  # b was a candidate, the picker chose a: the binding stays on b
    third = _request("3", headers=session)
    assert scorer.score(third, [a, c], CycleState()) == {"a": 0.0, "c": 0.0}  # b is gone ...
    scorer.on_dispatch(third, c)  # ... so the session moves to where it went
    assert scorer.score(_request("4", headers=session), [a, b, c], CycleState())["c"] == 1.0
    now[0] = 301.0
    assert scorer.score(_request("5", headers=session), [a, b, c], CycleState())["c"] == 0.0  # expired


def test_the_front_passes_declared_headers_in_and_echoes_the_serving_endpoint() -> None:
    client = [(b"X-Session-Token", b"abc"), (b"authorization", b"Bearer k"), (b"x-other", b"1")]
    assert plugin_request_headers(client, frozenset({"x-session-token"})) == (("x-session-token", "abc"),)
    assert plugin_request_headers(client, frozenset()) == ()
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    import anyio

    head = {"type": "http.response.start", "status": 200, "headers": [(b"x-burstsched-endpoint", b"vllm-1")]}
    anyio.run(echo_endpoint(send, ("x-session-token",)), head)
    assert (b"x-session-token", base64.b64encode(b"vllm-1")) in sent[0]["headers"]


# --- the llm-d files ------------------------------------------------------------------------------------


def _llmd(body: str) -> str:
    return "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n" + textwrap.dedent(body)


def test_optimized_baseline_plugins_become_the_filter_and_scorer() -> None:
    loaded = parse_config_document(
        _llmd("""
        plugins:
        - type: token-load-scorer
          parameters: {queueThresholdTokens: 0}
        - type: inflight-load-producer
        - type: approx-prefix-cache-producer
          parameters: {autoTune: false, lruCapacityPerServer: 41000}
        - type: prefix-cache-affinity-filter
          parameters: {affinityThreshold: 0.9, maxTTFTPenaltyMs: 0, maxTokensInFlightPenalty: 286720}
        schedulingProfiles:
        - name: default
          plugins: [{pluginRef: prefix-cache-affinity-filter}, {pluginRef: token-load-scorer}]
        """)
    )
    config = loaded.config
    specs = {p.type: p for p in config.plugins}
    assert specs["token-load-scorer"].parameters == {"queue_threshold_tokens": 4194304}  # llm-d's default
    assert specs["approx-prefix-producer"].parameters["capacity_from_endpoint"] is False
    assert specs["prefix-cache-affinity-filter"].parameters["affinity_threshold"] == 0.9
    assert specs["prefix-cache-affinity-filter"].parameters["max_tokens_in_flight_penalty"] == 286720
    refs = [r.plugin_ref for r in config.profile.plugins]
    assert refs == [
        "approx-prefix-producer",
        "health-filter",
        "prefix-cache-affinity-filter",
        "token-load-scorer",
    ]


def test_refused_llmd_knobs_say_why() -> None:
    from burstsched.config import ConfigError

    with pytest.raises(ConfigError) as excinfo:
        parse_config_document(
            _llmd("""
            plugins:
            - type: inflight-load-producer
              parameters: {addEstimatedOutputTokens: true}
            - type: session-affinity-scorer
              parameters: {strategy: session_id, sessionIdConfig: {sources: [{attribute: agent-identity}]}}
            - type: max-score-picker
            """)
        )
    lines = [str(i) for i in excinfo.value.issues]
    assert any("addEstimatedOutputTokens" in line and "prefill ledger" in line for line in lines), lines
    assert any("sources[0].attribute" in line and "request headers only" in line for line in lines), lines


def test_precise_prefix_cache_scorer_is_the_producer_and_the_scorer() -> None:
    loaded = parse_config_document(
        _llmd("""
        plugins:
        - type: precise-prefix-cache-scorer
          parameters:
            tokenProcessorConfig: {blockSize: 64}
            indexerConfig: {tokenizersPoolConfig: {modelName: m, uds: {socketFile: /tmp/t.sock}}}
            kvEventsConfig: {podDiscoveryConfig: {socketPort: 5556}}
        - type: max-score-picker
        schedulingProfiles:
        - name: default
          plugins: [{pluginRef: precise-prefix-cache-scorer, weight: 3}, {pluginRef: max-score-picker}]
        """)
    )
    config = loaded.config
    assert {"precise-prefix-producer", "prefix-cache-scorer"} <= {p.type for p in config.plugins}
    assert config.tokenizer.source == "remote"
    assert config.kv_events.endpoint_template == "tcp://{host}:5556"
    assert [(r.plugin_ref, r.weight) for r in config.profile.plugins][-1] == ("prefix-cache-scorer", 3.0)


def test_check_explain_names_the_new_mappings(tmp_path: object) -> None:
    import io
    from pathlib import Path

    path = Path(str(tmp_path)) / "c.yaml"
    path.write_text(
        _llmd("""
        plugins:
        - type: passthrough-parser
        - type: active-request-scorer
        - type: session-affinity-scorer
        - type: inflight-load-producer
        requestHandler: {parsers: [{pluginRef: passthrough-parser}]}
        """)
    )
    out = io.StringIO()
    assert check_files([path], out=out, err=io.StringIO(), explain=True) == 0
    text = out.getvalue()
    assert "session-affinity-scorer 'session-affinity-scorer': session-affinity-scorer" in text
    assert "passthrough-parser 'passthrough-parser': nothing: burstsched parses" in text
    assert "inflight-load-producer 'inflight-load-producer': nothing: burstsched counts" in text
