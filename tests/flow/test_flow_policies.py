"""llm-d's flow-control policies as burstsched runs them: program-aware fairness, per-priority dispatch
ceilings and the probabilistic admitter, each against the behaviour llm-d documents for it (the plugins'
READMEs in llm-d-router: fairness/program-aware, usagelimits/priorityholdback and softreflectiveceiling,
requestcontrol/admitter/probabilisticadmitter).

The queue is driven by hand as in ``test_flow_queue``: a manual clock, release passes run by the test, a
pool whose room is counted in requests before their first token (``max_prefill_requests`` each).
"""

from __future__ import annotations

import random

import anyio
import pytest

from burstsched.config.flow_control import (
    AdmitterConfig,
    CeilingConfig,
    HeadroomConfig,
    ProgramAwareConfig,
)
from burstsched.flow import Identity
from burstsched.flow.admitter import ProbabilisticAdmitter, pool_saturation, refusal_probability
from burstsched.flow.ceiling import Ceilings, holdback_ceilings, reflective_ceilings
from burstsched.flow.fairness import AttainedService
from burstsched.framework import EndpointSnapshot
from tests.flow.test_flow_queue import Harness, doc, flow_config, run, settle

pytestmark = pytest.mark.anyio


# --- the probabilistic admitter ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("saturation", "probability"),
    # llm-d's README, defaults power 5 and k 300: ~2.3% at 0.15, ~9.6% at 0.20, ~73% at 0.30, all from 0.34;
    # at 0.08 its formula (and code) give 0.098%, where its table's "dead zone" row says under 0.01%
    [(0.0, 0.0), (0.08, 0.00098), (0.15, 0.0228), (0.20, 0.096), (0.30, 0.729), (0.34, 1.0), (2.0, 1.0)],
)
def test_the_refusal_probability_follows_llm_d_s_curve(saturation: float, probability: float) -> None:
    assert refusal_probability(saturation, AdmitterConfig()) == pytest.approx(probability, abs=5e-4, rel=0.01)


def test_full_refusal_starts_at_the_saturation_k_and_power_set() -> None:
    config = AdmitterConfig(power=5.0, k=1000.0)  # llm-d: 100% at (1/k)^(1/power), ~0.25 for k 1000
    edge = (1 / 1000) ** (1 / 5)
    assert refusal_probability(edge * 0.99, config) < 1.0 <= refusal_probability(edge * 1.001, config)


def endpoint(name: str, **fields: object) -> EndpointSnapshot:
    return EndpointSnapshot(name, f"http://{name}", **{"metrics_age": 0.0, **fields})  # type: ignore[arg-type]


def test_saturation_is_the_mean_roofline_over_healthy_endpoints_stale_ones_counting_full() -> None:
    config = AdmitterConfig()  # queue 5, KV 0.8
    pool = [
        endpoint("queue-bound", waiting=2, kv_usage=0.2),  # max(2/5, 0.25) = 0.4
        endpoint("kv-bound", waiting=0, kv_usage=0.6),  # max(0, 0.75) = 0.75
        endpoint("stale", stale=True, waiting=0),  # its metrics are not to be trusted: 1.0
        endpoint("down", healthy=False, waiting=50),  # not a candidate
    ]
    assert pool[2].stale
    assert pool_saturation(pool, config) == pytest.approx((0.4 + 0.75 + 1.0) / 3)


def test_sheddable_requests_are_refused_at_the_curve_s_rate_with_a_seeded_rng() -> None:
    """At saturation 0.2 (both endpoints with 1 waiting of 5) about 9.6% of sheddable requests are refused;
    requests of priority 0 and above never are, even with the pool far past saturation."""
    admitter = ProbabilisticAdmitter(AdmitterConfig(), random.Random(7).random)
    pool = [endpoint("e1", waiting=1), endpoint("e2", waiting=1)]
    refused = sum(admitter.refuses(-1, pool) is not None for _ in range(20_000))
    assert refused / 20_000 == pytest.approx(0.096, abs=0.006)
    assert admitter.refuses(-1, pool) in (None, pytest.approx(0.2))
    full = [endpoint("e1", waiting=50), endpoint("e2", kv_usage=1.0)]
    assert all(admitter.refuses(-5, full) == pytest.approx((50 / 5 + 1.0 / 0.8) / 2) for _ in range(100))
    assert all(admitter.refuses(p, full) is None for p in (0, 1, 10) for _ in range(100))


