"""Small statistics used by the reports."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) with linear interpolation between ranks (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``, NaN when the denominator is zero."""
    return numerator / denominator if denominator else math.nan


def mostly_cold(prompt_tokens: int | None, cached_tokens: int) -> bool:
    """Whether a request computed more than half its prompt (``cached_tokens`` of it served from cache)."""
    return prompt_tokens is not None and cached_tokens * 2 < prompt_tokens
