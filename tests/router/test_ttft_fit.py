"""Each endpoint's time to first token, fitted online: the fit, the pool's counts it is fitted on, the cost
scorer that prices by it, and the predicted TTFT a stream's response carries."""

from __future__ import annotations

import dataclasses
import random

import httpx
import pytest
from burstsched_plugins.cost_scorer import CostParameters, CostScorer

from burstsched.config import EndpointConfig, PoolConfig
from burstsched.dispatch import HttpxUpstream, getter
from burstsched.framework import (
    ApiKind,
    CycleState,
    EndpointSnapshot,
    PluginContext,
    SchedRequest,
    TtftEstimate,
)
from burstsched.pool import EndpointPool
from burstsched.pool.ttft_fit import TtftFit


def _draw(fit: TtftFit, rng: random.Random, n: int, truth: TtftEstimate, noise_s: float = 0.0) -> None:
    for _ in range(n):
        tokens = rng.choice([rng.uniform(0, 200), rng.uniform(1500, 9000)])  # warm tails and cold prompts
        concurrent = rng.randrange(0, 6)
        fit.observe(tokens, concurrent, truth.predict(tokens, concurrent) + rng.gauss(0.0, noise_s))


def test_the_fit_recovers_a_replicas_coefficients() -> None:
    truth = TtftEstimate(0.03, 1 / 5000, 1 / 20000, 0)
    fit = TtftFit(min_samples=20)
    _draw(fit, random.Random(1), 19, truth)
    assert fit.estimate() is None  # too few streams yet
    _draw(fit, random.Random(2), 200, truth)
    estimate = fit.estimate()
    assert estimate is not None and estimate.samples == 219
    assert estimate.base_s == pytest.approx(0.03, rel=0.01)
    assert estimate.per_token_s == pytest.approx(1 / 5000, rel=0.01)
    assert estimate.per_token_per_seq_s == pytest.approx(1 / 20000, rel=0.01)


def test_the_fit_follows_a_replica_that_slows_down() -> None:
    fit = TtftFit()
    rng = random.Random(3)
    _draw(fit, rng, 300, TtftEstimate(0.02, 1 / 8000, 0.0, 0), noise_s=0.005)
    slower = TtftEstimate(0.02, 1 / 2000, 0.0, 0)  # a neighbour now shares its CPU
    _draw(fit, rng, 300, slower, noise_s=0.005)
    estimate = fit.estimate()
    assert estimate is not None
    for tokens, concurrent in ((100, 0), (3000, 2), (8000, 5)):
        assert estimate.predict(tokens, concurrent) == pytest.approx(
            slower.predict(tokens, concurrent), rel=0.1
        )


def test_no_estimate_while_the_slope_is_not_positive() -> None:
    fit = TtftFit(min_samples=5)
    for tokens in (100, 2000, 4000, 6000, 8000, 9000, 9500):
        fit.observe(tokens, 0, 1.0 - tokens / 10000)  # longer prompts faster: nonsense, so withheld
    assert fit.estimate() is None
    fit.observe(-1, 0, 0.5)  # impossible readings are ignored
    fit.observe(10, 0, -0.5)
    assert fit.samples == 7


def test_a_fit_never_prices_a_busier_replica_cheaper() -> None:
    """Streams that read faster the more requests were in flight (as a replica whose queue the router's
    counts overstate shows) fit a negative slowdown and a negative base; the estimate reports both as 0, so
    its price per token never falls as requests are sent there (a falling price drew every request to one
    of 8 simulated replicas)."""
    fit = TtftFit(min_samples=20)
    rng = random.Random(5)
    for _ in range(200):
        tokens, concurrent = rng.uniform(1000, 9000), rng.randrange(0, 6)
        fit.observe(tokens, concurrent, -0.05 + tokens * (1 / 4000 - concurrent / 40000))
    estimate = fit.estimate()
    assert estimate is not None
    assert estimate.base_s == 0.0 and estimate.per_token_per_seq_s == 0.0
    assert estimate.per_token_s == pytest.approx(1 / 4000, rel=0.05)  # the slope itself is kept
    assert [estimate.per_token(c) for c in range(6)] == [estimate.per_token_s] * 6


def test_an_estimate_never_predicts_below_zero() -> None:
    estimate = TtftEstimate(-0.5, 1 / 1000, -1.0, 30)
    assert estimate.per_token(3) == 0.0 and estimate.predict(100, 3) == 0.0
    assert estimate.predict(2000, 0) == pytest.approx(1.5)


