"""The cost scorer: estimated time to first token from queued prefill, own uncached prefill and speed."""

from __future__ import annotations

import pytest
from burstsched_plugins.cost_scorer import CostParameters, CostScorer

from burstsched.framework import (
    ApiKind,
    CycleState,
    EndpointSnapshot,
    PluginContext,
    PrefixMatch,
    SchedRequest,
)


def _scorer(**params: float) -> CostScorer:
    return CostScorer("cost", CostParameters.model_validate(params), PluginContext())


def _request(tokens: int = 4000, group_size: int = 1) -> SchedRequest:
    return SchedRequest("r", "m", ApiKind.CHAT, prompt_tokens=tokens, group_size=group_size)


def _state(**matched: int) -> CycleState:
    state = CycleState()
    for name, blocks in matched.items():
        state.put(name, PrefixMatch(blocks, 62, 64))
    return state


def _ep(name: str, **fields: object) -> EndpointSnapshot:
    return EndpointSnapshot(name, f"http://{name}", metrics_age=0.0, **fields)  # type: ignore[arg-type]


def test_a_warm_endpoint_wins_until_its_queue_costs_more_than_the_prefill_it_saves() -> None:
    scorer = _scorer(work_weight=0.0, overhead_s=0.0, decode_slowdown=0.0, tie_tolerance=0.0)
    request = _request(4000)
    state = _state(warm=60, cold=0)  # warm holds 3840 of 4000 tokens
    idle = [_ep("warm", prefill_tokens_per_s=1000.0), _ep("cold", prefill_tokens_per_s=1000.0)]
    scores = scorer.score(request, idle, state)
    assert scores["warm"] == 1.0 and scores["cold"] == pytest.approx(0.16 / 4.0)
    # 3000 tokens queued on the warm one: 3.16 s there against 4 s cold, still warm
    busy = [_ep("warm", queued_prefill_tokens=3000, prefill_tokens_per_s=1000.0), idle[1]]
    scores = scorer.score(request, busy, state)
    assert scores["warm"] == 1.0 and scores["cold"] < 1.0
    # 5000 queued: 5.16 s against 4 s, the cold one wins
    busier = [_ep("warm", queued_prefill_tokens=5000, prefill_tokens_per_s=1000.0), idle[1]]
    scores = scorer.score(request, busier, state)
    assert scores["cold"] == 1.0 and scores["warm"] == pytest.approx(4.0 / 5.16)


def test_the_work_a_choice_adds_keeps_requests_on_their_warm_endpoint_longer() -> None:
    request = _request(4000)
    state = _state(warm=60, cold=0)
    endpoints = [
        _ep("warm", queued_prefill_tokens=5000, prefill_tokens_per_s=1000.0),
        _ep("cold", prefill_tokens_per_s=1000.0),
    ]
    greedy = _scorer(work_weight=0.0, overhead_s=0.0, tie_tolerance=0.0).costs(request, endpoints, state)
    charged = _scorer(work_weight=1.0, overhead_s=0.0, tie_tolerance=0.0).costs(request, endpoints, state)
    assert greedy["cold"] < greedy["warm"] and charged["warm"] < charged["cold"]


def test_group_size_counts_each_further_member_once_past_the_prefix() -> None:
    scorer = _scorer(work_weight=0.0, overhead_s=0.0, group_tail_tokens=100, tie_tolerance=0.0)
    state = _state(a=0)
    endpoints = [_ep("a", prefill_tokens_per_s=1000.0)]
    one = scorer.costs(_request(4000), endpoints, state)["a"]
    eight = scorer.costs(_request(4000, group_size=8), endpoints, state)["a"]
    assert one == pytest.approx(4.0) and eight == pytest.approx(4.7)


def test_a_faster_replica_is_cheaper_and_an_unmeasured_one_gets_the_pools_mean() -> None:
    scorer = _scorer(work_weight=0.0, overhead_s=0.0, tie_tolerance=0.0, speed_tolerance=0.2)
    state = _state(fast=0, slow=0, new=0)
    endpoints = [
        _ep("fast", prefill_tokens_per_s=4000.0),
        _ep("slow", prefill_tokens_per_s=2000.0),
        _ep("new"),
    ]
    costs = scorer.costs(_request(3000), endpoints, state)
    assert costs == {"fast": pytest.approx(0.75), "slow": pytest.approx(1.5), "new": pytest.approx(1.0)}


def test_speeds_within_the_tolerance_count_as_alike() -> None:
    scorer = _scorer(work_weight=0.0, overhead_s=0.0, tie_tolerance=0.0, speed_tolerance=0.5)
    state = _state(a=0, b=0)
    endpoints = [_ep("a", prefill_tokens_per_s=3000.0), _ep("b", prefill_tokens_per_s=4000.0)]
    costs = scorer.costs(_request(3500), endpoints, state)
    assert costs == {"a": pytest.approx(1.0), "b": pytest.approx(1.0)}


