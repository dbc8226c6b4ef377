"""An amount per second over the recent past, weighted exponentially by age (pure; time given).

Each amount added at time ``t`` counts ``exp(-(now - t) / time_constant_s) / time_constant_s`` towards the
rate at ``now``: a steady flow of ``r`` per second reads ``r`` once it has run a few time constants, and a
flow that stopped fades to zero with the same time constant. Starting from nothing, it reads low for about
one time constant (it has seen only that much of the flow).
"""

from __future__ import annotations

import math


class DecayingRate:
    """Amount per second, exponentially weighted with time constant ``time_constant_s``."""

    __slots__ = ("_at", "_tau", "_value")

    def __init__(self, time_constant_s: float) -> None:
        if time_constant_s <= 0:
            raise ValueError("time_constant_s must be > 0")
        self._tau = time_constant_s
        self._value = 0.0
        self._at = -math.inf

    def add(self, amount: float, now: float) -> None:
        """Count ``amount`` at ``now`` (times are the caller's clock; one earlier than the last add counts
        as the last add's time)."""
        self._value = self.rate(now) + amount / self._tau
        self._at = max(self._at, now)

    def rate(self, now: float) -> float:
        """The rate at ``now``, per second."""
        if self._value == 0.0:
            return 0.0
        age = max(0.0, now - self._at)
        return self._value * math.exp(-age / self._tau)
