"""The rendezvous scorer: new prefixes placed alike by independent routers; spread; bounded; warm alone."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from burstsched_plugins.rendezvous import RendezvousParameters, RendezvousScorer

from burstsched.config import load_config
from burstsched.framework import (
    ApiKind,
    CycleState,
    EndpointSnapshot,
    PluginContext,
    PluginRegistry,
    PrefixMatch,
    SchedRequest,
)
from burstsched.scheduling import Scheduler, build_scheduler

REPO = Path(__file__).resolve().parents[2]
NAMES = ("vllm-0", "vllm-1", "vllm-2", "vllm-3")
CHI2_DF3_P001 = 16.27  # chi-square critical value, 3 degrees of freedom, p = 0.001


def _scorer(seed: int = 0, **params: float) -> RendezvousScorer:
    return RendezvousScorer(
        "rendezvous", RendezvousParameters.model_validate(params), PluginContext(rng=random.Random(seed))
    )


def _ep(name: str, **fields: object) -> EndpointSnapshot:
    return EndpointSnapshot(name, f"http://{name}", metrics_age=0.0, **fields)  # type: ignore[arg-type]


def _pool(names: Sequence[str] = NAMES, **fields: object) -> list[EndpointSnapshot]:
    return [_ep(name, **fields) for name in names]


def _request(chain: Sequence[int], *, block_tokens: int = 64, group_size: int = 1) -> SchedRequest:
    return SchedRequest(
        "r",
        "m",
        ApiKind.CHAT,
        block_hashes=tuple(chain),
        block_tokens=block_tokens,
        prompt_tokens=block_tokens * len(chain),
        group_size=group_size,
    )


def _prefixes(count: int, seed: int = 1, blocks: int = 8) -> list[tuple[int, ...]]:
    """``count`` distinct chains (random 64-bit block hashes)."""
    rng = random.Random(seed)
    return [tuple(rng.getrandbits(64) for _ in range(blocks)) for _ in range(count)]


def _scheduler(config: str, seed: int) -> Scheduler:
    return build_scheduler(
        load_config(REPO / "config" / config),
        PluginRegistry.discover(),
        PluginContext(rng=random.Random(seed)),
    )


def _chosen(scorer: RendezvousScorer, request: SchedRequest, endpoints: Sequence[EndpointSnapshot]) -> str:
    scores = scorer.score(request, endpoints, CycleState())
    best = [name for name, value in scores.items() if value == 1.0]
    assert len(best) == 1 and sum(scores.values()) == 1.0
    return best[0]


# -- the same prefix, the same endpoint, from independent routers ----------------------------------------
@pytest.mark.parametrize("config", ["rendezvous.yaml", "rendezvous-cost.yaml"])
def test_two_independently_built_routers_send_each_new_prefix_to_the_same_endpoint(config: str) -> None:
    router_a, router_b = _scheduler(config, seed=1), _scheduler(config, seed=2)
    # Each router sees its own in-flight counts (under the cap): they disagree on load, not on placement.
    view_a = [_ep(n, in_flight=i % 3) for i, n in enumerate(NAMES)]
    view_b = [_ep(n, in_flight=(i + 1) % 3) for i, n in enumerate(NAMES)]
    picks: Counter[str] = Counter()
    for chain in _prefixes(200):
        request = _request(chain)
        a = router_a.schedule(request, view_a).endpoint.name
        b = router_b.schedule(request, view_b).endpoint.name
        assert a == b
        picks[a] += 1
    assert set(picks) == set(NAMES)  # and they are not all the same endpoint


def test_without_rendezvous_the_same_routers_disagree() -> None:
    """The baseline the scorer fixes: default.yaml's tie-break and router-local loads split new prefixes."""
    router_a, router_b = _scheduler("default.yaml", seed=1), _scheduler("default.yaml", seed=2)
    view = _pool()
    disagree = sum(
        router_a.schedule(_request(c), view).endpoint.name
        != router_b.schedule(_request(c), view).endpoint.name
        for c in _prefixes(200)
    )
    assert disagree > 50


def test_a_burst_split_over_two_routers_lands_on_one_endpoint() -> None:
    """Router A has placed (and indexed) the prefix; router B has not: A follows its index, B the hash."""
    router_a, router_b = _scheduler("rendezvous.yaml", seed=1), _scheduler("rendezvous.yaml", seed=2)
    view = _pool()
    for chain in _prefixes(50):
        request = _request(chain, group_size=4)
        first = router_a.schedule(request, view)
        router_a.on_dispatch(request, first.endpoint)
        again = router_a.schedule(_request(chain), view)
        assert again.prefix is not None and again.prefix.matched_blocks == len(chain)  # warm at A
        assert again.endpoint.name == first.endpoint.name
        assert router_b.schedule(request, view).endpoint.name == first.endpoint.name  # cold at B


