"""The soak's request mix: chat requests sharing a few long contexts (so prefix affinity matters), streamed or
not, a share of streams the client cuts, and a share of malformed requests. Everything is drawn from one
seeded RNG, so a run's sequence of requests is reproducible.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from burstsched.workloads.soak_client import MALFORMED

CONTEXT_LINES = 32  # about 600 tokens with the simulator's tokenizer


def context(rng: random.Random, label: str, lines: int = CONTEXT_LINES) -> str:
    """A long, distinct text: an operations log."""
    out = [f"Context {label}-{rng.getrandbits(32):08x}: the operations log of cluster {label}."]
    for i in range(lines):
        out.append(
            f"Entry {i}: node-{rng.randrange(500)} reported {rng.randrange(900)} slow requests and "
            f"{rng.randrange(50)} restarts."
        )
    return " ".join(out)


@dataclass(frozen=True, slots=True)
class Mix:
    """Shares of the request mix and the size of the answers."""

    stream_share: float = 0.7
    disconnect_share: float = 0.02
    """Of the streamed requests: closed by the client after a few chunks."""
    malformed_share: float = 0.02
    max_tokens_min: int = 16
    max_tokens_max: int = 64
    contexts: int = 8

    def __post_init__(self) -> None:
        for name in ("stream_share", "disconnect_share", "malformed_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within [0, 1]")
        if not 1 <= self.max_tokens_min <= self.max_tokens_max:
            raise ValueError("need 1 <= max_tokens_min <= max_tokens_max")
        if self.contexts < 1:
            raise ValueError("contexts must be >= 1")

    @property
    def mean_max_tokens(self) -> int:
        return (self.max_tokens_min + self.max_tokens_max) // 2


@dataclass(frozen=True, slots=True)
class Planned:
    """One request to send: a chat ``body`` (``cut_after``: chunks read before a cut) or a malformed one."""

    index: int
    body: dict[str, Any] | None = None
    cut_after: int | None = None
    malformed: str | None = None


class RequestPlan:
    """Draws the next request of the mix."""

    def __init__(self, mix: Mix, model: str, rng: random.Random) -> None:
        self.mix = mix
        self.model = model
        self._rng = rng
        self._contexts = [context(rng, str(c)) for c in range(mix.contexts)]
        self._count = 0
        self._malformed = 0

    def next(self) -> Planned:
        rng, mix = self._rng, self.mix
        index = self._count
        self._count += 1
        if rng.random() < mix.malformed_share:  # the kinds in turn
            self._malformed += 1
            return Planned(index, malformed=MALFORMED[(self._malformed - 1) % len(MALFORMED)])
        stream = rng.random() < mix.stream_share
        cut_after = rng.randint(1, 4) if stream and rng.random() < mix.disconnect_share else None
        content = (
            f"{rng.choice(self._contexts)}\nQuestion {index}: which node needs attention first, and why?"
        )
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": rng.randint(mix.max_tokens_min, mix.max_tokens_max),
            "temperature": 0,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        return Planned(index, body=body, cut_after=cut_after)

    def calibration_prompts(self, count: int) -> list[str]:
        """``count`` distinct prompts as long as the mix's, sharing nothing with it (for cold capacity)."""
        return [
            f"{context(self._rng, f'calibration-{i}')}\nQuestion: which node needs attention first?"
            for i in range(count)
        ]
