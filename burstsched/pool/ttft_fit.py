"""Each endpoint's time to first token, learned online from the streams the router itself sees.

A request sent to an endpoint waits for the prefill queued ahead of it there, then computes its own; on a
busy replica every step also carries the other sequences' decodes. The model, per endpoint:

    ttft ≈ base_s + tokens · (per_token_s + per_token_per_seq_s · concurrent)

``tokens``: the prompt tokens the endpoint had to compute before this request's first token, as the
router counted them when it sent the request (its own queued prefill there, this request's uncached part
included); ``concurrent``: the other requests the router had in flight there. Both are the router's own
counts, never stale. :class:`TtftFit` fits the three coefficients by exponentially weighted recursive least
squares, one observation per stream's first chunk, so the estimate follows a replica whose speed changes
(a neighbour on its CPU, a new model, a different GPU) and unequal replicas each get their own.
"""

from __future__ import annotations

from burstsched.framework import TtftEstimate

KILO = 1000.0
"""Tokens enter the fit in thousands, which keeps its matrix well conditioned."""


class TtftFit:
    """Recursive least squares of TTFT on ``[1, tokens, tokens · concurrent]``, older samples fading.

    ``forgetting``: each observation weighs this much less than the next (0.98: the last ~50 count most);
    ``min_samples``: observations before :meth:`estimate` answers. The fit starts from ``prior`` (base
    seconds, seconds per token) with little confidence, so its first estimates are close to that prior.
    An estimate whose cost per token is not positive is withheld (the samples do not yet tell the slope).
    A negative base or slowdown per request is reported as 0: more requests in flight never make a
    replica's prefill faster, and a fit that says so (noise, or a replica whose queue the router's counts
    overstate) would price a busy replica cheaper the more it is sent, until it draws every request (seen
    on 8 simulated replicas before the bound).
    """

    def __init__(
        self,
        *,
        prior: tuple[float, float] = (0.02, 1.0 / 4000.0),
        forgetting: float = 0.98,
        min_samples: int = 20,
        confidence: float = 100.0,
    ) -> None:
        if not 0.0 < forgetting <= 1.0:
            raise ValueError("forgetting must be in (0, 1]")
        self._theta = [prior[0], prior[1] * KILO, 0.0]
        self._p = [[confidence if i == j else 0.0 for j in range(3)] for i in range(3)]
        self._forgetting = forgetting
        self._min_samples = min_samples
        self._samples = 0
        self._estimate: TtftEstimate | None = None

    @property
    def samples(self) -> int:
        return self._samples

    def observe(self, tokens: float, concurrent: int, seconds: float) -> None:
        """One stream's first chunk came ``seconds`` after it was sent with these counts."""
        if seconds < 0 or tokens < 0:
            return
        kilo = tokens / KILO
        x = (1.0, kilo, kilo * max(0, concurrent))
        p, theta, lam = self._p, self._theta, self._forgetting
        px = [p[i][0] * x[0] + p[i][1] * x[1] + p[i][2] * x[2] for i in range(3)]
        denominator = lam + x[0] * px[0] + x[1] * px[1] + x[2] * px[2]
        gain = [v / denominator for v in px]
        error = seconds - (theta[0] * x[0] + theta[1] * x[1] + theta[2] * x[2])
        for i in range(3):
            theta[i] += gain[i] * error
        # P ← (P − k·(Px)ᵀ) / λ; P stays symmetric, so xᵀP = (Px)ᵀ
        for i in range(3):
            row = p[i]
            for j in range(3):
                row[j] = (row[j] - gain[i] * px[j]) / lam
        self._samples += 1
        self._estimate = self._current()

    def _current(self) -> TtftEstimate | None:
        if self._samples < self._min_samples:
            return None
        base, per_kilo, per_kilo_seq = self._theta
        if per_kilo <= 0.0:
            return None
        return TtftEstimate(max(0.0, base), per_kilo / KILO, max(0.0, per_kilo_seq) / KILO, self._samples)

    def estimate(self) -> TtftEstimate | None:
        """The current fit, or None before ``min_samples`` observations or while it makes no sense."""
        return self._estimate
