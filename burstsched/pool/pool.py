"""The endpoint pool: each replica's scraped load, health, served models and the router's in-flight count.

Scrapes ``/metrics`` every ``scrape_interval_ms`` and checks ``/health`` (and ``/v1/models``) every
``health_check_interval_ms``, one task per endpoint and kind, so a slow replica delays nobody else. A failing
``/metrics`` only makes that endpoint stale; a refused connection (scrape, check or dispatch), or
``failed_checks_before_down`` failed health checks in a row, mark it unhealthy until its next successful
health check. Failed dispatches (timeouts, 5xx) feed a per-endpoint
circuit breaker (:mod:`burstsched.pool.circuit`): an open circuit hides the endpoint from scheduling (its
snapshot reads unhealthy) until a probe request succeeds. When an endpoint turns unhealthy, ``on_down`` is
told its name (the router drops its prefix-index entries: a replica that comes back has lost its cache).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import anyio
import httpx

from burstsched.config import EndpointConfig, PoolConfig
from burstsched.framework import EndpointSnapshot
from burstsched.pool.circuit import CircuitBreaker, CircuitSettings, CircuitState
from burstsched.pool.decaying_rate import DecayingRate
from burstsched.pool.scrape import MetricsFormatError, MetricsParser, ReplicaMetrics
from burstsched.pool.ttft_fit import TtftFit

log = logging.getLogger(__name__)

Fetch = Callable[[str, float], Awaitable[tuple[int, bytes]]]
"""``fetch(url, timeout_s) -> (status, body)``: a GET within ``timeout_s``, for checks and scrapes; raises
httpx's transport errors (``ConnectError``: refused)."""

DEMAND_TIME_CONSTANT_S = 10.0
"""Time constant of each endpoint's prefill demand (tokens sent per second): long enough to hold a few
dozen requests at the rates where demand matters, short enough to follow a change of load within seconds."""

FAILURES_BEFORE_UNHEALTHY = CircuitSettings().failure_threshold
"""Consecutive failed dispatches (timeouts, 5xx) that open an endpoint's circuit, by default."""


@dataclass(slots=True)
class _EndpointState:
    name: str
    url: str
    labels: Mapping[str, str] = field(default_factory=dict)
    """The endpoint's labels (a read-only copy of its config's), shared by every snapshot."""
    healthy: bool = False
    metrics: ReplicaMetrics = field(default_factory=ReplicaMetrics)
    last_scrape: float = -math.inf
    in_flight: int = 0
    queued_prefill: int = 0
    prefilling: int = 0
    """The router's requests here with prefill tokens still to compute (before their first token)."""
    prefill_demand: DecayingRate = field(default_factory=lambda: DecayingRate(DEMAND_TIME_CONSTANT_S))
    """Prompt tokens per second the router has recently sent here to be computed (its prefill demand)."""
    prefill_rate: float | None = None
    prefill_counters: tuple[float, float] | None = None
    sent_prompt_tokens: int = 0
    """The router's prompt tokens (pseudo-tokens with approximate hashing) of every request sent here."""
    token_baseline: tuple[float, int] | None = None
    """The replica's prompt-token counter and :attr:`sent_prompt_tokens` when the count began."""
    engine_tokens_per_prompt_token: float | None = None
    ttft: TtftFit = field(default_factory=TtftFit)
    """Time to first token against the router's own counts, fitted on the streams sent here."""
    failures: int = 0
    failed_checks: int = 0
    model_cards: tuple[dict[str, Any], ...] | None = None
    card_ids: frozenset[str] | None = None
    parser: MetricsParser = field(default_factory=MetricsParser)
    circuit: CircuitBreaker | None = None
    source: str = "static"
    joining: bool = False
    """Added while running: not schedulable until a health check and a scrape both succeed."""
    draining: bool = False
    """Removed: takes no new requests; goes when its in-flight ones are over."""
    since: float = 0.0
    """When it entered its current state (joining, healthy, unhealthy, draining), on the pool's clock."""
    scope: anyio.CancelScope | None = None

    @property
    def live(self) -> bool:
        return self.healthy and not self.draining

    @property
    def phase(self) -> str:
        if self.draining:
            return "draining"
        if self.joining:
            return "joining"
        return "healthy" if self.healthy else "unhealthy"


