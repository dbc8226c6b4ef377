"""A Zipf law over a finite set of items: item ``k`` (0-based rank) is drawn with weight ``1 / (k+1)^s``."""

from __future__ import annotations

import bisect
import itertools
import random


class ZipfSampler:
    """Draws ranks ``0 … n−1`` with probability proportional to ``1 / (rank+1)^exponent``.

    Exact (inverse of the cumulative weights by bisection), so a seeded RNG gives the same draws on
    every platform; an exponent of 0 is the uniform law.
    """

    def __init__(self, n: int, exponent: float) -> None:
        if n < 1:
            raise ValueError(f"a Zipf law needs n >= 1 items, got {n}")
        if exponent < 0:
            raise ValueError(f"the Zipf exponent must be >= 0, got {exponent}")
        weights = [1.0 / (rank + 1) ** exponent for rank in range(n)]
        total = sum(weights)
        self.n = n
        self.exponent = exponent
        self.probabilities = tuple(w / total for w in weights)
        self._cumulative = list(itertools.accumulate(self.probabilities))
        self._cumulative[-1] = 1.0  # no rounding gap past the last item

    def sample(self, rng: random.Random) -> int:
        """One rank, using one ``rng.random()`` draw."""
        return min(bisect.bisect_right(self._cumulative, rng.random()), self.n - 1)