def test_the_key_is_the_chain_hash_covering_the_leading_tokens() -> None:
    scorer = _scorer(lead_tokens=256)
    chain = tuple(range(100, 110))
    assert scorer.key(_request(chain)) == chain[3]  # 256 tokens = 4 blocks of 64
    assert scorer.key(_request(chain, block_tokens=16)) == chain[9]  # 16 blocks wanted, 10 there: the last
    assert scorer.key(_request(chain[:2])) == chain[1]
    assert scorer.key(_request(())) is None
    # Prompts sharing the leading blocks share the endpoint, whatever follows.
    other = (*chain[:4], 7, 8, 9)
    assert _chosen(scorer, _request(chain), _pool()) == _chosen(scorer, _request(other), _pool())


# -- spread ----------------------------------------------------------------------------------------------
def test_distinct_prefixes_spread_uniformly() -> None:
    scorer = _scorer()
    count = 2000
    counts = Counter(_chosen(scorer, _request(chain), _pool()) for chain in _prefixes(count))
    expected = count / len(NAMES)
    chi2 = sum((counts[name] - expected) ** 2 / expected for name in NAMES)
    assert chi2 < CHI2_DF3_P001, counts


def test_a_prompt_shorter_than_a_block_has_no_key_and_no_say() -> None:
    scores = _scorer().score(_request(()), _pool(), CycleState())
    assert set(scores) == set(NAMES) and set(scores.values()) == {0.0}


# -- bounded loads ---------------------------------------------------------------------------------------
def test_bounded_load_moves_a_prefix_off_an_overloaded_endpoint_and_only_then() -> None:
    scorer = _scorer(load_factor=1.25, min_cap=4)
    chain = _prefixes(1)[0]
    key = scorer.key(_request(chain))
    assert key is not None
    first, second = scorer.ranking(key, NAMES)[:2]

    def pool_with(load: int) -> list[EndpointSnapshot]:
        return [_ep(n, running=load if n == first else 10) for n in NAMES]

    # Others at 10: the mean with this request is (30 + load + 1) / 4 and the cap 1.25 x that.
    # load 15: cap 1.25 x 46/4 = 14.4 -> over; load 14: cap 1.25 x 45/4 = 14.06 -> under.
    assert _chosen(scorer, _request(chain), pool_with(14)) == first
    assert _chosen(scorer, _request(chain), pool_with(15)) == second
    # The cap's floor: an endpoint below min_cap is never over it, however uneven the pool.
    idle = [_ep(n, running=3 if n == first else 0) for n in NAMES]
    assert _chosen(scorer, _request(chain), idle) == first
    idle[NAMES.index(first)] = _ep(first, running=4)
    assert _chosen(scorer, _request(chain), idle) == second


def test_load_is_the_scrape_raised_to_the_routers_own_counts_and_stale_metrics_use_those_alone() -> None:
    scorer = _scorer()
    fresh = [
        _ep("a", waiting=3, running=4, in_flight=2, pending=1),
        _ep("b", waiting=0, running=1, in_flight=5, pending=0),
    ]
    assert scorer.loads(fresh) == {"a": 8, "b": 5}
    stale = [fresh[0], dataclasses.replace(fresh[1], stale=True)]
    assert scorer.loads(stale) == {"a": 3, "b": 5}


def test_the_groups_own_size_counts_in_the_mean() -> None:
    scorer = _scorer(load_factor=1.25, min_cap=1)
    assert scorer.cap({"a": 0, "b": 0}, 8) == pytest.approx(5.0)
    assert scorer.cap({"a": 0, "b": 0}, 1) == pytest.approx(1.0)  # the floor


def test_unhealthy_endpoints_are_skipped_unless_all_are() -> None:
    scorer = _scorer()
    for chain in _prefixes(40):
        request = _request(chain)
        key = scorer.key(request)
        assert key is not None
        top = scorer.ranking(key, NAMES)[0]
        pool = [_ep(n, healthy=n != top) for n in NAMES]
        assert _chosen(scorer, request, pool) == scorer.ranking(key, [n for n in NAMES if n != top])[0]
        assert _chosen(scorer, request, _pool(healthy=False)) == top


# -- the rendezvous property -----------------------------------------------------------------------------
def test_removing_an_endpoint_moves_only_the_prefixes_that_were_on_it() -> None:
    scorer = _scorer()
    names = (*NAMES, "vllm-4")
    chains = _prefixes(2000)
    before = {c: _chosen(scorer, _request(c), _pool(names)) for c in chains}
    gone = "vllm-2"
    after = {c: _chosen(scorer, _request(c), _pool([n for n in names if n != gone])) for c in chains}
    moved = {c for c in chains if before[c] != after[c]}
    assert moved == {c for c in chains if before[c] == gone}
    assert 300 < len(moved) < 500  # about a fifth
    # And they spread over the survivors instead of piling onto one.
    assert len({after[c] for c in moved}) == len(names) - 1


