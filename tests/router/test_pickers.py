from __future__ import annotations

import random
from collections import Counter

from burstsched_plugins.pickers import (
    MaxScoreParameters,
    MaxScorePicker,
    RandomParameters,
    RandomPicker,
    WeightedRandomParameters,
    WeightedRandomPicker,
)

from burstsched.framework import EndpointSnapshot, PluginContext, ScoredEndpoint

from .helpers import sched_request


def _scored(totals: dict[str, float]) -> list[ScoredEndpoint]:
    return [ScoredEndpoint(EndpointSnapshot(name, "u"), {}, total) for name, total in totals.items()]


def test_max_score_picks_the_highest_total_and_ranks_the_rest() -> None:
    picker = MaxScorePicker("p", MaxScoreParameters(), PluginContext(rng=random.Random(0)))
    ranked = picker.pick(sched_request(), _scored({"a": 1.0, "b": 5.0, "c": 3.0}))
    assert [s.name for s in ranked] == ["b", "c", "a"]


def test_least_recent_tie_break_rotates_a_burst_evenly() -> None:
    picker = MaxScorePicker("p", MaxScoreParameters(), PluginContext(rng=random.Random(0)))
    tied = _scored({"a": 7.0, "b": 7.0, "c": 7.0, "d": 7.0})
    picks = [picker.pick(sched_request(), tied)[0].name for _ in range(40)]
    assert Counter(picks) == {"a": 10, "b": 10, "c": 10, "d": 10}
    assert all(picks[i] != picks[i + 1] for i in range(len(picks) - 1))


def test_random_tie_break_spreads_a_burst() -> None:
    picker = MaxScorePicker("p", MaxScoreParameters(tie_break="random"), PluginContext(rng=random.Random(3)))
    tied = _scored({"a": 1.0, "b": 1.0, "c": 0.2})
    picks = Counter(picker.pick(sched_request(), tied)[0].name for _ in range(200))
    assert set(picks) == {"a", "b"}
    assert min(picks.values()) > 60


def test_tie_tolerance_groups_nearly_equal_totals() -> None:
    picker = MaxScorePicker("p", MaxScoreParameters(tie_tolerance=0.01), PluginContext(rng=random.Random(0)))
    scored = _scored({"a": 1.0, "b": 0.995, "c": 0.5})
    first = [picker.pick(sched_request(), scored)[0].name for _ in range(4)]
    assert sorted(first[:2]) == ["a", "b"] and first[2:] == first[:2]


def test_random_picker_returns_a_permutation() -> None:
    picker = RandomPicker("p", RandomParameters(), PluginContext(rng=random.Random(5)))
    scored = _scored({"a": 9.0, "b": 0.0, "c": 1.0})
    firsts: Counter[str] = Counter()
    for _ in range(300):
        ranked = picker.pick(sched_request(), scored)
        assert sorted(s.name for s in ranked) == ["a", "b", "c"]
        firsts[ranked[0].name] += 1
    assert min(firsts.values()) > 60


def test_weighted_random_picker_follows_weights() -> None:
    picker = WeightedRandomPicker("p", WeightedRandomParameters(), PluginContext(rng=random.Random(11)))
    scored = _scored({"a": 3.0, "b": 1.0, "z": 0.0})
    firsts = Counter(picker.pick(sched_request(), scored)[0].name for _ in range(400))
    assert firsts["z"] == 0
    assert 240 < firsts["a"] < 360
    zeros = _scored({"a": 0.0, "b": 0.0})
    assert {picker.pick(sched_request(), zeros)[0].name for _ in range(50)} == {"a", "b"}