@pytest.mark.anyio
async def test_the_pool_fits_each_endpoint_on_its_own_streams() -> None:
    fetch = getter(HttpxUpstream(httpx.MockTransport(lambda _: httpx.Response(200, json={}))))
    endpoints = [EndpointConfig(url="http://a:1", name="a"), EndpointConfig(url="http://b:1", name="b")]
    pool = EndpointPool(endpoints, PoolConfig(), fetch, clock=lambda: 0.0)
    pool.acquire("a", 3000)
    pool.acquire("a", 200)
    assert pool.load("a") == (3200, 2) and pool.load("b") == (0, 0)
    rng = random.Random(4)
    truth = TtftEstimate(0.05, 1 / 4000, 1 / 40000, 0)
    for _ in range(40):
        tokens, concurrent = rng.uniform(0, 8000), rng.randrange(4)
        pool.observe_ttft("a", int(tokens), concurrent, truth.predict(int(tokens), concurrent))
    fitted = pool.snapshot("a").ttft
    assert fitted is not None and fitted.samples == 40
    assert fitted.predict(5000, 2) == pytest.approx(truth.predict(5000, 2), rel=0.02)
    assert pool.snapshot("b").ttft is None


def _request(prompt_tokens: int) -> SchedRequest:
    return SchedRequest(request_id="r", model="m", api=ApiKind.CHAT, prompt_tokens=prompt_tokens)


def test_the_cost_scorer_prices_by_the_learned_fit() -> None:
    """Two idle replicas with the same metrics-learned speed; the fits say b is 3x slower per token and
    slows with load. A cold prompt goes to a; with ``learned`` off they tie."""
    fast = TtftEstimate(0.02, 1 / 6000, 0.0, 50)
    slow = TtftEstimate(0.02, 1 / 2000, 1 / 10000, 50)
    endpoints = [
        EndpointSnapshot(name="a", url="http://a", prefill_tokens_per_s=4000.0, ttft=fast),
        EndpointSnapshot(name="b", url="http://b", prefill_tokens_per_s=4000.0, ttft=slow, in_flight=1),
    ]
    context = PluginContext(rng=random.Random(0))
    learned = CostScorer("cost", CostParameters(learned=True), context)
    costs = learned.costs(_request(3000), endpoints, CycleState())
    assert costs["a"] == pytest.approx(0.02 + 2 * 3000 / 6000)
    assert costs["b"] == pytest.approx(0.02 + 2 * 3000 * (1 / 2000 + 1 / 10000))
    scores = learned.score(_request(3000), endpoints, CycleState())
    assert scores["a"] == 1.0 and scores["b"] < 0.5
    parametric = CostScorer("cost", CostParameters(learned=False), context)
    assert parametric.score(_request(3000), endpoints, CycleState()) == {"a": 1.0, "b": 1.0}


def test_metrics_show_each_endpoints_fit() -> None:
    from burstsched.telemetry.metrics import RouterMetrics

    metrics = RouterMetrics()
    fitted = EndpointSnapshot(name="a", url="http://a", ttft=TtftEstimate(0.025, 0.0002, 0.00001, 42))
    metrics.watch_endpoints(lambda: [fitted, EndpointSnapshot(name="b", url="http://b")])
    page = metrics.render().decode()
    assert 'burstsched_endpoint_ttft_model{coefficient="base_seconds",endpoint="a"} 0.025' in page
    assert 'burstsched_endpoint_ttft_model{coefficient="seconds_per_token",endpoint="a"} 0.0002' in page
    assert 'burstsched_endpoint_ttft_model{coefficient="samples",endpoint="a"} 42.0' in page
    assert 'endpoint="b"' not in "\n".join(line for line in page.splitlines() if "ttft_model{" in line)


def test_fits_price_only_when_every_candidate_has_one() -> None:
    """One replica fitted (and fast by its fit), the other not yet: both are priced by the parameters, as
    with ``learned`` off, so a fit is never weighed against the parameters' guess for another replica."""
    fast = TtftEstimate(0.0, 1 / 60000, 0.0, 50)
    endpoints = [
        EndpointSnapshot(name="a", url="http://a", prefill_tokens_per_s=4000.0, ttft=fast),
        EndpointSnapshot(name="b", url="http://b", prefill_tokens_per_s=4000.0),
    ]
    context = PluginContext(rng=random.Random(0))
    learned = CostScorer("cost", CostParameters(learned=True), context)
    parametric = CostScorer("cost", CostParameters(learned=False), context)
    costs = learned.costs(_request(3000), endpoints, CycleState())
    assert costs == parametric.costs(_request(3000), endpoints, CycleState())
    assert costs["a"] == pytest.approx(costs["b"])
    both = [endpoints[0], dataclasses.replace(endpoints[1], ttft=fast)]
    assert learned.costs(_request(3000), both, CycleState())["a"] == pytest.approx(2 * 3000 / 60000)
