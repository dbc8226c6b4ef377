"""How long the simulated engine takes: one engine step, and the front-end work before it.

Step model (what vLLM's v1 engine does each iteration: one forward pass over a batch)::

    step_s     = (step_overhead_s + prefill_s_per_token * prefill_tokens + decode_s_per_seq * decode_seqs)
                 * (1 + load_slowdown * (sequences - 1))
    frontend_s = frontend_s_per_prompt_token * prompt_tokens * (1 + load_slowdown * busy)

``sequences`` are all the sequences the step serves (prefilling or decoding); ``busy`` the requests the
engine holds (running or waiting) when a request's front-end work starts. ``load_slowdown`` is 0 on a
GPU, where a batch's sequences share one forward pass. A CPU replica slows with every sequence it serves at
once (measured on vLLM 0.32, one core per replica: a lone decode step 2.4 ms, 5.4 ms with two or three
sequences; a cold 2800-token prefill 157 ms alone, 370 ms beside two others): about 0.7 there. Its API
server's work slows too: it shares the CPU with the engine (a warm request on a busy vLLM replica on CPU
took 2.5 times its lone TTFT, 207 against 82 ms, in a trace whose fitted front end was most of a warm
request's TTFT).

``prefill_tokens`` are the new prompt tokens computed in the step (prefix-cache hits excluded);
``decode_seqs`` the running sequences that each produce one token in it. A long prefill therefore
delays every decode that shares its step: head-of-line blocking as in vLLM.

The front-end cost is the API server's per-request work before the engine sees the request
(rendering the chat template, tokenizing, building the request). It runs per request, in parallel
with the engine, and grows with the prompt. It is why a fully cached 5200-token prompt still takes
~130 ms to its first token while decode steps stay ~10 ms.

Calibration (defaults), against the seed measurement (0.5B model, ~5200-token prompt, 32 output tokens):

- cold TTFT = frontend + one step of ~5200 prefill tokens
  = 5200·20 µs + 10 ms + 5200·0.362 ms ≈ 104 + 10 + 1882 ≈ 2.0 s (measured 2.0 s);
- warm TTFT (all but the last partial block and the new question cached, ~20 tokens computed)
  = 104 ms + 10 ms + 20·0.362 ms ≈ 121 ms, plus ~8 ms of real HTTP and scheduling overhead
  ≈ 130 ms (measured p50 127 ms, p95 159 ms);
- 31 further decode steps of one sequence ≈ 31 · 10.2 ms ≈ 0.32 s after the first token.

``loadtests/sim_calibration.py`` checks these figures end to end (client side).

Every duration is multiplied by the replica's ``time_scale``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CostModel:
    """Durations of engine steps and front-end work, in seconds at time scale 1."""

    step_overhead_s: float = 0.010
    prefill_s_per_token: float = 0.000362
    decode_s_per_seq: float = 0.0002
    frontend_s_per_prompt_token: float = 0.000020
    load_slowdown: float = 0.0
    """How much longer a step gets for each sequence it serves beyond the first (0: a GPU's batching)."""
    jitter: float = 0.0
    """Spread of each request's front-end duration: it is multiplied by ``exp(jitter x Z)``, ``Z`` standard
    normal (a median of 1). 0, the default: every duration is the model's. Real vLLM on CPU varies from one
    request to the next (0.54-0.98 fitted by the replay's calibration on five traces)."""
    metrics_render_s: float = 0.0
    """The API server's time to render ``/metrics`` for one GET. vLLM renders its ~50 KB page on the event
    loop that also takes requests in, so each render holds that loop (a request's front-end work ends no
    sooner than the loop is free), and a CPU replica's engine, sharing the core, loses the same time from
    the step in progress. 0, the default: scrapes are free. vLLM on this machine's CPU: 6-12 ms
    (``loadtests/vllm_scrape_cost.py``)."""

    def __post_init__(self) -> None:
        names = (
            "step_overhead_s",
            "prefill_s_per_token",
            "decode_s_per_seq",
            "frontend_s_per_prompt_token",
            "load_slowdown",
            "jitter",
            "metrics_render_s",
        )
        for name in names:
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")

    def step_s(self, prefill_tokens: int, decode_seqs: int, sequences: int = 1) -> float:
        """One engine step computing ``prefill_tokens`` prompt tokens and ``decode_seqs`` decodes, for
        ``sequences`` sequences in all."""
        if prefill_tokens == 0 and decode_seqs == 0:
            return 0.0
        work = (
            self.step_overhead_s
            + self.prefill_s_per_token * prefill_tokens
            + self.decode_s_per_seq * decode_seqs
        )
        return work * (1.0 + self.load_slowdown * max(0, sequences - 1))

    def frontend_s(self, prompt_tokens: int, busy: int = 0) -> float:
        """The API server's work on one request before it reaches the engine, ``busy`` requests being in the
        engine meanwhile."""
        return self.frontend_s_per_prompt_token * prompt_tokens * (1.0 + self.load_slowdown * busy)


class Jitter:
    """Draws the cost model's duration factors from an injected RNG (none when ``jitter`` is 0)."""

    def __init__(self, spread: float, rng: random.Random) -> None:
        self._spread = spread
        self._rng = rng

    def factor(self) -> float:
        """``exp(spread x Z)``; exactly 1.0 without drawing when the spread is 0."""
        if self._spread <= 0.0:
            return 1.0
        return math.exp(self._spread * self._rng.gauss(0.0, 1.0))
