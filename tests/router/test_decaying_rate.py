"""An amount per second over the recent past (burstsched/pool/decaying_rate.py)."""

from __future__ import annotations

import math

import pytest

from burstsched.pool.decaying_rate import DecayingRate


def test_a_steady_flow_reads_its_rate_and_a_stopped_one_fades() -> None:
    rate = DecayingRate(4.0)
    assert rate.rate(0.0) == 0.0
    t = 0.0
    for _ in range(400):  # 30 per 0.1 s: 300 per second, for 10 time constants
        t += 0.1
        rate.add(30.0, t)
    assert rate.rate(t) == pytest.approx(300.0, rel=0.02)
    assert rate.rate(t + 4.0) == pytest.approx(300.0 / math.e, rel=0.02)
    assert rate.rate(t + 40.0) < 0.02


def test_a_new_rate_reads_low_for_about_a_time_constant() -> None:
    rate = DecayingRate(10.0)
    for step in range(1, 101):  # 100 per second for one time constant
        rate.add(10.0, step * 0.1)
    assert rate.rate(10.0) == pytest.approx(100.0 * (1 - 1 / math.e), rel=0.05)


def test_an_add_stamped_before_the_last_counts_at_the_last() -> None:
    rate = DecayingRate(1.0)
    rate.add(1.0, 5.0)
    rate.add(1.0, 4.0)
    assert rate.rate(5.0) == pytest.approx(2.0)


def test_the_time_constant_must_be_positive() -> None:
    with pytest.raises(ValueError, match="time_constant_s"):
        DecayingRate(0.0)
