"""The data the scheduler works on: requests, endpoint snapshots, scored endpoints and decisions."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from burstsched.framework.state import PrefixMatch


class ApiKind(StrEnum):
    """Which OpenAI API a request came in through."""

    CHAT = "chat"
    COMPLETIONS = "completions"

    @property
    def path(self) -> str:
        """The upstream path for this kind."""
        return "/v1/chat/completions" if self is ApiKind.CHAT else "/v1/completions"


@dataclass(frozen=True, slots=True)
class TtftEstimate:
    """An endpoint's time to first token as the router learned it (:mod:`burstsched.pool.ttft_fit`):
    ``base_s + tokens · (per_token_s + per_token_per_seq_s · concurrent)`` for ``tokens`` prompt tokens to
    compute there (queued ahead and its own) with ``concurrent`` other requests in flight; ``samples``: the
    streams it was fitted on."""

    base_s: float
    per_token_s: float
    per_token_per_seq_s: float
    samples: int

    def per_token(self, concurrent: int) -> float:
        """Seconds per prompt token with ``concurrent`` other requests on the endpoint (never below 0)."""
        return max(0.0, self.per_token_s + self.per_token_per_seq_s * max(0, concurrent))

    def predict(self, tokens: float, concurrent: int) -> float:
        """Seconds to the first token (never below 0)."""
        return max(0.0, self.base_s + tokens * self.per_token(concurrent))


@dataclass(frozen=True, slots=True)
class EndpointSnapshot:
    """One replica as the scheduler sees it at one moment.

    ``waiting``, ``running`` and ``kv_usage`` come from the replica's last scrape and may be stale;
    ``in_flight`` is the router's own count of requests it has sent there and that have not finished
    (never stale); ``pending`` is load placed there by the current admission window but not dispatched yet.
    ``queued_prefill_tokens`` is the router's own estimate of the prompt tokens still to be computed by the
    requests it sent there that have not produced their first token (never stale), ``prefilling`` how many
    of those requests still have prompt tokens to compute;
    ``prefill_tokens_per_s`` is the replica's prefill speed learned from its metrics (None until known);
    ``engine_tokens_per_prompt_token`` how many of the replica's tokens one of the router's prompt tokens
    came to on the requests it sent there (its ``prompt_tokens`` counter over the router's count; None until
    known): with approximate hashing, about 1.9 for chat text where a pseudo-token is 4 bytes. ``ttft`` is
    its time to first token as learned from the streams the router sent there (None until fitted).
    ``labels`` are the endpoint's labels (a pod's Kubernetes labels, or its config's ``labels``).
    ``running_adapters`` and ``waiting_adapters`` are the LoRA adapters the replica's last scrape named
    running and waiting (``vllm:lora_requests_info``), ``max_adapters`` how many it may hold at once (its
    ``max_lora``; 0 when it reported none).
    """

    name: str
    url: str
    healthy: bool = True
    stale: bool = False
    metrics_age: float = math.inf
    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    in_flight: int = 0
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    pending: int = 0
    queued_prefill_tokens: int = 0
    prefilling: int = 0
    prefill_tokens_per_s: float | None = None
    engine_tokens_per_prompt_token: float | None = None
    ttft: TtftEstimate | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    running_adapters: frozenset[str] = frozenset()
    waiting_adapters: frozenset[str] = frozenset()
    max_adapters: int = 0

    @property
    def capacity_tokens(self) -> int | None:
        """The replica's KV-cache capacity in tokens, when it reported one."""
        if self.block_size is None or self.num_gpu_blocks is None:
            return None
        return self.block_size * self.num_gpu_blocks

    def capacity_blocks(self, block_tokens: int, *, learned: bool = True) -> int | None:
        """The KV capacity in the router's blocks of ``block_tokens`` prompt tokens: the replica's tokens over
        its tokens per router block (``engine_tokens_per_prompt_token`` of them per prompt token once learned
        and ``learned``, else one)."""
        tokens = self.capacity_tokens
        if tokens is None:
            return None
        per_token = (self.engine_tokens_per_prompt_token if learned else None) or 1.0
        return max(1, int(tokens / (block_tokens * per_token)))


@dataclass(frozen=True, slots=True)
class SchedRequest:
    """A request (or a group of ``group_size`` requests sharing it) to place on one endpoint.

    ``block_hashes`` is the chained hash of the prompt's full blocks of ``block_tokens`` (pseudo-)tokens each,
    from block 0; ``prompt_tokens`` is the prompt's size in the same tokens (the approximate view, always
    there). ``token_ids`` are the prompt's token ids exactly as the engine will see them, when the router
    could tokenize it (precise mode); ``None`` otherwise. ``cache_salt`` is the request's ``cache_salt``,
    which the engine mixes into its first block's hash. ``headers`` holds the client's request headers that
    the profile's plugins read (:class:`~burstsched.framework.HeaderReader`), names in lower case.
    """

    request_id: str
    model: str
    api: ApiKind
    stream: bool = False
    block_hashes: tuple[int, ...] = ()
    block_tokens: int = 64
    prompt_tokens: int = 0
    group_size: int = 1
    token_ids: tuple[int, ...] | None = None
    cache_salt: str | None = None
    headers: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ValueError("group_size must be at least 1")

    def header(self, name: str) -> str | None:
        """The value of request header ``name`` (lower case), if the client sent it and a plugin reads it."""
        for key, value in self.headers:
            if key == name:
                return value
        return None


@dataclass(frozen=True, slots=True)
class ScoredEndpoint:
    """An endpoint with each scorer's clamped score (by scorer name) and the weighted total."""

    endpoint: EndpointSnapshot
    scores: Mapping[str, float] = field(default_factory=dict)
    total: float = 0.0

    @property
    def name(self) -> str:
        return self.endpoint.name


@dataclass(frozen=True, slots=True)
class Decision:
    """Where a request goes: ``ranked`` lists the candidates in preference order; the first is the pick.

    Failover and spill take the next entries of ``ranked``. ``matches`` holds the prefix producers' match per
    candidate, by endpoint name (empty when no producer made one).
    """

    ranked: tuple[ScoredEndpoint, ...]
    matches: Mapping[str, PrefixMatch] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.ranked:
            raise ValueError("a decision needs at least one endpoint")

    @property
    def endpoint(self) -> EndpointSnapshot:
        return self.ranked[0].endpoint

    @property
    def chosen(self) -> ScoredEndpoint:
        return self.ranked[0]

    @property
    def prefix(self) -> PrefixMatch | None:
        """The chosen endpoint's prefix match, if a producer made one."""
        return self.matches.get(self.ranked[0].name)


def tokens_past(request: SchedRequest, blocks: int) -> int:
    """``request``'s prompt tokens past its first ``blocks`` blocks: what it computes where those blocks are
    computed already (e.g. by its burst group's leader)."""
    return max(0, request.prompt_tokens - blocks * request.block_tokens)


def uncached_tokens(request: SchedRequest, match: PrefixMatch | None) -> int:
    """The prompt tokens an endpoint must still compute for ``request`` given its prefix ``match``: the
    engine's tokens when the match is precise, else the request's pseudo-tokens (about one per 4 bytes)."""
    if match is not None and match.source == "precise" and request.token_ids is not None:
        total = len(request.token_ids)
    else:
        total = request.prompt_tokens
    if match is None:
        return total
    return max(0, total - match.matched_blocks * match.block_tokens)
