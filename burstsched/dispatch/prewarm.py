"""Prefix prewarming: a hot shared prefix cached on one endpoint only is computed once more on an idle one.

Bursts of one tenant's new users share its system prompt. When that prompt is cached on one replica only,
the burst either queues there, every member's prefill in the same engine steps, or pays a cold prefill of
the whole prompt elsewhere. With the prompt cached on two replicas, the cost model splits the burst over
both at the price of one warm prefill each.

So, after each decision, :meth:`Prewarmer.consider` looks at the request's prefix (its first
``min_shared_blocks`` blocks): when the chosen endpoint holds it, it is a warm hit on that prefix. Once a
prefix has ``hot_requests`` warm hits within ``hot_window_ms`` and no other endpoint holds it, the first
other endpoint (in the decision's order) that is idle (no queued prefill, nothing waiting or placed) and
whose cache the prefix index believes at most ``max_fill`` full gets a copy of the request, cut to one
output token and not streamed. The copy is counted in the pool's load while it runs and recorded in the
prefix index as a dispatch, so later decisions see the prefix there. One copy per prefix per
``cooldown_ms``, one copy in flight per endpoint.

Copies use only idle capacity and cache room the index says is free: under cache pressure (document QA past
the caches' size) there are none once the index counts the caches full, only a few while they fill.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import httpx

from burstsched.config import PrewarmConfig
from burstsched.dispatch.upstream import Upstream, poster
from burstsched.framework import (
    ApiKind,
    Decision,
    EndpointSnapshot,
    PrefixMatch,
    SchedRequest,
    uncached_tokens,
)
from burstsched.pool import EndpointPool
from burstsched.telemetry.metrics import RouterMetrics

log = logging.getLogger(__name__)

Clock = Callable[[], float]
OnDispatch = Callable[[SchedRequest, EndpointSnapshot], None]


@dataclass(frozen=True, slots=True)
class Copy:
    """A prewarm copy to send: ``request`` once more, to ``endpoint``."""

    endpoint: EndpointSnapshot
    request: SchedRequest
    queued_prefill: int
    """The prompt tokens the endpoint is expected to compute for it (counted in the pool's load)."""


_MIN_PRUNE_AT = 4096
"""Prefixes tracked before the ones with no hit inside the window are forgotten."""


class PrefixHeat:
    """Warm hits per prefix over a sliding window, and when each prefix was last copied (pure; time given)."""

    def __init__(self, config: PrewarmConfig) -> None:
        self._config = config
        self._hits: dict[int, deque[float]] = {}
        self._copied: dict[int, float] = {}
        self._prune_at = _MIN_PRUNE_AT

    def hit(self, prefix: int, now: float) -> bool:
        """Count a warm hit on ``prefix``; whether it is now hot and not copied within the cooldown."""
        window_s = self._config.hot_window_ms / 1000.0
        hits = self._hits.get(prefix)
        if hits is None:
            hits = self._hits[prefix] = deque()
        hits.append(now)
        while hits and hits[0] <= now - window_s:
            hits.popleft()
        if len(self._hits) > self._prune_at:  # bounded: forget prefixes with no hit inside the window
            self._prune(now - window_s)
            self._prune_at = max(_MIN_PRUNE_AT, 2 * len(self._hits))  # amortized: not on every hit
        copied = self._copied.get(prefix)
        cooling = copied is not None and now - copied < self._config.cooldown_ms / 1000.0
        return len(hits) >= self._config.hot_requests and not cooling

    def copied(self, prefix: int, now: float) -> None:
        self._copied[prefix] = now

    def _prune(self, before: float) -> None:
        for prefix in [p for p, hits in self._hits.items() if not hits or hits[-1] <= before]:
            del self._hits[prefix]
            self._copied.pop(prefix, None)


def choose_copy(
    config: PrewarmConfig,
    heat: PrefixHeat,
    request: SchedRequest,
    decision: Decision,
    now: float,
    busy: set[str],
) -> Copy | None:
    """The copy to send after ``decision``, if its prefix is hot and some endpoint can take one.

    ``busy``: endpoints with a copy in flight."""
    depth = config.min_shared_blocks
    if len(request.block_hashes) < depth:
        return None
    chosen = decision.endpoint
    match = decision.matches.get(chosen.name)
    if match is None or match.matched_blocks < depth:
        return None  # a cold request: not a use of a cached prefix
    prefix = request.block_hashes[depth - 1]  # chained: it names the whole prefix
    if not heat.hit(prefix, now):
        return None
    target: tuple[EndpointSnapshot, PrefixMatch] | None = None
    for scored in decision.ranked[1:]:
        endpoint = scored.endpoint
        other = decision.matches.get(endpoint.name)
        if other is None:
            continue
        if other.matched_blocks >= depth:
            return None  # already on two endpoints
        if target is None and _can_take(config, endpoint, other.fill, busy):
            target = (endpoint, other)
    if target is None:
        return None
    heat.copied(prefix, now)
    endpoint, other = target
    return Copy(endpoint, request, uncached_tokens(request, other))


def _can_take(config: PrewarmConfig, endpoint: EndpointSnapshot, fill: float | None, busy: set[str]) -> bool:
    if not endpoint.healthy or endpoint.name in busy or fill is None or fill > config.max_fill:
        return False
    return endpoint.queued_prefill_tokens == 0 and endpoint.waiting == 0 and endpoint.pending == 0


def copy_body(payload: Mapping[str, Any]) -> bytes:
    """The request's body cut to one output token, not streamed (the prompt, and so its cache, unchanged)."""
    body = {k: v for k, v in payload.items() if k not in ("stream_options", "min_tokens", "logprobs")}
    body.update(max_tokens=1, stream=False, n=1)
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = 1
    return json.dumps(body, separators=(",", ":")).encode()


class Prewarmer:
    """Sends prewarm copies in the background; an async context manager (the app's lifespan owns it)."""

    def __init__(
        self,
        config: PrewarmConfig,
        upstream: Upstream,
        pool: EndpointPool,
        metrics: RouterMetrics,
        *,
        on_dispatch: OnDispatch,
        clock: Clock,
    ) -> None:
        self._config = config
        self._post = poster(upstream)
        self._pool = pool
        self._metrics = metrics
        self._on_dispatch = on_dispatch
        self._clock = clock
        self._heat = PrefixHeat(config)
        self._busy: set[str] = set()
        self._tasks: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> Prewarmer:
        self._tasks = anyio.create_task_group()
        await self._tasks.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        tasks, self._tasks = self._tasks, None
        if tasks is None:
            return None
        tasks.cancel_scope.cancel()  # copies are best effort: none outlives the router
        return await tasks.__aexit__(exc_type, exc, tb)

    @property
    def in_flight(self) -> int:
        return len(self._busy)

    def consider(
        self, api: ApiKind, payload: Mapping[str, Any], request: SchedRequest, decision: Decision
    ) -> None:
        """After ``decision``: copy this request if its prefix is hot and an endpoint can take the copy."""
        if self._tasks is None:
            return
        copy = choose_copy(self._config, self._heat, request, decision, self._clock(), self._busy)
        if copy is None:
            return
        self._busy.add(copy.endpoint.name)
        self._tasks.start_soon(self._send, copy, api.path, copy_body(payload))

    async def _send(self, copy: Copy, path: str, body: bytes) -> None:
        """Send one copy; best effort: whatever goes wrong is logged and counted, never raised."""
        name = copy.endpoint.name
        outcome = "failed"
        acquired = False
        try:
            self._pool.acquire(name, copy.queued_prefill, copy.request.prompt_tokens)
            acquired = True
            self._on_dispatch(copy.request, copy.endpoint)
            status, _ = await self._post(copy.endpoint.url + path, body, self._config.timeout_ms / 1000.0)
            if status == 200:
                outcome = "ok"
            else:
                log.info("prewarm copy to %s answered %d", name, status)
        except httpx.TransportError as exc:
            log.info("prewarm copy to %s failed: %s", name, exc)
        except Exception:
            log.exception("prewarm copy to %s failed", name)
        finally:
            if acquired:
                self._pool.release(name, copy.queued_prefill)
            self._busy.discard(name)
            self._metrics.prewarms.labels(name, outcome).inc()