@dataclass(frozen=True, slots=True)
class EndpointStatus:
    """One endpoint as ``/admin/endpoints`` shows it."""

    name: str
    url: str
    state: str
    source: str
    since: float
    in_flight: int


_RETIRED_KEPT = 256
"""Removed endpoints remembered, so late calls for a request sent just before the removal still land."""


class UnknownEndpointError(KeyError):
    """No endpoint of that name in the pool."""


class EndpointPool:
    """The replicas behind the router, as :class:`EndpointSnapshot` on demand; ``fetch`` reads their
    ``/health``, ``/v1/models`` and ``/metrics``."""

    def __init__(
        self,
        endpoints: Sequence[EndpointConfig],
        config: PoolConfig,
        fetch: Fetch,
        *,
        clock: Callable[[], float],
        models: Sequence[str] = (),
        circuit: CircuitSettings | None = None,
        on_down: Callable[[str], None] | None = None,
        on_removed: Callable[[str], None] | None = None,
        on_change: Callable[[str], None] | None = None,
    ) -> None:
        settings = circuit if circuit is not None else CircuitSettings()
        self._circuit_settings = settings
        self._states = {
            e.endpoint_name: _EndpointState(
                e.endpoint_name,
                e.url,
                _labels(e),
                circuit=CircuitBreaker(settings, clock),
                since=clock(),
            )
            for e in endpoints
        }
        self._retired: dict[str, _EndpointState] = {}
        self._on_down = on_down
        self._on_removed = on_removed
        self._on_change = on_change
        self._tg: anyio.abc.TaskGroup | None = None
        self._fetch = fetch
        self._config = config
        self._clock = clock
        self._configured_models = tuple(models)
        self._staleness = config.staleness_threshold_ms / 1000.0
        self._listeners: list[Callable[[], None]] = []

    @property
    def names(self) -> list[str]:
        return list(self._states)

    def _state(self, name: str) -> _EndpointState:
        state = self._states.get(name)
        if state is None:
            state = self._retired.get(name)
        if state is None:
            raise UnknownEndpointError(name)
        return state

    def _snapshot(self, state: _EndpointState, now: float) -> EndpointSnapshot:
        metrics = state.metrics
        age = now - state.last_scrape
        return EndpointSnapshot(
            name=state.name,
            url=state.url,
            healthy=state.live and self._circuit(state).admits(),
            stale=age > self._staleness,
            metrics_age=age,
            waiting=metrics.waiting,
            running=metrics.running,
            kv_usage=metrics.kv_usage,
            in_flight=state.in_flight,
            block_size=metrics.block_size,
            num_gpu_blocks=metrics.num_gpu_blocks,
            queued_prefill_tokens=state.queued_prefill,
            prefilling=state.prefilling,
            prefill_tokens_per_s=state.prefill_rate,
            engine_tokens_per_prompt_token=state.engine_tokens_per_prompt_token,
            ttft=state.ttft.estimate(),
            labels=state.labels,
            running_adapters=metrics.running_adapters,
            waiting_adapters=metrics.waiting_adapters,
            max_adapters=metrics.max_adapters,
        )

    def snapshot(self, name: str) -> EndpointSnapshot:
        return self._snapshot(self._state(name), self._clock())

    def member(self, name: str) -> EndpointSnapshot | None:
        """Member ``name`` now; None when it is not a member (never added, or removed and retired)."""
        state = self._states.get(name)
        return None if state is None else self._snapshot(state, self._clock())

    def prefill_demands(self) -> dict[str, float]:
        """Each endpoint's prefill demand now: prompt tokens per second the router has recently sent it to
        compute. Read for ``/metrics`` only, so it stays out of the snapshots every decision builds."""
        now = self._clock()
        return {name: state.prefill_demand.rate(now) for name, state in self._states.items()}

    def kv_geometry(self, name: str) -> tuple[int | None, int | None]:
        """``name``'s KV block size and block count as its last scrape gave them; (None, None): unknown."""
        state = self._states.get(name) or self._retired.get(name)
        if state is None:
            return (None, None)
        return (state.metrics.block_size, state.metrics.num_gpu_blocks)

    def snapshots(self, model: str | None = None) -> list[EndpointSnapshot]:
        """Every endpoint (or those serving ``model``), healthy or not."""
        now = self._clock()
        return [
            self._snapshot(state, now)
            for state in self._states.values()
            if model is None or self._serves(state, model)
        ]

    def healthy_count(self) -> int:
        return sum(1 for state in self._states.values() if state.live)

    # --- models -----------------------------------------------------------------------------------------

    def _model_ids(self, state: _EndpointState) -> frozenset[str] | None:
        if state.card_ids is not None:
            return state.card_ids
        return state.metrics.model_names or None

    def _serves(self, state: _EndpointState, model: str) -> bool:
        if self._configured_models:
            return True
        ids = self._model_ids(state)
        return ids is None or model in ids

    def model_ids(self) -> list[str]:
        """The configured models, or every model a healthy replica reports, sorted."""
        if self._configured_models:
            return list(self._configured_models)
        ids: set[str] = set()
        for state in self._states.values():
            if state.live:
                ids |= self._model_ids(state) or frozenset()
        return sorted(ids)

    def model_cards(self) -> list[dict[str, Any]]:
        """``/v1/models`` entries: the replicas' own cards (first seen per id), or minimal ones."""
        cards: dict[str, dict[str, Any]] = {}
        for state in self._states.values():
            if state.live and state.model_cards:
                for card in state.model_cards:
                    cards.setdefault(str(card.get("id")), card)
        return [
            cards.get(model_id, {"id": model_id, "object": "model", "owned_by": "burstsched"})
            for model_id in self.model_ids()
        ]

    def knows_model(self, model: str) -> bool:
        """Whether ``model`` is configured, or some endpoint serves it or has not said what it serves."""
        if self._configured_models:
            return model in self._configured_models
        return any(state.live and self._serves(state, model) for state in self._states.values())

    # --- in-flight accounting and passive health ----------------------------------------------------------

    def acquire(self, name: str, prefill_tokens: int = 0, prompt_tokens: int = 0) -> None:
        """Count a request the router is sending to ``name``, with the prompt tokens it expects ``name`` to
        compute before its first token and its whole prompt's size in the router's tokens."""
        state = self._state(name)
        state.in_flight += 1
        state.queued_prefill += prefill_tokens
        state.sent_prompt_tokens += prompt_tokens
        if prefill_tokens > 0:
            state.prefilling += 1
            state.prefill_demand.add(prefill_tokens, self._clock())

    def load(self, name: str) -> tuple[int, int]:
        """``name``'s queued prefill tokens and in-flight requests as the router counts them (read right
        after :meth:`acquire`, the features a stream's :meth:`observe_ttft` is later fitted on)."""
        state = self._state(name)
        return state.queued_prefill, state.in_flight

    def observe_ttft(self, name: str, tokens: int, concurrent: int, seconds: float) -> None:
        """A stream sent to ``name`` with ``tokens`` queued prefill there (its own included) and
        ``concurrent`` other requests in flight gave its first chunk after ``seconds``."""
        self._state(name).ttft.observe(tokens, concurrent, seconds)

    def prefill_done(self, name: str, prefill_tokens: int) -> None:
        """A request sent with :meth:`acquire` produced its first token: its prefill is no longer queued."""
        state = self._state(name)
        state.queued_prefill = max(0, state.queued_prefill - prefill_tokens)
        if prefill_tokens > 0:
            state.prefilling = max(0, state.prefilling - 1)
        self._notify()

    def release(self, name: str, prefill_tokens: int = 0) -> None:
        """The request is over; ``prefill_tokens``: what of its prefill :meth:`prefill_done` did not take."""
        state = self._state(name)
        state.in_flight = max(0, state.in_flight - 1)
        state.queued_prefill = max(0, state.queued_prefill - prefill_tokens)
        if prefill_tokens > 0:
            state.prefilling = max(0, state.prefilling - 1)
        if state.draining and state.in_flight == 0:
            self._retire(state)
        self._notify()

    def on_room(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` whenever an endpoint may have more room: a request it was sent produced its
        first token or ended, or a scrape brought new figures (the flow-control queue's wake-up). Returns the
        function that removes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _notify(self) -> None:
        for listener in self._listeners:
            listener()

    def report_success(self, name: str) -> None:
        state = self._state(name)
        state.failures = 0
        self._circuit(state).record_success()

    def report_failure(self, name: str, *, unreachable: bool) -> None:
        """A dispatch failed: it counts towards the circuit; an unreachable endpoint turns unhealthy now."""
        state = self._state(name)
        state.failures += 1
        circuit = self._circuit(state)
        was_closed = circuit.state is CircuitState.CLOSED
        circuit.record_failure()
        if was_closed and circuit.state is CircuitState.OPEN:
            log.warning("endpoint %s: circuit opened after %d failed dispatches", name, state.failures)
        if unreachable:
            self._mark_down(state, "a refused or timed-out connection")

    def begin_attempt(self, name: str) -> CircuitState | None:
        """Claim a dispatch to ``name`` from its circuit: how it was admitted (half-open: as the probe), or
        None when the circuit refuses it now. Pair a claim with :meth:`end_attempt`."""
        endpoint = self._state(name)
        if endpoint.draining:
            return None  # leaving: tried only when nothing else is left
        circuit = self._circuit(endpoint)
        state = circuit.state
        return state if circuit.begin() else None

    def end_attempt(self, name: str, claimed: CircuitState) -> None:
        """The attempt claimed with :meth:`begin_attempt` is over (its verdict, if any, was reported)."""
        if claimed is CircuitState.HALF_OPEN:
            self._circuit(self._state(name)).end()

    def circuit_state(self, name: str) -> CircuitState:
        return self._circuit(self._state(name)).state

    @staticmethod
    def _circuit(state: _EndpointState) -> CircuitBreaker:
        assert state.circuit is not None
        return state.circuit

    def _mark_down(self, state: _EndpointState, why: str) -> None:
        if not state.healthy:
            return
        state.healthy = False
        state.since = self._clock()
        log.warning("endpoint %s marked unhealthy after %s", state.name, why)
        if self._on_down is not None:
            self._on_down(state.name)

    # --- background work ------------------------------------------------------------------------------------

    async def refresh(self) -> None:
        """One health check and one scrape of every endpoint, concurrently."""
        async with anyio.create_task_group() as tg:
            for state in self._states.values():
                tg.start_soon(self._check_then_scrape, state)

    async def _check_then_scrape(self, state: _EndpointState) -> None:
        await self.check_health(state.name)
        await self.scrape(state.name)

    async def run(self) -> None:
        """Scrape and check every endpoint forever (until cancelled), those added meanwhile too."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                for state in list(self._states.values()):
                    self._start(state)
                await anyio.sleep_forever()
        finally:
            self._tg = None

    def _start(self, state: _EndpointState) -> None:
        if self._tg is None:
            return
        state.scope = anyio.CancelScope()
        self._tg.start_soon(self._watch_endpoint, state, state.scope)

    async def _watch_endpoint(self, state: _EndpointState, scope: anyio.CancelScope) -> None:
        with scope:
            if state.joining:
                await self._check_then_scrape(state)
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._every, self._config.scrape_interval_ms, self.scrape, state.name)
                tg.start_soon(
                    self._every, self._config.health_check_interval_ms, self.check_health, state.name
                )

    # --- membership (discovery) -----------------------------------------------------------------------

    def add(self, endpoint: EndpointConfig, *, source: str = "static") -> bool:
        """A new endpoint: checked and scraped at once, schedulable once both succeed. A draining one of
        the same name and URL comes back as it was; a known one with new labels takes them. Whether anything
        changed."""
        name = endpoint.endpoint_name
        known = self._states.get(name)
        if known is not None and known.url == endpoint.url:
            relabelled = known.labels != endpoint.labels
            if relabelled:
                known.labels = _labels(endpoint)
                log.info("endpoint %s has new labels", name)
            if not known.draining:
                if relabelled:
                    self._changed("relabelled")
                return relabelled
            known.draining = False
            known.since = self._clock()
            log.info("endpoint %s is back before it drained", name)
            self._changed("restored")
            return True
        if known is not None:  # same name, new address: the old one leaves first
            self.remove(name)
            self._retire(known)
        self._retired.pop(name, None)
        state = _EndpointState(
            name,
            endpoint.url,
            _labels(endpoint),
            circuit=CircuitBreaker(self._circuit_settings, self._clock),
            source=source,
            joining=True,
            since=self._clock(),
        )
        self._states[name] = state
        log.info("endpoint %s joins at %s (%s)", name, endpoint.url, source)
        self._changed("added")
        self._start(state)
        return True

    def remove(self, name: str) -> bool:
        """Stop scheduling to ``name``; it goes (``on_removed``) once its in-flight requests are over."""
        state = self._states.get(name)
        if state is None or state.draining:
            return False
        state.draining = True
        state.since = self._clock()
        log.info("endpoint %s leaves: draining %d in-flight requests", name, state.in_flight)
        self._changed("removed")
        if state.in_flight == 0:
            self._retire(state)
        return True

    def sync(self, endpoints: Sequence[EndpointConfig], *, source: str) -> None:
        """Make the pool's members ``endpoints``: the new ones join, the missing ones drain."""
        wanted = {e.endpoint_name: e for e in endpoints}
        for name in list(self._states):
            if name not in wanted:
                self.remove(name)
        for endpoint in endpoints:
            self.add(endpoint, source=source)

    def _retire(self, state: _EndpointState) -> None:
        if self._states.get(state.name) is not state:
            return
        del self._states[state.name]
        if state.scope is not None:
            state.scope.cancel()
        self._retired[state.name] = state
        while len(self._retired) > _RETIRED_KEPT:
            del self._retired[next(iter(self._retired))]
        log.info("endpoint %s drained and removed", state.name)
        self._changed("drained")
        if self._on_removed is not None:
            self._on_removed(state.name)

    def _changed(self, change: str) -> None:
        if self._on_change is not None:
            self._on_change(change)

    def statuses(self) -> list[EndpointStatus]:
        """Every member with its state (joining, healthy, unhealthy, draining), sorted by name."""
        return [
            EndpointStatus(s.name, s.url, s.phase, s.source, s.since, s.in_flight)
            for s in sorted(self._states.values(), key=lambda s: s.name)
        ]

    @staticmethod
    async def _every(interval_ms: float, action: Callable[[str], Any], name: str) -> None:
        interval = interval_ms / 1000.0
        deadline = anyio.current_time()
        while True:
            deadline += interval
            now = anyio.current_time()
            if deadline < now:  # fell behind: skip the missed beats
                deadline = now + interval
            await anyio.sleep_until(deadline)
            await action(name)

    async def scrape(self, name: str) -> None:
        """Read ``name``'s ``/metrics``; on success its figures are fresh again."""
        state = self._state(name)
        try:
            status, body = await self._fetch(f"{state.url}/metrics", self._config.scrape_timeout_ms / 1000.0)
            if status != 200:
                raise MetricsFormatError(f"/metrics answered HTTP {status}")
            metrics = state.parser.parse(body.decode("utf-8", errors="replace"))
        except (httpx.ConnectError, httpx.ConnectTimeout):
            self._mark_down(state, "a refused scrape")
            return
        except (httpx.HTTPError, MetricsFormatError) as exc:
            log.debug("scrape of %s failed: %s", name, exc)
            return
        state.metrics = metrics
        state.last_scrape = self._clock()
        _learn_prefill_rate(state, metrics)
        _learn_token_ratio(state, metrics)
        self._notify()

    async def check_health(self, name: str) -> None:
        """``GET /health`` (and ``/v1/models`` when healthy) for ``name``."""
        state = self._state(name)
        timeout = self._config.health_check_timeout_ms / 1000.0
        refused = False
        try:
            status, _ = await self._fetch(f"{state.url}/health", timeout)
            healthy = status == 200
        except httpx.ConnectError:
            healthy, refused = False, True
        except httpx.HTTPError:
            healthy = False
        if healthy and state.joining and state.last_scrape == -math.inf:
            await self.scrape(name)  # a joining endpoint takes traffic only once its figures are known
            healthy = state.last_scrape > -math.inf
        if not healthy:
            state.failed_checks += 1
            if refused or state.failed_checks >= self._config.failed_checks_before_down:
                self._mark_down(state, "a refused health check" if refused else "failed health checks")
            return
        if not state.healthy:
            log.info("endpoint %s is healthy", name)
            state.since = self._clock()
            state.healthy = True
            self._notify()
        state.healthy = True
        state.joining = False
        state.failures = 0
        state.failed_checks = 0
        cards = await self._fetch_models(state.url, timeout_s=timeout)
        if cards is not None and cards != state.model_cards:
            state.model_cards = cards
            state.card_ids = frozenset(str(card.get("id")) for card in cards)

    async def _fetch_models(self, url: str, *, timeout_s: float) -> tuple[dict[str, Any], ...] | None:
        try:
            status, body = await self._fetch(f"{url}/v1/models", timeout_s)
            if status // 100 != 2:
                return None
            data = json.loads(body).get("data")
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        if not isinstance(data, list):
            return None
        return tuple(card for card in data if isinstance(card, dict) and isinstance(card.get("id"), str))


_RATE_WEIGHT = 0.3
"""Weight of a new sample in the prefill rate's moving average."""
_MIN_RATE_SECONDS = 0.05
"""Prefill seconds a sample must cover before it counts (short ones are noise)."""


def _learn_prefill_rate(state: _EndpointState, metrics: ReplicaMetrics) -> None:
    """Update ``state.prefill_rate`` (tokens/s) from the growth of the replica's prefill counters.

    vLLM counts, per finished request, the tokens computed in prefill and the seconds from scheduling to the
    first token; their ratio over a scrape interval is the replica's prefill speed as its requests saw it
    (with other requests' work sharing the steps). A counter going back (a restarted replica) starts over.
    """
    if metrics.prefill_tokens is None or metrics.prefill_seconds is None:
        return
    now = (metrics.prefill_tokens, metrics.prefill_seconds)
    before = state.prefill_counters
    if before is None or now[0] < before[0] or now[1] < before[1]:
        state.prefill_counters = now
        return
    tokens, seconds = now[0] - before[0], now[1] - before[1]
    if seconds < _MIN_RATE_SECONDS or tokens <= 0:
        return  # too little happened: keep accumulating
    state.prefill_counters = now
    sample = tokens / seconds
    rate = state.prefill_rate
    state.prefill_rate = sample if rate is None else rate + _RATE_WEIGHT * (sample - rate)


_MIN_RATIO_PROMPT_TOKENS = 32_768
"""The router's prompt tokens sent to a replica (about a dozen document-QA prompts) before its ratio of
engine tokens to them is trusted."""


def _labels(endpoint: EndpointConfig) -> Mapping[str, str]:
    """A read-only copy of ``endpoint``'s labels."""
    return MappingProxyType(dict(endpoint.labels))


def _learn_token_ratio(state: _EndpointState, metrics: ReplicaMetrics) -> None:
    """Update ``state.engine_tokens_per_prompt_token`` from the replica's prompt-token counter.

    The replica counts each request's prompt tokens at its first token; the router counted the same
    requests' prompt tokens in its own units when it sent them. Their ratio since the count began is how
    many engine tokens a router token comes to there. The requests in flight are counted by the router and
    not yet by the replica, so the ratio reads a little low: by their share of the count, which a minimum
    of :data:`_MIN_RATIO_PROMPT_TOKENS` keeps small. A counter going back (a restarted replica) starts over.
    """
    counted = metrics.prompt_tokens
    if counted is None:
        return
    baseline = state.token_baseline
    if baseline is None or counted < baseline[0]:
        state.token_baseline = (counted, state.sent_prompt_tokens)
        return
    engine = counted - baseline[0]
    sent = state.sent_prompt_tokens - baseline[1]
    if sent >= _MIN_RATIO_PROMPT_TOKENS and engine > 0:
        state.engine_tokens_per_prompt_token = engine / sent