def test_the_admitter_admits_when_no_endpoint_is_healthy() -> None:
    admitter = ProbabilisticAdmitter(AdmitterConfig(), lambda: 0.0)  # would refuse any positive chance
    assert admitter.refuses(-1, [endpoint("e1", healthy=False, waiting=99)]) is None
    assert admitter.refuses(-1, []) is None
    assert admitter.refuses(-1, [endpoint("e1", waiting=99)]) is not None


# --- program-aware fairness ----------------------------------------------------------------------------


def test_attained_service_weighs_output_twice_and_halves_every_half_life() -> None:
    service = AttainedService(ProgramAwareConfig(half_life_s=60.0))
    assert service.add("a", 1000, 250, now=0.0) == 1500.0  # 1000 + 2 x 250
    assert service.service("a", now=60.0) == pytest.approx(750.0)
    assert service.add("a", 100, 0, now=120.0) == pytest.approx(475.0)  # 375 decayed, then + 100
    assert service.service("never", now=120.0) == 0.0
    frozen = AttainedService(ProgramAwareConfig(half_life_s=0.0))  # 0: no decay
    frozen.add("a", 10, 0, now=0.0)
    assert frozen.service("a", now=1e6) == 10.0


def test_scores_prefer_the_least_served_flow_and_break_ties_by_the_older_head() -> None:
    service = AttainedService(ProgramAwareConfig())
    service.add("heavy", 9000, 0, now=0.0)
    service.add("light", 1000, 0, now=0.0)
    # light: 0.8 x 1 + 0.2 x 0 (its head is the younger); heavy: 0.8 x 0 + 0.2 x 1
    assert service.scores({"heavy": 5.0, "light": 1.0}, now=0.0) == pytest.approx(
        {"light": 0.8, "heavy": 0.2}
    )
    even = service.scores({"new-a": 3.0, "new-b": 1.0}, now=0.0)  # no service either: the older head wins
    assert even["new-a"] > even["new-b"]


def test_idle_flows_are_forgotten_after_their_ttl() -> None:
    service = AttainedService(ProgramAwareConfig(forget_after_s=100.0, half_life_s=0.0))
    service.add("idle", 500, 0, now=0.0)
    service.add("busy", 500, 0, now=95.0)
    service.add("busy", 500, 0, now=150.0)
    assert len(service) == 1 and service.service("idle", now=150.0) == 0.0


def one_at_a_time(**overrides: object) -> Harness:
    """One endpoint with room for one request at a time."""
    config = flow_config(headroom=HeadroomConfig(max_prefill_requests=1), **overrides)
    h = Harness(config, names=("e1",))
    h.pool.full("e1")
    return h


async def release_one_by_one(h: Harness, passes: int) -> list[str]:
    order: list[str] = []
    for _ in range(passes):
        prefilling(h, "e1", 0)
        h.queue.release_pass()
        await settle()
        order.extend(sorted(set(h.results) - set(order)))
    return order


async def test_program_aware_fairness_releases_the_least_served_program_first() -> None:
    """The heavy program has consumed 10x the tokens; its three requests queued first, the light program's
    one later: the light program's goes first, then the heavy program's in arrival order."""
    h = one_at_a_time(fairness="program-aware")
    h.queue.completed("heavy", 20_000, 5_000)
    h.queue.completed("light", 2_000, 500)
    order: list[str] = []

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        for i in range(3):
            h.submit(tg, doc(f"heavy{i}", 10 + i), Identity(0, "heavy"))
            await settle()
            h.clock.advance(0.01)
        h.submit(tg, doc("light", 50), Identity(0, "light"))
        await settle()
        order.extend(await release_one_by_one(h, 4))

    await run(h, steps)
    assert order == ["light", "heavy0", "heavy1", "heavy2"]


