"""``rendezvous-scorer``: a new prefix goes where every router would send it, without the routers talking.

Several routers in front of the same replicas each keep their own view of what the replicas hold (the
approximate index knows only its own router's dispatches; the precise one lags the KV events). When a
prefix is new, each would pick by its own load counts and tie-breaks, and a burst sent half through one
router and half through another would be computed twice. This scorer makes the first placement of a
prefix a function of the prompt and the pool alone:

- **The key.** The chained hash of the prompt's first ``lead_tokens`` tokens (``SchedRequest.block_hashes``
  up to the block that covers them, or the whole prompt's last full block when it is shorter). Block hashes
  depend only on the rendered prompt, the model name, the cache salt and ``prefix_hashing``, so every
  router with the same config computes the same key for the same prompt.
- **Rendezvous (highest-random-weight) hashing.** Each candidate's weight is a 64-bit hash of the key and
  the endpoint's name (names come from the config, the same on every router); the heaviest wins. Distinct
  keys spread uniformly; removing an endpoint moves only the keys it held.
- **Bounded loads** (consistent hashing with bounded loads, Mirrokni et al. 2018). An endpoint whose load
  is at or above ``cap = max(load_factor × mean load, min_cap)`` takes no new prefix; the key goes to the
  heaviest endpoint under the cap, so a hot run of new prefixes spills in the same order on every router.
  The mean counts the request being placed (``(Σ load + group_size) / n``), so some endpoint is always
  under the cap. Unhealthy endpoints are skipped unless every candidate is.
- **Load.** ``max(waiting + running, in_flight) + pending``: the replica's own queue and batch from its
  last scrape, which every router reads alike (so they agree on who is over the cap), raised to the
  router's own in-flight count where the scrape has not caught up with this router's dispatches yet, plus
  what the current admission window placed there. When any candidate's metrics are stale, all are judged
  on ``in_flight + pending`` alone (the router's own counts, never stale), as the queue scorer does.
- **Only new prefixes.** The request is cold when no candidate holds its key, i.e. every candidate's
  :class:`PrefixMatch` covers fewer than ``min(lead_tokens, prompt)`` tokens. A warm request scores 0
  everywhere: warm placement stays with the prefix index and the other scorers. Without a producer (no
  match at all) every request counts as cold.

Scores: 1.0 for the chosen endpoint, 0.0 for the others. Give the scorer a weight above the sum of the
other scorers' weights (e.g. 8 beside prefix 3, queue 2, kv 2; 2 beside ``cost-scorer`` 1): for a new
prefix the rendezvous choice then stands whatever the others say (their load views differ between routers;
the cap is the load rule), and the others still order the remaining endpoints (failover and spill).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import ClassVar

import xxhash
from pydantic import Field

from burstsched.framework import (
    CycleState,
    EndpointSnapshot,
    PluginContext,
    PluginParameters,
    PrefixMatch,
    SchedRequest,
)

_SEED_MASK = (1 << 64) - 1


class RendezvousParameters(PluginParameters):
    lead_tokens: int = Field(
        default=256,
        ge=1,
        description="Leading prompt tokens (pseudo-tokens of the approximate hashing, about 4 bytes each) "
        "that name a prefix: prompts sharing them go to the same endpoint. 256 is burst admission's "
        "default grouping threshold (min_shared_blocks 4 blocks of 64), so requests one router would group "
        "are placed together by all of them.",
    )
    load_factor: float = Field(
        default=1.25,
        ge=1.0,
        description="The bounded-load constant c: an endpoint whose load reaches c × the candidates' mean "
        "load (this request included) takes no new prefix.",
    )
    min_cap: float = Field(
        default=16.0,
        gt=0.0,
        description="The cap never falls below this many requests: a replica running a few requests is not "
        "overloaded, and a burst's first half (placed by one router) must not push its second half "
        "(placed by another) elsewhere. Same order as saturation-filter's max_waiting.",
    )


class RendezvousScorer:
    """Scores 1.0 the endpoint a new prefix's key hashes to (under the load cap); 0 otherwise."""

    Parameters = RendezvousParameters
    consumes: ClassVar[tuple[type, ...]] = (PrefixMatch,)

    def __init__(self, name: str, parameters: RendezvousParameters, context: PluginContext) -> None:
        self._name = name
        self._p = parameters
        self._name_bytes: dict[str, bytes] = {}

    @property
    def name(self) -> str:
        return self._name

    # -- the pieces --------------------------------------------------------------------------------------
    def key(self, request: SchedRequest) -> int | None:
        """The request's rendezvous key: the chain hash covering its first ``lead_tokens`` tokens (None for
        a prompt shorter than one block)."""
        hashes = request.block_hashes
        if not hashes:
            return None
        lead_blocks = -(-self._p.lead_tokens // max(1, request.block_tokens))
        return hashes[min(lead_blocks, len(hashes)) - 1]

    def weight(self, key: int, endpoint: str) -> int:
        """The endpoint's highest-random-weight hashing weight for ``key``."""
        encoded = self._name_bytes.get(endpoint)
        if encoded is None:
            encoded = self._name_bytes[endpoint] = endpoint.encode()
        return int(xxhash.xxh64_intdigest(encoded, seed=key & _SEED_MASK))

    def ranking(self, key: int, endpoints: Iterable[str]) -> list[str]:
        """Endpoint names by decreasing weight for ``key`` (ties, which a 64-bit hash makes rare, by name)."""
        return sorted(endpoints, key=lambda name: (-self.weight(key, name), name))

    def cold(self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState) -> bool:
        """No candidate holds the request's leading ``lead_tokens`` tokens (its whole prompt, if shorter)."""
        for endpoint in endpoints:
            match = state.get(endpoint.name, PrefixMatch)
            if match is None or match.matched_blocks == 0:
                continue
            needed = min(self._p.lead_tokens, match.total_blocks * match.block_tokens)
            if match.matched_blocks * match.block_tokens >= needed:
                return False
        return True

    def loads(self, endpoints: Sequence[EndpointSnapshot]) -> dict[str, int]:
        """Each endpoint's load in requests (see the module's docstring)."""
        if any(e.stale for e in endpoints):
            return {e.name: e.in_flight + e.pending for e in endpoints}
        return {e.name: max(e.waiting + e.running, e.in_flight) + e.pending for e in endpoints}

    def cap(self, loads: Mapping[str, int], group_size: int) -> float:
        """The bounded-load cap for placing ``group_size`` more requests."""
        mean = (sum(loads.values()) + group_size) / max(1, len(loads))
        return max(self._p.load_factor * mean, self._p.min_cap)

    def choose(self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot]) -> str | None:
        """The endpoint a new prefix goes to: the heaviest for its key among the healthy endpoints under the
        cap (None when the request has no key or there is no candidate)."""
        key = self.key(request)
        if key is None or not endpoints:
            return None
        healthy = [e for e in endpoints if e.healthy] or list(endpoints)
        loads = self.loads(healthy)
        cap = self.cap(loads, request.group_size)
        under = [name for name, load in loads.items() if load < cap]
        # Some endpoint is always under the cap (the least loaded is below the mean); fall back regardless.
        return self.ranking(key, under or loads)[0]

    # -- the scorer --------------------------------------------------------------------------------------
    def score(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> Mapping[str, float]:
        scores = dict.fromkeys((e.name for e in endpoints), 0.0)
        if not self.cold(request, endpoints, state):
            return scores
        chosen = self.choose(request, endpoints)
        if chosen is not None:
            scores[chosen] = 1.0
        return scores