# -- warm requests ---------------------------------------------------------------------------------------
def test_a_request_warm_somewhere_scores_zero_everywhere() -> None:
    scorer = _scorer(lead_tokens=256)
    request = _request(tuple(range(10)))
    state = CycleState()
    state.put("vllm-1", PrefixMatch(4, 10, 64))  # holds the first 256 tokens: the key
    assert set(scorer.score(request, _pool(), state).values()) == {0.0}
    partial = CycleState()
    partial.put("vllm-1", PrefixMatch(3, 10, 64))  # 192 tokens: the key is still new
    assert sum(scorer.score(request, _pool(), partial).values()) == 1.0
    # Precise matches count in the engine's tokens: 16 blocks of 16 hold the key, 15 do not.
    precise = CycleState()
    precise.put("vllm-2", PrefixMatch(16, 200, 16, source="precise"))
    assert set(scorer.score(request, _pool(), precise).values()) == {0.0}
    precise.put("vllm-2", PrefixMatch(15, 200, 16, source="precise"))
    assert sum(scorer.score(request, _pool(), precise).values()) == 1.0
    # A prompt shorter than lead_tokens is warm where all its blocks are held.
    short = _request((1, 2))
    held = CycleState()
    held.put("vllm-0", PrefixMatch(2, 2, 64))
    assert set(scorer.score(short, _pool(), held).values()) == {0.0}


@pytest.mark.parametrize(("with_rendezvous", "without"), [("rendezvous.yaml", "default.yaml")])
def test_warm_placement_is_what_the_config_without_rendezvous_decides(
    with_rendezvous: str, without: str
) -> None:
    on, off = _scheduler(with_rendezvous, seed=5), _scheduler(without, seed=5)
    rng = random.Random(3)
    for chain in _prefixes(60):
        warm_on = NAMES[rng.randrange(len(NAMES))]
        saturated = next(n for n in NAMES if n != warm_on)
        pools = [
            _pool(),
            [_ep(n, waiting=i, kv_usage=0.1 * i) for i, n in enumerate(NAMES)],
            [_ep(n, waiting=20 if n == saturated else 0) for n in NAMES],
        ]
        request = _request(chain)
        for scheduler in (on, off):
            scheduler.on_dispatch(request, _ep(warm_on))
        for view in pools:
            got_on, got_off = on.schedule(request, view), off.schedule(request, view)
            assert [s.name for s in got_on.ranked] == [s.name for s in got_off.ranked]
            assert all(s.scores["rendezvous-scorer"] == 0.0 for s in got_on.ranked)
            assert [s.total for s in got_on.ranked] == [s.total for s in got_off.ranked]


def test_a_saturated_warm_replica_spills_its_prefix_where_every_router_would() -> None:
    """The saturation filter drops the only replica holding the prefix: among the rest it is new, so the
    spill goes to the rendezvous choice, the same from every router."""
    router_a, router_b = _scheduler("rendezvous.yaml", seed=1), _scheduler("rendezvous.yaml", seed=2)
    scorer = _scorer()
    for chain in _prefixes(40):
        request = _request(chain)
        first = router_a.schedule(request, _pool()).endpoint.name
        router_a.on_dispatch(request, _ep(first))
        busy = [_ep(n, waiting=20 if n == first else 0) for n in NAMES]
        key = scorer.key(request)
        assert key is not None
        expected = scorer.ranking(key, [n for n in NAMES if n != first])[0]
        assert router_a.schedule(request, busy).endpoint.name == expected
        assert router_b.schedule(request, busy).endpoint.name == expected


def test_with_the_cost_scorer_new_prefixes_follow_the_hash_and_warm_ones_the_cost() -> None:
    scheduler = _scheduler("rendezvous-cost.yaml", seed=0)
    scorer = _scorer()
    chain = _prefixes(1)[0]
    request = _request(chain)
    key = scorer.key(request)
    assert key is not None
    top = scorer.ranking(key, NAMES)[0]
    # Cold: the hash's choice, even where the cost model finds it dearer (prefill queued there).
    view = [_ep(n, queued_prefill_tokens=4000 if n == top else 0) for n in NAMES]
    assert scheduler.schedule(request, view).endpoint.name == top
    # Warm elsewhere: the cost decides, the rendezvous scorer has no say.
    other = next(n for n in NAMES if n != top)
    scheduler.on_dispatch(request, _ep(other))
    decision = scheduler.schedule(request, view)
    assert decision.endpoint.name == other
    assert all(s.scores["rendezvous-scorer"] == 0.0 for s in decision.ranked)