async def test_program_aware_fairness_counts_output_tokens_twice() -> None:
    """Program a used 1000 prompt tokens; b used 300 prompt and 400 output tokens (700 in all, but 1100
    weighted): a is the less served, and goes first although b queued first."""
    h = one_at_a_time(fairness="program-aware")
    h.queue.completed("a", 1000, 0)
    h.queue.completed("b", 300, 400)
    order: list[str] = []

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        h.submit(tg, doc("b", 1), Identity(0, "b"))
        await settle()
        h.clock.advance(0.01)
        h.submit(tg, doc("a", 2), Identity(0, "a"))
        await settle()
        order.extend(await release_one_by_one(h, 2))

    await run(h, steps)
    assert order == ["a", "b"]


async def test_a_program_idle_for_half_lives_competes_again() -> None:
    """Heavy was served 4000 weighted tokens two half-lives ago (1000 now); light 1500 just now: heavy is
    the less served today and goes first."""
    h = one_at_a_time(fairness="program-aware", program_aware=ProgramAwareConfig(half_life_s=60.0))
    h.queue.completed("heavy", 4000, 0)
    h.clock.advance(120.0)
    h.queue.completed("light", 1500, 0)
    order: list[str] = []

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        h.submit(tg, doc("light", 1), Identity(0, "light"))
        await settle()
        h.clock.advance(0.01)
        h.submit(tg, doc("heavy", 2), Identity(0, "heavy"))
        await settle()
        order.extend(await release_one_by_one(h, 2))

    await run(h, steps)
    assert order == ["heavy", "light"]


async def test_program_aware_fairness_leaves_priority_first() -> None:
    h = one_at_a_time(fairness="program-aware")
    h.queue.completed("heavy", 50_000, 0)
    order: list[str] = []

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        h.submit(tg, doc("light-low", 1), Identity(0, "light"))
        h.submit(tg, doc("heavy-high", 2), Identity(3, "heavy"))
        await settle()
        order.extend(await release_one_by_one(h, 2))

    await run(h, steps)
    assert order == ["heavy-high", "light-low"]


# --- per-priority dispatch ceilings ----------------------------------------------------------------------


def test_priority_holdback_spreads_ceilings_by_rank_or_by_value() -> None:
    by_rank = CeilingConfig(policy="priority-holdback", min_ceiling=0.4, max_ceiling=0.9)
    assert holdback_ceilings([10, 5, 0], by_rank) == pytest.approx([0.9, 0.65, 0.4])
    assert holdback_ceilings([7], by_rank) == [0.9]  # a band alone: the highest ceiling
    by_value = CeilingConfig(policy="priority-holdback", min_ceiling=0.0, max_ceiling=1.0, domain="value")
    assert holdback_ceilings([10, 8, 0], by_value) == pytest.approx([1.0, 0.8, 0.0])
    assert holdback_ceilings([3, 3], by_value) == [1.0, 1.0]


