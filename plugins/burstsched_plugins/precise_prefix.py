"""``precise-prefix-producer``: per-endpoint prefix matches from the replicas' own KV-cache events.

The router's event hub subscribes to every replica's ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``
events and hands each batch to this plugin (it is a :class:`~burstsched.framework.KVEventConsumer`). A stored
block's ``token_ids`` are rehashed with the router's own chained hash (:mod:`burstsched_plugins.token_chain`),
chained to the router hash of the event's parent block, so the replica's hash seed does not matter. A request
whose prompt the router tokenized (``SchedRequest.token_ids``) is cut into the engine's blocks and hashed the
same way; the match is the longest chain the endpoint holds.

Three more sources keep the view honest between events:

- **Speculative entries.** At dispatch, the request's blocks count as present on the chosen endpoint for
  ``speculative_ttl_ms`` or until an event stores them, so a burst's second request, scheduled before the
  engine stored the first one's blocks, sees the first one's endpoint as warm.
- **Approximate fallback.** Every dispatch is also recorded in an approximate index (the
  ``approx-prefix-producer``'s). A request the router could not tokenize, an endpoint with no event stream,
  and an endpoint whose stream is silent are matched from it; ``PrefixMatch.source`` says which index decided.
- **A silent stream is a broken stream.** A dispatch that should store new blocks and is followed by no event
  of that endpoint within ``confirm_timeout_ms`` marks its stream untrusted (approximate fallback) until the
  next event arrives.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from pydantic import Field

from burstsched.framework import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CycleState,
    EndpointSnapshot,
    EventBatch,
    PluginContext,
    PluginParameters,
    PrefixMatch,
    SchedRequest,
)
from burstsched_plugins.precise_index import PreciseIndex
from burstsched_plugins.prefix_index import PrefixIndex
from burstsched_plugins.token_chain import chain_hashes, root_seed

PRECISE = "precise"
APPROXIMATE = "approximate"
_GPU_MEDIA = (None, "GPU")
_HASH_MEMO = 64


class PrecisePrefixParameters(PluginParameters):
    block_size: int | None = Field(
        default=None,
        ge=1,
        description="The engine's block size in tokens, used only until the replica reports one (its "
        "BlockStored events, or vllm:cache_config_info); null: wait for the replica.",
    )
    default_capacity_blocks: int = Field(
        default=1_000_000,
        ge=1,
        description="Safety bound of the precise index per endpoint, in blocks, until the endpoint reports "
        "its capacity (the events keep it exact; the bound only matters if removals are lost).",
    )
    approximate_capacity_blocks: int = Field(
        default=31250,
        ge=1,
        description="Bound per endpoint of the approximate fallback index, in blocks of pseudo-tokens, until "
        "the endpoint reports its capacity.",
    )
    speculative_ttl_ms: float = Field(
        default=5000.0,
        ge=0,
        description="How long a dispatched request's blocks count as present on its endpoint before an event "
        "confirms them (they are dropped as soon as one does); 0 disables speculation.",
    )
    confirm_timeout_ms: float = Field(
        default=5000.0,
        gt=0,
        description="A dispatch that should store new blocks, followed by no event of that endpoint for this "
        "long, marks the endpoint's stream untrusted: its matches come from the approximate index until the "
        "next event.",
    )
    max_blocks: int = Field(
        default=4096, ge=1, description="Longest prompt prefix hashed per request, in engine blocks."
    )


@dataclass(slots=True)
class _Stream:
    """What the plugin knows of one endpoint's event stream."""

    subscribed: bool = False
    block_size: int | None = None
    awaiting_since: float | None = None


@dataclass(slots=True)
class EventStats:
    """Counts of what the plugin did with the events it received (for metrics and tests)."""

    stored_blocks: int = 0
    removed_blocks: int = 0
    cleared: int = 0
    unchained: int = 0
    other_media: int = 0
    length_mismatches: int = 0


