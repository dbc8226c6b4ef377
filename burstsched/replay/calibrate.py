"""Fit the simulator's cost model to a trace: the recorded replicas' own speed, from their TTFTs.

A replayed TTFT is only comparable with the recorded one if the simulated replicas compute prompts as fast as
the recorded ones did, and a trace may come from any hardware and model. Each recorded request with a TTFT
and its usage gives a point: TTFT against the tokens it had to compute (prompt minus cached) and its prompt
length. A least-squares fit of ``ttft = step + prefill x uncached + frontend x prompt``, refitted a few
times on the half of the points closest to the previous fit (requests that waited in a queue drop out; the
replay reproduces the queue by itself), gives the simulator's per-step overhead, prefill cost per token and
front-end cost per prompt token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from burstsched.replay.trace import TracedRequest
from burstsched.sim import CostModel

MIN_POINTS = 10
ROUNDS = 3


@dataclass(frozen=True, slots=True)
class Calibration:
    """The fitted cost model and what it was fitted on."""

    cost: CostModel
    points: int
    """Requests with a TTFT and usage in the trace."""
    kept: int
    """Those the final fit used (the half closest to it: not delayed by a queue)."""

    def describe(self) -> str:
        c = self.cost
        step_ms, prefill_us = c.step_overhead_s * 1000, c.prefill_s_per_token * 1e6
        frontend_us = c.frontend_s_per_prompt_token * 1e6
        return (
            f"calibrated on {self.kept} of {self.points} recorded requests: step {step_ms:.2f} ms, "
            f"prefill {prefill_us:.1f} us/token, front end {frontend_us:.2f} us/prompt token"
        )


def calibrate(requests: Sequence[TracedRequest], base: CostModel | None = None) -> Calibration | None:
    """The simulator's costs fitted to ``requests``; None when fewer than ``MIN_POINTS`` can be used."""
    rows = [
        (float(r.input_tokens - (r.cached_tokens or 0)), float(r.input_tokens), r.ttft_ms / 1000.0)
        for r in requests
        if r.ttft_ms is not None and r.input_tokens and r.outcome == "ok"
    ]
    if len(rows) < MIN_POINTS:
        return None
    data = np.array(rows, dtype=np.float64)
    design = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1]])
    ttft = data[:, 2]
    keep = np.ones(len(data), dtype=bool)
    coef = _fit(design, ttft)
    for _ in range(ROUNDS):  # refit on the half closest to the fit: queued requests drop out round by round
        residual = np.abs(ttft - design @ coef)
        closest = residual <= np.median(residual)
        if int(closest.sum()) < MIN_POINTS // 2 or bool((closest == keep).all()):
            break
        keep = closest
        coef = _fit(design[keep], ttft[keep])
    step, prefill, frontend = (max(0.0, float(v)) for v in coef)
    cost = replace(
        base or CostModel(),
        step_overhead_s=step,
        prefill_s_per_token=prefill,
        frontend_s_per_prompt_token=frontend,
    )
    return Calibration(cost, len(rows), int(keep.sum()))


def _fit(design: npt.NDArray[np.float64], target: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    coef, *_ = np.linalg.lstsq(design, target, rcond=None)
    return np.asarray(coef, dtype=np.float64)
