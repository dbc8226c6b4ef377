"""Fit the simulator's cost model to a trace: the recorded replicas' own speed, from their latencies.

A replayed TTFT is only comparable with the recorded one if the simulated replicas compute prompts as fast as
the recorded ones did, and a trace may come from any hardware and model. Two fits, in this order:

- **The step and the decode cost**, from the decode cadence: a request's ``(e2e - ttft) / (output tokens -
  1)`` is one engine step per token, and a step is longer the more sequences it decodes. A median fit of
  it against the sequences its endpoint was serving meanwhile gives the step's fixed overhead and the cost
  per decoding sequence. Only the requests whose decode no other request's prefill shared are fitted:
  another prompt computed in the same steps lengthens them by its prefill, not by a slowdown per sequence.
  (A trace without end-to-end latencies leaves the step to the TTFT fit's intercept and the decode cost at
  the simulator's default.)
- **Prefill and front end**, from the TTFTs: ``ttft = (step + prefill x uncached + frontend x prompt) x
  load``, ``load = 1 + slowdown x`` the requests its endpoint was serving when it arrived, a median
  (least absolute deviation) regression over the requests that found no other prompt ahead of them (every
  request of their endpoint that arrived before them had had its first token): a request behind others
  waits for their prefill, and the replay reproduces that queue by itself. A median fit is not pulled up
  much by requests delayed otherwise (a third of the points delayed moves it little). The front end is
  slowed by the load as the engine is (the simulator does the same): on a CPU replica the API server
  shares the cores with the engine.

Past the pool's capacity nearly every request waits behind others and shares its decode steps with their
prefill. Fitted on every request, a trace recorded on 2 simulated replicas at 3x their cold capacity
(TTFT p95 14 s) gave the simulator a prefill 7x too fast, a front end 8x too slow and a slowdown of 0.62
per sequence where it has none, and replayed with its recorded placement at p50 2.7 s against 5.7 s
recorded; fitted on the requests above (20 and 12 of its 336), the step and prefill come within 1% of the
simulator's own, the front end within 16%, and no slowdown (``loadtests/reports/replay-overload-sim/``).
Where fewer than ``MIN_POINTS`` requests are free of others, those with the fewest others are fitted.
- **The jitter**, from the requests that arrived at an idle endpoint: no queue and no load, so how far
  their recorded TTFTs spread about the fitted ones (p90 over p50 of recorded / fitted) is the replicas' own
  variability. The spread is matched on a grid by drawing one front-end and one engine factor per request;
  the simulator applies it to the front end only (on the steps it would cut throughput).

Measured on five document-QA traces from real vLLM on CPU, replayed with recorded placement: with the
front end slowed by load, the replayed TTFT p50 came within 25% of the recorded one on all five (-23 to
+25%); with a front end that ignored the load, four were 22-33% off and the fifth overloaded a simulated
replica (``loadtests/reports/replay-docqa-vllm-clean/``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from burstsched.replay.trace import TracedRequest
from burstsched.sim import CostModel

MIN_POINTS = 10
_JITTER_GRID = np.arange(0.0, 1.0001, 0.02)
_JITTER_DRAWS = 64
_IRLS_ROUNDS = 50
_IRLS_FLOOR_S = 1e-4
"""Residuals below this (0.1 ms) weigh as this: keeps the reweighting finite."""


@dataclass(frozen=True, slots=True)
class Calibration:
    """The fitted cost model and what it was fitted on."""

    cost: CostModel
    points: int
    """Requests with a TTFT and usage in the trace."""
    step_points: int
    """Requests whose decode cadence gave the step (0: the step is the TTFT fit's intercept)."""
    ttft_points: int = 0
    """Requests whose TTFT the prefill and front-end fit used (those with no other prompt ahead)."""

    def describe(self) -> str:
        c = self.cost
        step_ms, prefill_us = c.step_overhead_s * 1000, c.prefill_s_per_token * 1e6
        frontend_us = c.frontend_s_per_prompt_token * 1e6
        step_from = f"{self.step_points} decode cadences" if self.step_points else "the TTFT fit"
        return (
            f"calibrated on {self.points} recorded TTFTs ({self.ttft_points} with no prompt ahead; step from "
            f"{step_from}): step {step_ms:.2f} ms, "
            f"{c.load_slowdown:.2f} slower per extra sequence, prefill {prefill_us:.1f} us/token, "
            f"front end {frontend_us:.2f} us/prompt token, jitter {c.jitter:.2f}"
        )


def calibrate(requests: Sequence[TracedRequest], base: CostModel | None = None) -> Calibration | None:
    """The simulator's costs fitted to ``requests``; None when fewer than ``MIN_POINTS`` TTFTs can be used."""
    base = base or CostModel()
    usable = [r for r in requests if r.ttft_ms is not None and r.input_tokens and r.outcome == "ok"]
    if len(usable) < MIN_POINTS:
        return None
    uncached = np.array([float(r.input_tokens or 0) - (r.cached_tokens or 0) for r in usable])
    prompt = np.array([float(r.input_tokens or 0) for r in usable])
    ttft = np.array([(r.ttft_ms or 0.0) / 1000.0 for r in usable])
    cadence = _decode_cadence(usable, base)
    # only the requests that found no other one's prefill ahead of them: a queued TTFT is mostly the wait
    fit = fewest(prefills_ahead(usable))
    uncached_f, prompt_f, ttft_f = uncached[fit], prompt[fit], ttft[fit]
    if cadence is not None:
        step, slowdown, step_points = cadence
        # ttft = (frontend x prompt + step + prefill x uncached) x load, load from the requests in flight
        load = 1.0 + slowdown * in_flight_at_arrival(usable)[fit]
        prefill, frontend = _median_fit(
            np.column_stack([uncached_f * load, prompt_f * load]), ttft_f - step * load
        )
    else:
        step, prefill, frontend = _median_fit(
            np.column_stack([np.ones(len(ttft_f)), uncached_f, prompt_f]), ttft_f
        )
        slowdown, step_points = base.load_slowdown, 0
    cost = replace(
        base,
        step_overhead_s=max(0.0, step),
        load_slowdown=max(0.0, slowdown),
        prefill_s_per_token=max(0.0, prefill),
        frontend_s_per_prompt_token=max(0.0, frontend),
    )
    alone = in_flight_at_arrival(usable) == 0
    front = cost.frontend_s_per_prompt_token * prompt[alone]
    engine = cost.step_overhead_s + cost.prefill_s_per_token * uncached[alone]
    spread = _jitter(front, engine, ttft[alone])
    if spread is not None:
        cost = replace(cost, jitter=spread)
    return Calibration(cost, len(usable), step_points, int(np.count_nonzero(fit)))


def _jitter(
    front: npt.NDArray[np.float64], engine: npt.NDArray[np.float64], ttft: npt.NDArray[np.float64]
) -> float | None:
    """The ``jitter`` whose draws spread the modelled TTFTs of requests that arrived alone as the recorded
    ones spread: their upper spread, p90 over p50 of recorded / modelled, matched on a grid by drawing one
    front-end and one engine factor per request (fixed seed). None with fewer than ``MIN_POINTS`` of them."""
    model = front + engine
    keep = model > 0
    if np.count_nonzero(keep) < MIN_POINTS:
        return None
    front, engine, ratio = front[keep], engine[keep], ttft[keep] / model[keep]
    target = float(np.log(np.quantile(ratio, 0.9) / np.quantile(ratio, 0.5)))
    normals = np.random.default_rng(0).standard_normal((2, _JITTER_DRAWS, len(front)))
    best, best_gap = 0.0, math.inf
    for spread in _JITTER_GRID:
        drawn = (front * np.exp(spread * normals[0]) + engine * np.exp(spread * normals[1])) / (
            front + engine
        )
        gap = abs(float(np.log(np.quantile(drawn, 0.9) / np.quantile(drawn, 0.5))) - target)
        if gap < best_gap:
            best, best_gap = float(spread), gap
    return best


def _intervals(requests: Sequence[TracedRequest]) -> tuple[npt.NDArray[np.float64], ...]:
    """Arrival, first token and end (seconds; end = arrival when unknown) and endpoint of each request."""
    arrivals = np.array([r.t for r in requests])
    firsts = arrivals + np.array([(r.ttft_ms or 0.0) / 1000.0 for r in requests])
    ends = arrivals + np.array([(r.e2e_ms or 0.0) / 1000.0 for r in requests])
    return arrivals, firsts, ends


def fewest(counts: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
    """The requests with the fewest others in their way: those with none when at least ``MIN_POINTS`` have
    none, else those with at most as many as the ``MIN_POINTS``-th fewest."""
    if len(counts) <= MIN_POINTS:
        return np.ones(len(counts), dtype=bool)
    limit: float = np.sort(counts)[MIN_POINTS - 1]
    mask: npt.NDArray[np.bool_] = counts <= limit
    return mask


def prefills_ahead(requests: Sequence[TracedRequest]) -> npt.NDArray[np.float64]:
    """How many other requests of each one's endpoint had arrived and not yet had their first token when it
    arrived: prompts the engine computes before or beside its own (recorded times)."""
    arrivals, firsts, _ = _intervals(requests)
    endpoints = np.array([r.endpoint or "" for r in requests])
    counts = np.zeros(len(requests))
    for i in range(len(requests)):
        same = endpoints == endpoints[i]
        counts[i] = np.count_nonzero((arrivals[same] < arrivals[i]) & (firsts[same] > arrivals[i]))
    return counts


def in_flight_at_arrival(requests: Sequence[TracedRequest]) -> npt.NDArray[np.float64]:
    """How many other requests each one's endpoint was serving when it arrived (recorded times)."""
    arrivals, _, ends = _intervals(requests)
    endpoints = np.array([r.endpoint or "" for r in requests])
    counts = np.zeros(len(requests))
    for i in range(len(requests)):
        same = endpoints == endpoints[i]
        counts[i] = np.count_nonzero((arrivals[same] < arrivals[i]) & (ends[same] > arrivals[i]))
    return counts


def _decode_cadence(requests: Sequence[TracedRequest], base: CostModel) -> tuple[float, float, int] | None:
    """(step overhead, load slowdown, points) from the recorded inter-token latencies.

    Each request's mean inter-token latency ``(e2e - ttft) / (output tokens - 1)`` is one decode step of its
    endpoint; it is set against how many sequences that endpoint served on average meanwhile (itself
    included, from the recorded arrival and end times). A median fit of ``itl = a + b x (sequences - 1)``
    gives the lone step ``a`` (less the simulator's per-sequence decode cost ``d``: the step overhead) and
    the slowdown per extra sequence ``(b - d) / (a + d)``: the simulator's step with ``n`` decodes is
    ``(overhead + d x n) x (1 + slowdown x (n - 1))``, which grows by ``d + slowdown x (a + d)`` from one
    sequence to two. (``b / a``
    counted the decode cost ``d`` again as a slowdown, which multiplies every step, prefill included: on a
    simulated trace with no slowdown, 0.02, and steps twice too long with 50 sequences.) None when fewer than
    ``MIN_POINTS`` requests have the latencies, or the fit has no positive step."""
    rows = [
        r for r in requests if r.e2e_ms is not None and r.ttft_ms is not None and (r.output_tokens or 0) > 1
    ]
    if len(rows) < MIN_POINTS:
        return None
    arrivals, starts, ends = _intervals(rows)
    endpoints = np.array([r.endpoint or "" for r in rows])
    itl = np.array(
        [((r.e2e_ms or 0.0) - (r.ttft_ms or 0.0)) / 1000.0 / ((r.output_tokens or 2) - 1) for r in rows]
    )
    others = np.zeros(len(rows))
    for i in range(len(rows)):
        same = endpoints == endpoints[i]
        overlap = np.clip(np.minimum(ends[i], ends[same]) - np.maximum(starts[i], arrivals[same]), 0.0, None)
        others[i] = (overlap.sum() - (ends[i] - starts[i])) / max(ends[i] - starts[i], 1e-6)
    # only the requests whose decode no other request of the endpoint was prefilling beside (it arrived
    # before the decode's end and had its first token after the decode's start): its prefill in the same
    # steps makes them longer, which is no slowdown per sequence
    prefills = np.zeros(len(rows))
    for i in range(len(rows)):
        same = endpoints == endpoints[i]
        prefills[i] = np.count_nonzero(same & (arrivals < ends[i]) & (starts > starts[i]))
    fit = fewest(prefills)
    lone, extra = _median_fit(np.column_stack([np.ones(np.count_nonzero(fit)), others[fit]]), itl[fit])
    if lone <= 0.0:
        return None
    decode = base.decode_s_per_seq
    return max(0.0, lone - decode), max(0.0, (extra - decode) / (lone + decode)), int(np.count_nonzero(fit))


def _median_fit(design: npt.NDArray[np.float64], target: npt.NDArray[np.float64]) -> list[float]:
    """Least-absolute-deviation coefficients, by iteratively reweighted least squares."""
    coef, *_ = np.linalg.lstsq(design, target, rcond=None)
    for _ in range(_IRLS_ROUNDS):
        weights = np.sqrt(1.0 / np.maximum(np.abs(target - design @ coef), _IRLS_FLOOR_S))
        coef, *_ = np.linalg.lstsq(design * weights[:, None], target * weights, rcond=None)
    return [float(v) for v in coef]
