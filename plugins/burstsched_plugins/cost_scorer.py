"""``cost-scorer``: each endpoint scored by the time to first token this request (or group) would see there.

The estimate, in seconds, for endpoint ``e`` (tokens are the engine's with a precise prefix match, else
pseudo-tokens of about 4 bytes):

    own_e    = uncached prompt tokens of the request on e (its length minus e's matched prefix)
               + (group_size - 1) · group_tail_tokens        (a group computes its shared prefix once)
    queue_e  = the router's queued prefill on e (tokens of requests sent there that have no first token yet)
               + (pending_e + others_waiting_e) · own_e      (placed by this window / queued by other clients)
    ttft_e   = overhead_s + (queue_e + own_e) / rate_e · (1 + decode_slowdown · running_e)
    cost_e   = ttft_e + work_weight · own_e / rate_e

Once the router has fitted every candidate's time to first token on the streams it sent there (the
snapshots' ``ttft``, :mod:`burstsched.pool.ttft_fit`) and ``learned`` is on (it is off by default: see the
parameter), each is priced by its fit instead (while one candidate has no fit, all are priced by the
parameters, so two pricings are never compared):

    ttft_e   = base_e + (queue_e + own_e) · (per_token_e + per_token_per_seq_e · in_flight_e)

with the same work term at the same cost per token: the replica's fixed cost, speed and slowdown under
load are then its own, as measured, not the parameters below.

``rate_e`` is the replica's prefill speed learned from its metrics (``prefill_tokens_per_s`` of the snapshot);
until it is known, the mean of the other candidates' (or ``default_prefill_tokens_per_s`` when none is), so
unequal replicas are weighed by their own speed and an unmeasured one is neither favoured nor shunned. A
speed within ``speed_tolerance`` of the mean counts as the mean: on the seed experiment two alike CPU
replicas, one sharing its core with the client, learned speeds far enough apart to draw 9 of 10 new
prefixes to one of them. The
last term charges the prefill a choice adds to the pool (which later requests wait behind): with
``work_weight`` 0 the scorer is greedy for this request's TTFT alone.

The score is ``min_cost / cost_e``: 1.0 for the cheapest endpoint (and for any within ``tie_tolerance`` of
it), lower for the others, so with this scorer alone (weight 1) the max-score picker takes the cheapest and
breaks ties by its rule (distinct cold prefixes on an idle pool cost about the same everywhere and spread).

``stay_margin`` adds hysteresis for locality. The endpoints that would compute the fewest of the prompt's
tokens (the "home": those holding the longest prefix, when some other endpoint holds less) keep the request
while their cost is within ``stay_margin`` (plus ``tie_tolerance``) of the cheapest: they score 1.0 and every
other endpoint scores ``min_cost / cost_e / (1 + stay_margin + tie_tolerance)``, below 1 and in order of cost.
Past the margin the scores are as above. Without it (0), a warm endpoint within ``tie_tolerance`` of a cold
one only ties with it, and the picker's tie-break sends the request cold about every other time; and the
estimate moves a request off its cached replica as soon as the queue ahead looks dearer than the prefill
it saves, though that queue is an estimate whose error grows with the load.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from pydantic import Field

from burstsched.framework import (
    CycleState,
    EndpointSnapshot,
    PluginContext,
    PluginParameters,
    PrefixMatch,
    SchedRequest,
    uncached_tokens,
)


class CostParameters(PluginParameters):
    default_prefill_tokens_per_s: float = Field(
        default=4000.0,
        gt=0,
        description="Prefill speed assumed for an endpoint until its metrics tell its own (tokens/s).",
    )
    overhead_s: float = Field(
        default=0.02, ge=0, description="Fixed cost of any request (front-end, first decode step), seconds."
    )
    decode_slowdown: float = Field(
        default=0.01,
        ge=0,
        description="Prefill slows by this share per running sequence (decodes share each engine step).",
    )
    group_tail_tokens: int = Field(
        default=64, ge=0, description="Tokens each further member of a group adds past the shared prefix."
    )
    speed_tolerance: float = Field(
        default=0.5,
        ge=0,
        description="Learned prefill speeds within this share of the pool's mean count as the mean: the "
        "speeds seen by requests vary with what shares a replica's CPU or GPU, and alike replicas must not "
        "draw every new prefix to the one that looked faster (only really unequal replicas are weighed).",
    )
    tie_tolerance: float = Field(
        default=0.1,
        ge=0,
        description="Costs within this share of the cheapest count as equal (score 1.0), so the picker's "
        "tie-break spreads them: idle replicas whose learned speeds differ by noise stay interchangeable.",
    )
    work_weight: float = Field(
        default=1.0,
        ge=0,
        description="Weight of the prefill work a choice adds to the pool (delaying later requests), "
        "relative to this request's own time to first token.",
    )
    stay_margin: float = Field(
        default=0.0,
        ge=0,
        description="Hysteresis for locality: the endpoints that would compute the fewest prompt tokens of "
        "this request (those holding the longest prefix of it, when others hold less) keep it unless their "
        "cost exceeds the cheapest one's by more than this share of it, and they win the ties. 0: the "
        "cheapest wins and ties spread regardless of what each holds.",
    )
    learned: bool = Field(
        default=False,
        description="Once every candidate's time to first token has been fitted on the streams the router "
        "sent there (its snapshot's ttft), price each by its fit instead of the parameters above: its own "
        "fixed cost, seconds per token and slowdown per request in flight. Off by default: on 2 real vLLM "
        "replicas at 2x their cold capacity (document QA, two runs) it kept 1.0-1.4 points fewer requests "
        "on their warm replica than the parameters did, and its TTFT p95 was worse in one run and better "
        "in the other.",
    )


class CostScorer:
    """Scores endpoints by estimated time to first token (and the work added), cheapest 1.0."""

    Parameters = CostParameters
    consumes: ClassVar[tuple[type, ...]] = (PrefixMatch,)

    def __init__(self, name: str, parameters: CostParameters, context: PluginContext) -> None:
        self._name = name
        self._p = parameters

    @property
    def name(self) -> str:
        return self._name

    def costs(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> dict[str, float]:
        """The estimated cost of each endpoint, in seconds."""
        return {name: cost for name, (cost, _) in self._priced(request, endpoints, state).items()}

    def _priced(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> dict[str, tuple[float, int]]:
        """Each endpoint's estimated cost in seconds, and the prompt tokens it would compute."""
        p = self._p
        tail = (request.group_size - 1) * p.group_tail_tokens
        known = [e.prefill_tokens_per_s for e in endpoints if e.prefill_tokens_per_s]
        mean_rate = sum(known) / len(known) if known else p.default_prefill_tokens_per_s
        # one pricing for all: fits are used only when every candidate has one, since a fit and the
        # parameters disagree on the same replica by tens of percent, and mixing them would steer by that
        learned = p.learned and all(e.ttft is not None for e in endpoints)
        out: dict[str, tuple[float, int]] = {}
        for e in endpoints:
            own = uncached_tokens(request, state.get(e.name, PrefixMatch)) + tail
            others = 0 if e.stale else max(0, e.waiting - e.in_flight)
            queue = e.queued_prefill_tokens + (e.pending + others) * own
            fit = e.ttft if learned else None
            if fit is not None:
                per_token = fit.per_token(e.in_flight)
                out[e.name] = (fit.base_s + (queue + own) * per_token + p.work_weight * own * per_token, own)
                continue
            rate = e.prefill_tokens_per_s or mean_rate
            if abs(rate / mean_rate - 1.0) <= p.speed_tolerance:
                rate = mean_rate  # alike replicas are alike: noise in the learned speeds must not steer
            slowdown = 1.0 + p.decode_slowdown * (0 if e.stale else e.running)
            ttft = p.overhead_s + (queue + own) / rate * slowdown
            out[e.name] = (ttft + p.work_weight * own / rate, own)
        return out

    def score(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> Mapping[str, float]:
        priced = self._priced(request, endpoints, state)
        if not priced:
            return {}
        costs = {name: cost for name, (cost, _) in priced.items()}
        best = min(costs.values())
        if best <= 0.0:
            return {name: 1.0 if cost <= 0.0 else 0.0 for name, cost in costs.items()}
        home = self._home(priced, best)
        if home:
            # the endpoints holding the most of the prompt keep it: 1.0 for them, the rest below any of them
            # and ordered by cost (the failover order), since none is cheaper past the margin
            home_best = min(costs[name] for name in home)
            below = 1.0 / (1.0 + self._p.stay_margin + self._p.tie_tolerance)
            near_home = home_best * (1.0 + self._p.tie_tolerance)
            return {
                name: 1.0 if name in home and cost <= near_home else best / cost * below
                for name, cost in costs.items()
            }
        near = best * (1.0 + self._p.tie_tolerance)
        return {name: 1.0 if cost <= near else best / cost for name, cost in costs.items()}

    def _home(self, priced: Mapping[str, tuple[float, int]], best: float) -> set[str]:
        """The endpoints computing the fewest prompt tokens, when others would compute more and none is
        cheaper than them by more than ``stay_margin`` (and ``tie_tolerance``); else none."""
        if self._p.stay_margin <= 0.0:
            return set()
        fewest = min(own for _, own in priced.values())
        if all(own == fewest for _, own in priced.values()):
            return set()  # nobody holds more of it than the others: nothing to keep
        limit = best * (1.0 + self._p.stay_margin + self._p.tie_tolerance)
        return {name for name, (cost, own) in priced.items() if own == fewest and cost <= limit}
