"""The context-cost bench's fits (loadtests/context_cost.py), on bursts drawn from known coefficients."""

from __future__ import annotations

import pytest

from loadtests.context_cost import Burst, fit


def _bursts(base: float, per_token: float, per_pair: float) -> list[Burst]:
    bursts = []
    for cached in (2300, 7200):
        for new in (40, 230, 1500):
            for size in (1, 2, 4, 8):
                one = per_token * new + per_pair * new * (cached + new / 2)
                ttfts = tuple(base + k * one for k in range(1, size + 1))
                bursts.append(Burst(0, 0, size, cached + new, cached, ttfts))
    return bursts


def test_the_context_fit_recovers_the_coefficients_and_beats_tokens_alone() -> None:
    bursts = _bursts(0.05, 4.2e-5, 2.4e-8)
    with_context = fit(bursts, with_context=True)
    assert with_context.coefficients["base_s"] == pytest.approx(0.05, rel=1e-6)
    assert with_context.coefficients["per_token_s"] == pytest.approx(4.2e-5, rel=1e-6)
    assert with_context.coefficients["per_pair_s"] == pytest.approx(2.4e-8, rel=1e-6)
    assert with_context.error_p90 < 1e-6
    tokens_only = fit(bursts, with_context=False)
    assert set(tokens_only.coefficients) == {"base_s", "per_token_s"}
    assert tokens_only.error_p50 > 0.05  # a long context's cost is not in the tokens alone


def test_without_a_context_cost_both_fits_agree() -> None:
    bursts = _bursts(0.03, 5e-5, 0.0)
    assert fit(bursts, with_context=False).coefficients["per_token_s"] == pytest.approx(5e-5, rel=1e-6)
    assert fit(bursts, with_context=True).coefficients["per_pair_s"] == pytest.approx(0.0, abs=1e-15)
