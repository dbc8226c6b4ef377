"""Scorers, filter and engine: scores stay in [0, 1], weights and clamping live in the engine."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping, Sequence

import pytest
from burstsched_plugins.health_filter import HealthFilter, HealthFilterParameters
from burstsched_plugins.kv_scorer import KvUtilizationParameters, KvUtilizationScorer
from burstsched_plugins.pickers import MaxScoreParameters, MaxScorePicker
from burstsched_plugins.prefix_scorer import PrefixCacheParameters, PrefixCacheScorer
from burstsched_plugins.queue_scorer import QueueParameters, QueueScorer
from hypothesis import given, settings
from hypothesis import strategies as st

from burstsched.framework import CycleState, EndpointSnapshot, PluginContext, PrefixMatch, SchedRequest
from burstsched.scheduling import (
    NoEndpointsError,
    PluginContractError,
    Scheduler,
    SchedulerProfile,
    WeightedScorer,
)

from .helpers import sched_request

CTX = PluginContext(rng=random.Random(0))

snapshots = st.lists(
    st.builds(
        EndpointSnapshot,
        name=st.just(""),
        url=st.just("http://127.0.0.1:1"),
        healthy=st.booleans(),
        stale=st.booleans(),
        waiting=st.integers(0, 10_000),
        running=st.integers(0, 10_000),
        kv_usage=st.floats(0.0, 1.0),
        in_flight=st.integers(0, 10_000),
        pending=st.integers(0, 10_000),
    ),
    min_size=1,
    max_size=8,
).map(lambda eps: [dataclasses.replace(e, name=f"e{i}") for i, e in enumerate(eps)])


def _all_scorers() -> list[object]:
    return [
        QueueScorer("queue", QueueParameters(), CTX),
        KvUtilizationScorer("kv", KvUtilizationParameters(), CTX),
        PrefixCacheScorer("prefix", PrefixCacheParameters(), CTX),
    ]


@settings(max_examples=60, deadline=None)
@given(
    endpoints=snapshots,
    group=st.integers(1, 64),
    matched=st.lists(st.integers(0, 50), min_size=8, max_size=8),
)
def test_every_scorer_stays_in_unit_interval(
    endpoints: list[EndpointSnapshot], group: int, matched: list[int]
) -> None:
    request = sched_request(range(50), group_size=group)
    state = CycleState()
    for endpoint, m in zip(endpoints, matched, strict=False):
        state.put(endpoint.name, PrefixMatch(m, 50, 64))
    for scorer in _all_scorers():
        scores = scorer.score(request, endpoints, state)  # type: ignore[attr-defined]
        assert set(scores) == {e.name for e in endpoints}
        for value in scores.values():
            assert 0.0 <= value <= 1.0


def test_queue_scorer_min_max_and_all_equal() -> None:
    scorer = QueueScorer("queue", QueueParameters(), CTX)
    eps = [
        EndpointSnapshot("a", "u", waiting=4, in_flight=0),
        EndpointSnapshot("b", "u", waiting=0, in_flight=1, pending=1),
        EndpointSnapshot("c", "u", waiting=0),
    ]
    assert scorer.score(sched_request(), eps, CycleState()) == {"a": 0.0, "b": 0.5, "c": 1.0}
    equal = [EndpointSnapshot("a", "u", waiting=2), EndpointSnapshot("b", "u", in_flight=2)]
    assert scorer.score(sched_request(group_size=8), equal, CycleState()) == {"a": 1.0, "b": 1.0}


def test_queue_scorer_falls_back_to_own_counts_when_metrics_are_stale() -> None:
    scorer = QueueScorer("queue", QueueParameters(), CTX)
    eps = [
        EndpointSnapshot("a", "u", waiting=50, in_flight=0, stale=True),
        EndpointSnapshot("b", "u", waiting=0, in_flight=2),
    ]
    assert scorer.score(sched_request(), eps, CycleState()) == {"a": 1.0, "b": 0.0}


def test_kv_scorer_abstains_on_stale_metrics() -> None:
    scorer = KvUtilizationScorer("kv", KvUtilizationParameters(), CTX)
    fresh = [EndpointSnapshot("a", "u", kv_usage=0.25), EndpointSnapshot("b", "u", kv_usage=1.0)]
    assert scorer.score(sched_request(), fresh, CycleState()) == {"a": 0.75, "b": 0.0}
    stale = [fresh[0], EndpointSnapshot("b", "u", kv_usage=1.0, stale=True)]
    assert scorer.score(sched_request(), stale, CycleState()) == {"a": 1.0, "b": 1.0}


def test_prefix_scorer_uses_contiguous_match_ratio() -> None:
    scorer = PrefixCacheScorer("prefix", PrefixCacheParameters(), CTX)
    state = CycleState()
    state.put("a", PrefixMatch(3, 4, 64))
    state.put("b", PrefixMatch(0, 0, 64))
    eps = [EndpointSnapshot("a", "u"), EndpointSnapshot("b", "u"), EndpointSnapshot("c", "u")]
    assert scorer.score(sched_request(), eps, state) == {"a": 0.75, "b": 0.0, "c": 0.0}


def test_health_filter_drops_unhealthy_and_fails_open() -> None:
    request, state = sched_request(), CycleState()
    keep_stale = HealthFilter("h", HealthFilterParameters(), CTX)
    drop_stale = HealthFilter("h", HealthFilterParameters(drop_stale=True), CTX)
    eps = [
        EndpointSnapshot("a", "u", healthy=False),
        EndpointSnapshot("b", "u", stale=True),
        EndpointSnapshot("c", "u"),
    ]
    assert [e.name for e in keep_stale.filter(request, eps, state)] == ["b", "c"]
    assert [e.name for e in drop_stale.filter(request, eps, state)] == ["c"]
    down = [EndpointSnapshot("a", "u", healthy=False), EndpointSnapshot("b", "u", healthy=False)]
    assert [e.name for e in keep_stale.filter(request, down, state)] == ["a", "b"]


class _FixedScorer:
    """A scorer returning fixed raw values, out of range on purpose."""

    def __init__(self, name: str, values: Mapping[str, float]) -> None:
        self.name = name
        self.values = values

    def score(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> Mapping[str, float]:
        return self.values


class _DropAll:
    name = "drop-all"

    def filter(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> Sequence[EndpointSnapshot]:
        return []


def _picker() -> MaxScorePicker:
    return MaxScorePicker("pick", MaxScoreParameters(tie_break="random"), PluginContext(rng=random.Random(1)))


def test_engine_clamps_and_weights_scores() -> None:
    weird = _FixedScorer("weird", {"a": 7.0, "b": -3.0, "c": math.nan})
    half = _FixedScorer("half", {"a": 0.5, "b": 0.5, "c": 0.25})
    profile = SchedulerProfile((), (), (WeightedScorer(weird, 3.0), WeightedScorer(half, 2.0)), _picker())
    eps = [EndpointSnapshot("a", "u"), EndpointSnapshot("b", "u"), EndpointSnapshot("c", "u")]
    decision = Scheduler(profile).schedule(sched_request(), eps)
    by_name = {s.name: s for s in decision.ranked}
    assert by_name["a"].scores == {"weird": 1.0, "half": 0.5}
    assert by_name["a"].total == pytest.approx(4.0)
    assert by_name["b"].scores["weird"] == 0.0
    assert by_name["c"].scores["weird"] == 0.0 and by_name["c"].total == pytest.approx(0.5)
    assert [s.name for s in decision.ranked] == ["a", "b", "c"]
    assert decision.endpoint.name == "a"


def test_engine_fails_open_when_a_filter_drops_everything() -> None:
    profile = SchedulerProfile((), (_DropAll(),), (), _picker())
    eps = [EndpointSnapshot("a", "u"), EndpointSnapshot("b", "u")]
    decision = Scheduler(profile).schedule(sched_request(), eps)
    assert sorted(s.name for s in decision.ranked) == ["a", "b"]


class _LosingPicker:
    name = "loses"

    def pick(self, request: SchedRequest, candidates: Sequence[object]) -> Sequence[object]:
        return list(candidates)[:1]


def test_engine_rejects_pickers_that_lose_candidates() -> None:
    profile = SchedulerProfile((), (), (), _LosingPicker())  # type: ignore[arg-type]
    with pytest.raises(PluginContractError):
        Scheduler(profile).schedule(sched_request(), [EndpointSnapshot("a", "u"), EndpointSnapshot("b", "u")])
    with pytest.raises(NoEndpointsError):
        Scheduler(profile).schedule(sched_request(), [])


def test_group_size_counts_as_load_with_pending() -> None:
    """A group's whole size and the window's pending load steer the decision away from a busy endpoint."""
    queue = QueueScorer("queue", QueueParameters(), CTX)
    profile = SchedulerProfile((), (), (WeightedScorer(queue, 1.0),), _picker())
    eps = [EndpointSnapshot("a", "u", pending=8), EndpointSnapshot("b", "u", waiting=3)]
    decision = Scheduler(profile).schedule(sched_request(group_size=8), eps)
    assert decision.endpoint.name == "b"
    assert [s.total for s in decision.ranked] == [1.0, 0.0]


def test_the_observers_see_one_cycle_in_timing_every() -> None:
    """Plugin and cycle timings are a sample: one schedule (and one produce) call in ``timing_every``."""
    queue = QueueScorer("queue", QueueParameters(), CTX)
    profile = SchedulerProfile(
        (), (), (WeightedScorer(queue, 1.0),), MaxScorePicker("picker", MaxScoreParameters(), CTX)
    )
    seen: list[tuple[str, str]] = []
    cycles: list[float] = []
    scheduler = Scheduler(
        profile,
        observer=lambda point, name, _s: seen.append((point, name)),
        cycle_observer=cycles.append,
        timing_every=4,
    )
    endpoints = [EndpointSnapshot(name=f"e{i}", url="http://127.0.0.1:1") for i in range(2)]
    request = sched_request()
    for _ in range(12):
        scheduler.schedule(request, endpoints)
    assert len(cycles) == 3
    assert seen == [("scorer", "queue"), ("picker", "picker")] * 3
    for _ in range(8):  # produce() alone keeps its own count: schedule()'s sampling is unchanged by it
        state = scheduler.produce(request, endpoints)
        scheduler.schedule(request, endpoints, produced=state)
    assert len(cycles) == 5
    with pytest.raises(ValueError):
        Scheduler(profile, timing_every=0)