class PrecisePrefixProducer:
    """Producer, dispatch hook, KV-event consumer and resettable: the precise prefix index."""

    Parameters = PrecisePrefixParameters
    produces: ClassVar[tuple[type, ...]] = (PrefixMatch,)

    def __init__(self, name: str, parameters: PrecisePrefixParameters, context: PluginContext) -> None:
        self._name = name
        self._params = parameters
        self._clock: Callable[[], float] = context.clock
        self.index = PreciseIndex(parameters.default_capacity_blocks)
        self.approximate = PrefixIndex(parameters.approximate_capacity_blocks)
        self.stats = EventStats()
        self._streams: dict[str, _Stream] = {}
        self._speculative: dict[str, dict[int, float]] = {}
        self._speculative_writes = 0
        self._speculative_live = 0
        self._capacities: dict[str, tuple[int, int, int]] = {}
        self._memo: OrderedDict[tuple[str, int, str | None], tuple[tuple[int, ...], list[int]]] = (
            OrderedDict()
        )

    @property
    def name(self) -> str:
        return self._name

    # --- decisions ------------------------------------------------------------------------------------

    def produce(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> None:
        now = self._clock()
        approximate: list[EndpointSnapshot] = []
        precise: dict[int, list[EndpointSnapshot]] = {}
        for endpoint in endpoints:
            self._update_capacity(endpoint, request.block_tokens)
            block_size = self._precise_block_size(request, endpoint, now)
            if block_size is None:
                approximate.append(endpoint)
            else:
                precise.setdefault(block_size, []).append(endpoint)
        for block_size, group in precise.items():
            hashes = self._hashes(request, block_size)
            matched = self.index.match(hashes, (e.name for e in group))
            for endpoint in group:
                blocks = self._extend_speculative(endpoint.name, hashes, matched[endpoint.name], now)
                state.put(endpoint.name, PrefixMatch(blocks, len(hashes), block_size, PRECISE))
        if approximate:
            total = len(request.block_hashes)
            matched = self.approximate.match(request.block_hashes, (e.name for e in approximate))
            for endpoint in approximate:
                state.put(
                    endpoint.name,
                    PrefixMatch(matched[endpoint.name], total, request.block_tokens, APPROXIMATE),
                )

    def on_dispatch(self, request: SchedRequest, endpoint: EndpointSnapshot) -> None:
        self._update_capacity(endpoint, request.block_tokens)
        if request.block_hashes:
            self.approximate.add(endpoint.name, request.block_hashes)
        block_size = self._block_size(endpoint)
        if request.token_ids is None or block_size is None:
            return
        hashes = self._hashes(request, block_size)
        if not hashes:
            return
        now = self._clock()
        held = self.index.match(hashes, (endpoint.name,))[endpoint.name]
        if held == len(hashes):
            return  # all cached already: the engine stores nothing new, no event will follow
        stream = self._streams.get(endpoint.name)
        if stream is not None and stream.subscribed and stream.awaiting_since is None:
            stream.awaiting_since = now  # the engine will store new blocks: an event must follow
        ttl = self._params.speculative_ttl_ms / 1000.0
        if ttl > 0:
            # only the blocks the engine will store: those it holds already get no event to confirm them, and
            # a speculation left standing would outlive their eviction
            entries = self._speculative.setdefault(endpoint.name, {})
            expiry = now + ttl
            for block in hashes[held:]:
                entries[block] = expiry
            self._speculative_writes += len(hashes) - held
            if self._speculative_writes > max(4096, self._speculative_live):
                self._purge_speculative(now)

    # --- events ---------------------------------------------------------------------------------------

    def on_kv_events(self, endpoint: str, batch: EventBatch) -> None:
        stream = self._streams.setdefault(endpoint, _Stream(subscribed=True))
        stream.awaiting_since = None
        speculative = self._speculative.get(endpoint)
        stats = self.stats
        for event in batch.events:
            if isinstance(event, BlockStored):
                if event.medium not in _GPU_MEDIA:
                    stats.other_media += 1
                    continue
                stream.block_size = event.block_size
                if event.parent_block_hash is None:
                    seed: int | None = root_seed(_salt(event))
                else:
                    seed = self.index.router_hash(endpoint, event.parent_block_hash)
                if seed is None:  # the parent was never seen (lost before we subscribed): cannot chain
                    stats.unchained += 1
                    continue
                router = chain_hashes(event.token_ids, event.block_size, seed=seed)
                count = min(len(router), len(event.block_hashes))
                if count != len(event.block_hashes) or count != len(router):
                    stats.length_mismatches += 1
                self.index.store(endpoint, event.block_hashes[:count], router[:count])
                stats.stored_blocks += count
                if speculative:
                    for block in router[:count]:
                        speculative.pop(block, None)
            elif isinstance(event, BlockRemoved):
                if event.medium not in _GPU_MEDIA:
                    stats.other_media += 1
                    continue
                stats.removed_blocks += self.index.remove(endpoint, event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self.index.clear_endpoint(endpoint)
                stats.cleared += 1

    def on_kv_stream_reset(self, endpoint: str, reason: str) -> None:
        """What the plugin held for ``endpoint`` may be wrong: drop it (events rebuild it)."""
        self.index.clear_endpoint(endpoint)
        self._speculative.pop(endpoint, None)
        stream = self._streams.get(endpoint)
        if stream is not None:
            stream.awaiting_since = None

    def on_kv_stream_live(self, endpoint: str) -> None:
        self._streams.setdefault(endpoint, _Stream()).subscribed = True

    def on_kv_stream_closed(self, endpoint: str) -> None:
        """The hub stopped following ``endpoint``: its matches come from the approximate index."""
        self.index.clear_endpoint(endpoint)
        self._streams.pop(endpoint, None)

    # --- state ----------------------------------------------------------------------------------------

    def reset(self) -> None:
        self.index.clear()
        self.approximate.clear()
        self._speculative.clear()
        self._memo.clear()

    def forget_endpoint(self, endpoint: str) -> None:
        """``endpoint`` went away: its cache is gone with it (events of its successor rebuild the view)."""
        self._capacities.pop(endpoint, None)
        self.index.clear_endpoint(endpoint)
        self.approximate.remove_endpoint(endpoint)
        self._speculative.pop(endpoint, None)
        stream = self._streams.get(endpoint)
        if stream is not None:
            stream.awaiting_since = None

    # --- internals ------------------------------------------------------------------------------------

    def _trusted(self, endpoint: str, now: float) -> bool:
        stream = self._streams.get(endpoint)
        if stream is None or not stream.subscribed:
            return False
        since = stream.awaiting_since
        return since is None or now - since <= self._params.confirm_timeout_ms / 1000.0

    def _block_size(self, endpoint: EndpointSnapshot) -> int | None:
        stream = self._streams.get(endpoint.name)
        if stream is not None and stream.block_size is not None:
            return stream.block_size
        return endpoint.block_size or self._params.block_size

    def _precise_block_size(
        self, request: SchedRequest, endpoint: EndpointSnapshot, now: float
    ) -> int | None:
        if request.token_ids is None or not self._trusted(endpoint.name, now):
            return None
        return self._block_size(endpoint)

    def _hashes(self, request: SchedRequest, block_size: int) -> list[int]:
        tokens = request.token_ids
        assert tokens is not None
        key = (request.request_id, block_size, request.cache_salt)
        memo = self._memo.get(key)
        if memo is not None and memo[0] is tokens:
            return memo[1]
        hashes = chain_hashes(
            tokens, block_size, seed=root_seed(request.cache_salt), max_blocks=self._params.max_blocks
        )
        self._memo[key] = (tokens, hashes)
        if len(self._memo) > _HASH_MEMO:
            self._memo.popitem(last=False)
        return hashes

    def _extend_speculative(self, endpoint: str, hashes: Sequence[int], matched: int, now: float) -> int:
        entries = self._speculative.get(endpoint)
        if not entries:
            return matched
        blocks = matched
        while blocks < len(hashes):
            expiry = entries.get(hashes[blocks])
            if expiry is None or expiry < now:
                break
            blocks += 1
        return blocks

    def _purge_speculative(self, now: float) -> None:
        """Drop expired speculations; amortised: runs after as many writes as there were live entries."""
        self._speculative_writes = 0
        self._speculative_live = 0
        for endpoint, entries in list(self._speculative.items()):
            live = {block: expiry for block, expiry in entries.items() if expiry >= now}
            if live:
                self._speculative[endpoint] = live
                self._speculative_live += len(live)
            else:
                del self._speculative[endpoint]

    def _update_capacity(self, endpoint: EndpointSnapshot, block_tokens: int) -> None:
        blocks = endpoint.num_gpu_blocks
        if blocks is None or endpoint.block_size is None:
            return
        key = (blocks, endpoint.block_size, block_tokens)
        if self._capacities.get(endpoint.name) == key:
            return  # the common case: nothing changed since the last decision
        self._capacities[endpoint.name] = key
        self.index.set_capacity(endpoint.name, blocks)
        self.approximate.set_capacity(endpoint.name, blocks * endpoint.block_size // block_tokens)


def _salt(event: BlockStored) -> str | None:
    """The ``cache_salt`` vLLM mixed into a chain's first block: a string among its extra keys, if any."""
    keys = event.extra_keys
    if not keys:
        return None
    first = keys[0]
    items = first if isinstance(first, tuple) else (first,)
    for item in items:
        if isinstance(item, str):
            return item
    return None