def test_near_ties_score_one_so_the_picker_spreads_them() -> None:
    scorer = _scorer(tie_tolerance=0.1)
    state = _state(a=0, b=0)
    endpoints = [_ep("a", prefill_tokens_per_s=1000.0), _ep("b", prefill_tokens_per_s=1080.0)]
    assert scorer.score(_request(), endpoints, state) == {"a": 1.0, "b": 1.0}


def test_other_clients_waiting_requests_and_this_windows_pending_load_count() -> None:
    scorer = _scorer(work_weight=0.0, overhead_s=0.0, decode_slowdown=0.0, tie_tolerance=0.0)
    state = _state(a=0, b=0, c=0)
    endpoints = [
        _ep("a", prefill_tokens_per_s=1000.0),
        _ep("b", waiting=3, in_flight=1, prefill_tokens_per_s=1000.0),  # 2 queued by someone else
        _ep("c", pending=1, prefill_tokens_per_s=1000.0),
    ]
    costs = scorer.costs(_request(1000), endpoints, state)
    assert costs == {"a": pytest.approx(1.0), "b": pytest.approx(3.0), "c": pytest.approx(2.0)}
    stale = [_ep("b", waiting=3, in_flight=1, stale=True, prefill_tokens_per_s=1000.0)]
    assert scorer.costs(_request(1000), stale, state)["b"] == pytest.approx(1.0)  # stale figures ignored


def _warm_and_cold(warm_queued: int) -> tuple[list[EndpointSnapshot], CycleState]:
    """warm holds 3840 of a 4000-token prompt: idle it costs 0.16 s, cold 4 s (1000 tokens/s, no overhead)."""
    endpoints = [
        _ep("warm", queued_prefill_tokens=warm_queued, prefill_tokens_per_s=1000.0),
        _ep("cold", prefill_tokens_per_s=1000.0),
    ]
    return endpoints, _state(warm=60, cold=0)


def _hysteresis(stay_margin: float, tie_tolerance: float = 0.0) -> CostScorer:
    return _scorer(
        work_weight=0.0,
        overhead_s=0.0,
        decode_slowdown=0.0,
        tie_tolerance=tie_tolerance,
        stay_margin=stay_margin,
    )


def test_the_stay_margin_keeps_a_request_on_its_warm_endpoint_until_another_is_that_much_cheaper() -> None:
    scorer = _hysteresis(stay_margin=0.5)
    # 5000 queued on warm: 5.16 s there against 4 s cold, warm dearer by 29%: within the margin, it stays
    endpoints, state = _warm_and_cold(5000)
    scores = scorer.score(_request(4000), endpoints, state)
    assert scores["warm"] == 1.0 and scores["cold"] < 1.0
    # 6500 queued: 6.66 s against 4 s, dearer by 66%: it moves, by cost as without the margin
    endpoints, state = _warm_and_cold(6500)
    scores = scorer.score(_request(4000), endpoints, state)
    assert scores == {"cold": 1.0, "warm": pytest.approx(4.0 / 6.66)}
    # without a margin the 5000 case moves
    endpoints, state = _warm_and_cold(5000)
    assert _hysteresis(stay_margin=0.0).score(_request(4000), endpoints, state)["cold"] == 1.0


def test_with_a_stay_margin_a_warm_endpoint_wins_a_tie_the_cold_one_would_share() -> None:
    # 3900 queued on warm: 4.06 s against 4 s, within the 10% tie tolerance
    endpoints, state = _warm_and_cold(3900)
    plain = _hysteresis(stay_margin=0.0, tie_tolerance=0.1).score(_request(4000), endpoints, state)
    assert plain == {"warm": 1.0, "cold": 1.0}  # the picker's tie-break could send it cold
    kept = _hysteresis(stay_margin=0.2, tie_tolerance=0.1).score(_request(4000), endpoints, state)
    assert kept["warm"] == 1.0 and kept["cold"] < 1.0


def test_the_others_rank_below_the_kept_endpoint_in_order_of_cost() -> None:
    scorer = _hysteresis(stay_margin=1.0)
    state = _state(warm=60, near=0, far=0, nearest=20)
    endpoints = [
        _ep("warm", queued_prefill_tokens=5000, prefill_tokens_per_s=1000.0),  # 5.16 s
        _ep("near", prefill_tokens_per_s=1000.0),  # 4 s
        _ep("far", queued_prefill_tokens=2000, prefill_tokens_per_s=1000.0),  # 6 s
        _ep("nearest", prefill_tokens_per_s=1000.0),  # holds 1280 tokens: 2.72 s
    ]
    scores = scorer.score(_request(4000), endpoints, state)
    assert scores["warm"] == 1.0 > scores["nearest"] > scores["near"] > scores["far"]


def test_a_prefix_nobody_holds_more_of_spreads_as_without_the_margin() -> None:
    scorer = _scorer(tie_tolerance=0.1, stay_margin=1.0)
    state = _state(a=0, b=0)
    endpoints = [_ep("a", prefill_tokens_per_s=1000.0), _ep("b", prefill_tokens_per_s=1080.0)]
    assert scorer.score(_request(), endpoints, state) == {"a": 1.0, "b": 1.0}
    both = _state(a=60, b=60)
    assert scorer.score(_request(), endpoints, both) == {"a": 1.0, "b": 1.0}
