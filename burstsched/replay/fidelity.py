"""Where a replay differs from the recorded pool, request by request.

The recorded-placement replay sends each request to the replica standing for the endpoint it was recorded
on, so its TTFTs compare with the recorded ones one for one. They are split into four kinds of request by
what the recorded pool saw: warm (the replica had at least half of the prompt cached) or cold, and whether
the endpoint was already serving other requests when it arrived (from the recorded arrival and end times).
Each kind gets the recorded and replayed medians and 90th percentiles and the median of the per-request
ratio replayed / recorded: a kind far from 1 is where the simulator's costs miss the recorded replicas
(lone requests: the fitted prefill and front-end costs; busy endpoints: the slowdown under concurrent work).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from burstsched.replay.calibrate import in_flight_at_arrival
from burstsched.replay.trace import TracedRequest
from burstsched.workloads.stats import percentile

WARM_SHARE = 0.5
"""A request counts as warm when at least this share of its prompt was cached on the recorded replica."""


@dataclass(frozen=True, slots=True)
class FidelityRow:
    kind: str
    requests: int
    recorded_p50_ms: float
    recorded_p90_ms: float
    replayed_p50_ms: float
    replayed_p90_ms: float
    ratio_median: float
    """The median over the kind's requests of replayed / recorded TTFT."""


def fidelity_rows(
    requests: Sequence[TracedRequest], replayed_ms: Sequence[float | None]
) -> list[FidelityRow]:
    """One row per kind of request that has any (and one for all), over the requests with both TTFTs."""
    if len(replayed_ms) != len(requests):
        raise ValueError("one replayed TTFT (or None) per recorded request")
    busy = in_flight_at_arrival(requests) > 0
    kinds: dict[str, list[tuple[float, float]]] = {}
    for request, replayed, was_busy in zip(requests, replayed_ms, busy, strict=True):
        if request.ttft_ms is None or replayed is None or request.outcome != "ok":
            continue
        warm = (request.cached_tokens or 0) >= WARM_SHARE * (request.input_tokens or request.prompt_tokens)
        kind = f"{'warm' if warm else 'cold'}, endpoint {'busy' if was_busy else 'idle'}"
        for key in (kind, "all"):
            kinds.setdefault(key, []).append((request.ttft_ms, replayed))
    order = [f"{w}, endpoint {b}" for w in ("warm", "cold") for b in ("idle", "busy")] + ["all"]
    return [_row(kind, kinds[kind]) for kind in order if kind in kinds]


def _row(kind: str, pairs: list[tuple[float, float]]) -> FidelityRow:
    recorded = [r for r, _ in pairs]
    replayed = [p for _, p in pairs]
    ratios = [p / r for r, p in pairs if r > 0]
    return FidelityRow(
        kind=kind,
        requests=len(pairs),
        recorded_p50_ms=percentile(recorded, 50),
        recorded_p90_ms=percentile(recorded, 90),
        replayed_p50_ms=percentile(replayed, 50),
        replayed_p90_ms=percentile(replayed, 90),
        ratio_median=float(np.median(ratios)) if ratios else float("nan"),
    )


HEADER = ("request kind", "n", "recorded p50 / p90", "replayed p50 / p90", "replayed / recorded (median)")


def fidelity_table(rows: Sequence[FidelityRow]) -> list[tuple[str, ...]]:
    """The rows as strings, in :data:`HEADER`'s columns."""
    return [
        (
            r.kind,
            str(r.requests),
            f"{r.recorded_p50_ms:.0f} / {r.recorded_p90_ms:.0f} ms",
            f"{r.replayed_p50_ms:.0f} / {r.replayed_p90_ms:.0f} ms",
            f"{r.ratio_median:.2f}",
        )
        for r in rows
    ]