def test_soft_reflective_ceilings_open_below_the_reflection_and_alternate_past_it() -> None:
    # two bands: the lower one's reflective ceiling is 1 - saturation
    assert reflective_ceilings(0.3, 2, open_tick=False) == [1.0, 1.0]  # 0.3 < 0.7: open
    assert reflective_ceilings(0.6, 2, open_tick=False) == [1.0, 0.0]  # 0.6 >= 0.4: past it, closed
    assert reflective_ceilings(0.6, 2, open_tick=True) == [1.0, 1.0]
    assert reflective_ceilings(1.0, 3, open_tick=True) == [1.0, 0.0, 0.0]  # full: all but the highest shut
    assert reflective_ceilings(0.4, 3, open_tick=False) == [1.0, 1.0, 1.0]  # 0.4 < 0.8, 0.4 < 0.6
    assert reflective_ceilings(0.9, 1, open_tick=False) == [1.0]  # one band: always open
    # at 0.75 a gated band is open on one pass in round(0.75 / 0.25) = 3
    soft = Ceilings(CeilingConfig(policy="soft-reflective"))
    lows = [soft.compute(0.75, [5, 0])[0] for _ in range(6)]
    assert lows == [0.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    assert [soft.compute(0.2, [5, 0])[0] for _ in range(3)] == [1.0, 1.0, 1.0]  # below it: open always


def two_endpoints_of_four(**overrides: object) -> Harness:
    """e1 and e2, each with room for 4 requests before their first token; both full to start with."""
    config = flow_config(headroom=HeadroomConfig(max_prefill_requests=4), **overrides)
    h = Harness(config)
    prefilling(h, "e1", 4)
    prefilling(h, "e2", 4)
    return h


def prefilling(h: Harness, name: str, requests: int) -> None:
    """``requests`` of the router's documents before their first token on ``name``."""
    h.pool.set(name, prefilling=requests, queued_prefill_tokens=requests * doc("x", 0).prompt_tokens)


HOLDBACK = CeilingConfig(policy="priority-holdback", min_ceiling=0.5, max_ceiling=1.0)


async def test_a_lower_band_is_held_at_its_ceiling_while_a_higher_band_waits() -> None:
    """Bands 5 and 0 wait; e2 frees 3 of its 4 places (the pool's room 5/8 in use). Band 5 (ceiling 1.0)
    takes a place (6/8 = 0.75); band 0's ceiling is 0.5: it stays queued although e2 still has room. Once
    no higher band waits, band 0 is alone and gets the highest ceiling: it goes."""
    h = two_endpoints_of_four(ceilings=HOLDBACK)

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        h.submit(tg, doc("low", 1), Identity(0, "batch"))
        h.submit(tg, doc("high", 2), Identity(5, "chat"))
        await settle()
        prefilling(h, "e2", 1)
        h.queue.release_pass()
        await settle()
        assert set(h.results) == {"high"} and h.endpoint("high") == "e2"
        assert h.queue.depth == 1
        prefilling(h, "e2", 2)  # the high request is dispatched: the pool counts it
        h.queue.release_pass()
        await settle()
        assert set(h.results) == {"high", "low"} and h.endpoint("low") == "e2"

    await run(h, steps)


async def test_without_ceilings_both_bands_take_the_room_in_one_pass() -> None:
    h = two_endpoints_of_four()

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        h.submit(tg, doc("low", 1), Identity(0, "batch"))
        h.submit(tg, doc("high", 2), Identity(5, "chat"))
        await settle()
        prefilling(h, "e2", 1)
        h.queue.release_pass()
        await settle()
        assert set(h.results) == {"high", "low"}

    await run(h, steps)


async def test_a_band_held_by_its_ceiling_holds_every_lower_band() -> None:
    """Three bands; holdback by rank from 1.0 to 0.2: ceilings 1.0, 0.6 and 0.2. With 0.875 of the room in
    use once the top band took its place, the middle band is held, and so is the lowest (the pass stops at
    the first band held). With the pool empty both go."""
    h = two_endpoints_of_four(ceilings=CeilingConfig(policy="priority-holdback", min_ceiling=0.2))

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        h.submit(tg, doc("top", 1), Identity(9, "a"))
        h.submit(tg, doc("middle", 2), Identity(5, "b"))
        h.submit(tg, doc("bottom", 3), Identity(1, "c"))
        await settle()
        prefilling(h, "e2", 2)  # 6/8 in use
        h.queue.release_pass()
        await settle()
        assert set(h.results) == {"top"}
        h.pool.room("e1", "e2")  # the pool empties: 1/8 in use once each goes
        h.queue.release_pass()
        await settle()
        assert set(h.results) == {"top", "middle", "bottom"}

    await run(h, steps)


async def test_soft_reflective_ceilings_let_the_lower_band_through_one_pass_in_period() -> None:
    """A steady higher band (a new request before each pass) and one lower request, with 0.75 of the
    pool's room in use at each pass's start (e1 full, e2 half): the lower band is past its reflective
    ceiling (1 - 0.75) and is opened on one pass in round(0.75 / 0.25) = 3; the higher band goes every
    pass."""
    h = two_endpoints_of_four(ceilings=CeilingConfig(policy="soft-reflective"))
    released_on: list[int] = []

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        h.submit(tg, doc("low", 2), Identity(0, "batch"))
        for n in range(1, 5):
            h.submit(tg, doc(f"high{n}", 10 + n), Identity(5, "chat"))
            await settle()
            prefilling(h, "e2", 2)  # what was released went, and finished its prefill
            h.queue.release_pass()
            await settle()
            assert f"high{n}" in h.results
            if "low" in h.results and not released_on:
                released_on.append(n)

    await run(h, steps)
    assert released_on == [3], released_on
