"""Program-aware fairness: between the flows of one band, the one with the least attained service goes first.

As llm-d's ``program-aware-fairness`` (its ``las`` strategy) does it:

- a program is a flow (``x-llm-d-inference-fairness-id``, see :mod:`.identity`);
- its attained service is the tokens its completed requests consumed, prompt tokens plus twice the output
  tokens (the response's usage), halving every ``half_life_s`` of wall-clock time (folded in lazily, when
  read or added);
- among the flows waiting in a band, each scores ``weight_service x (1 - norm(service)) + weight_head_wait x
  norm(head wait)``, both range-normalized over those flows (0.5 when all are equal); the highest goes first;
- a flow with no completion for ``forget_after_s`` is forgotten.

Pure bookkeeping on an injected clock's readings; the queue asks :meth:`AttainedService.scores` in each
release pass and the router reports each completion with :meth:`AttainedService.add`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from burstsched.config.flow_control import ProgramAwareConfig

INPUT_TOKEN_WEIGHT = 1
OUTPUT_TOKEN_WEIGHT = 2
"""Output tokens cost about twice what input tokens do (llm-d's weights)."""


@dataclass(slots=True)
class _Service:
    tokens: float
    anchor: float
    """When the decay was last folded in."""
    last_completion: float


class AttainedService:
    """Decayed attained service per flow, in weighted tokens."""

    def __init__(self, config: ProgramAwareConfig) -> None:
        self._config = config
        self._flows: dict[str, _Service] = {}
        self._swept = 0.0

    def add(self, flow: str, prompt_tokens: int, output_tokens: int, now: float) -> float:
        """A request of ``flow`` completed having used these tokens; its new service."""
        self._sweep(now)
        cost = INPUT_TOKEN_WEIGHT * max(0, prompt_tokens) + OUTPUT_TOKEN_WEIGHT * max(0, output_tokens)
        entry = self._flows.get(flow)
        if entry is None:
            entry = self._flows[flow] = _Service(0.0, now, now)
        self._decay(entry, now)
        entry.tokens += cost
        entry.last_completion = now
        return entry.tokens

    def service(self, flow: str, now: float) -> float:
        """The flow's attained service now (0 for a flow never served or forgotten)."""
        entry = self._flows.get(flow)
        if entry is None:
            return 0.0
        self._decay(entry, now)
        return entry.tokens

    def scores(self, head_waits: Mapping[str, float], now: float) -> dict[str, float]:
        """Each waiting flow's score (higher goes first), from its oldest queued request's wait."""
        if not head_waits:
            return {}
        service = {flow: self.service(flow, now) for flow in head_waits}
        low_s, high_s = min(service.values()), max(service.values())
        low_w, high_w = min(head_waits.values()), max(head_waits.values())
        config = self._config
        return {
            flow: config.weight_service * (1.0 - _normalized(service[flow], low_s, high_s))
            + config.weight_head_wait * _normalized(wait, low_w, high_w)
            for flow, wait in head_waits.items()
        }

    def __len__(self) -> int:
        return len(self._flows)

    def _decay(self, entry: _Service, now: float) -> None:
        elapsed = now - entry.anchor
        if elapsed <= 0:
            return
        if self._config.half_life_s > 0:
            entry.tokens *= 2.0 ** (-elapsed / self._config.half_life_s)
        entry.anchor = now

    def _sweep(self, now: float) -> None:
        """Forget flows idle for ``forget_after_s`` (looked at once per tenth of it at most)."""
        ttl = self._config.forget_after_s
        if ttl <= 0 or now - self._swept < ttl / 10:
            return
        self._swept = now
        for flow in [f for f, e in self._flows.items() if now - e.last_completion > ttl]:
            del self._flows[flow]


def _normalized(value: float, low: float, high: float) -> float:
    if high == low:
        return 0.5
    return (value - low) / (high - low)
