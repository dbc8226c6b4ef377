"""The flow-control queue: requests held in the router while the endpoint they would go to has no room.

``await queue.hold(...)`` after admission decided where a request goes: when the queue is empty for its
model and that endpoint has room (:mod:`.headroom`), the request goes at once, as without flow control.
Otherwise it waits here, and a *release pass* decides, each time an endpoint may have got room (a request's
first token or end, a scrape) and every ``tick`` while anything waits, what goes where:

- queued requests sharing a prefix (the same first ``min_shared_blocks`` block hashes, as a burst window
  groups them) form one group, released together to one endpoint;
- groups are taken by priority band (highest first), then those waiting longer than ``max_reorder_ms``
  (oldest first), then, with round-robin fairness, those of the flows released least in their band (with
  program-aware fairness: of the flows with the least attained service, :mod:`.fairness`), then the warmest
  (the most of their prompt some endpoint holds), then the oldest;
- with per-priority ceilings (:mod:`.ceiling`), a band dispatches only while the pool's room in use is
  below its ceiling; the pass holds it and every lower band;
- a request of a prefix that went to an endpoint in the last ``follow_s`` (a burst member that rode along,
  a group this queue released) follows it there: sent elsewhere, it would compute that prefix again. It
  rides along when what it adds past the shared prefix is small; a queued group following an endpoint goes
  there when that endpoint has room;
- a group whose oldest request has waited ``max_wait_ms`` (when set) goes at once to its best endpoint,
  room or not, and waits in the replica's queue: the hard bound on a wait here;
- each group is ranked by the scheduler, as admission would, over the endpoints with the groups taken
  before it in this pass counted as their load; it goes when its first endpoint has room. Otherwise it waits
  for that endpoint (a warm group waits for its cache rather than computing its prefix again elsewhere), its
  size counted there for the groups after it; an overdue group goes to the best endpoint with room.

Refusals are OpenAI-shaped by the caller (:class:`FlowRefused`): sheddable requests (priority below 0) get
429 instead of waiting, as do requests over the queue's bounds or past ``ttl_ms`` (503 when no endpoint is
ready). A client that disconnects while queued leaves at once; nothing is sent for it.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol

import anyio
import anyio.abc
from starlette.types import Receive

from burstsched.admission import SHARING_ROLES, Admitted, Role
from burstsched.admission.clock import Clock, LoopClock
from burstsched.admission.grouping import shared_blocks
from burstsched.admission.placement import first
from burstsched.config.flow_control import FlowControlConfig
from burstsched.flow.ceiling import CeilingGate, Ceilings
from burstsched.flow.fairness import AttainedService
from burstsched.flow.headroom import Reserved, Room, room_of
from burstsched.flow.identity import Identity
from burstsched.framework import (
    CycleState,
    Decision,
    EndpointSnapshot,
    PrefixMatch,
    SchedRequest,
    tokens_past,
    uncached_tokens,
)
from burstsched.scheduling import Decider

log = logging.getLogger(__name__)

Snapshots = Callable[[str], Sequence[EndpointSnapshot]]
MAX_GROUPS_PER_PASS = 256
"""Groups one release pass ranks at most (in its order): bounds a pass's work under a deep queue."""
TICK_S = 0.05
"""How often a pass runs while requests wait, besides the pool's wake-ups (TTLs, overdue requests)."""


class FlowRefused(Exception):
    """The queue refuses a request: answer ``status`` with ``message`` (and ``Retry-After`` if set)."""

    def __init__(self, status: int, message: str, reason: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason
        self.retry_after_s = retry_after_s


class Disconnected(Exception):
    """The client went away while its request was queued."""


class FlowMetrics(Protocol):
    """What the queue reports (the router's metrics implement it)."""

    def flow_depth(self, priority: int, flow: str, delta: int) -> None: ...

    def flow_done(self, priority: int, outcome: str, waited_s: float, overtook: int) -> None: ...


class RoomSource(Protocol):
    """Who tells the queue when endpoints may have more room, and what one endpoint looks like now (the
    endpoint pool)."""

    def on_room(self, listener: Callable[[], None]) -> Callable[[], None]: ...

    def member(self, name: str) -> EndpointSnapshot | None:
        """Endpoint ``name`` now; None when it is no longer in the pool."""
        ...


@dataclass(frozen=True, slots=True)
class Released:
    """Where a request goes, as the queue let it: ``role`` leader (computes its group's prefix) or member
    (shares ``shared_blocks`` leading blocks with its group's leader, sent with it); ``queued`` false when it
    went straight through."""

    decision: Decision
    role: Role
    shared_blocks: int
    waited_s: float
    queued: bool
    overtook: int = 0
    """Requests queued before it that were still waiting when it was released."""


@dataclass(eq=False, slots=True)
class _Item:
    seq: int
    request: SchedRequest
    identity: Identity
    size: int
    since: float
    key: Hashable
    done: anyio.Event = field(default_factory=anyio.Event)
    released: Released | None = None
    refused: FlowRefused | None = None
    reserved: tuple[str, int] | None = None


@dataclass(slots=True)
class _Outcome:
    """One outcome's tally since start: how many, the longest any waited, the most one overtook (the
    histogram's buckets say neither exactly; ``GET /admin/queue`` shows them)."""

    requests: int = 0
    longest_wait_s: float = 0.0
    most_overtaken: int = 0


@dataclass(slots=True)
class _Band:
    requests: int = 0
    bytes: int = 0
    flows: dict[str, int] = field(default_factory=dict)
    served: dict[str, int] = field(default_factory=dict)
    """Requests released per flow, for round-robin fairness (flows with nothing queued are forgotten)."""


class FlowQueue:
    """The router's flow-control queue; an async context (the app's lifespan runs its release loop)."""

    def __init__(
        self,
        config: FlowControlConfig,
        scheduler: Decider,
        snapshots: Snapshots,
        *,
        min_shared_blocks: int,
        max_per_endpoint: int,
        follow_s: float = 0.0,
        room_source: RoomSource | None = None,
        metrics: FlowMetrics | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._config = config
        self._scheduler = scheduler
        self._snapshots = snapshots
        self._key_at = min_shared_blocks - 1
        self._max_per_endpoint = max_per_endpoint
        self._follow_s = follow_s
        self._sent: dict[tuple[str, int], _Sent] = {}
        """Per (model, group prefix): where its last request went, until ``follow_s`` after."""
        self._sweep_at = 64
        self._room_source = room_source
        self._metrics = metrics
        self._clock: Clock = clock or LoopClock()
        self._items: dict[int, _Item] = {}
        self._order: list[int] = []
        """Queued items' sequence numbers, ascending (arrival order)."""
        self._bands: dict[int, _Band] = {}
        self._models: dict[str, int] = {}
        self._prefixes: dict[tuple[str, int], int] = {}
        """Queued requests per (model, group prefix): a request of a queued group waits with it."""
        self._reserved: dict[str, Reserved] = {}
        self._bytes = 0
        self._seq = 0
        self._wake = anyio.Event()
        self._ready_waiters: list[anyio.Event] = []
        self._tasks: anyio.abc.TaskGroup | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._service = AttainedService(config.program_aware) if config.fairness == "program-aware" else None
        self._ceilings = Ceilings(config.ceilings) if config.ceilings is not None else None
        self._outcomes: dict[str, _Outcome] = {}
        """Requests that left the queue (or were refused at its door) since start, by outcome."""

    # --- lifecycle ------------------------------------------------------------------------------------

    async def __aenter__(self) -> FlowQueue:
        tasks = anyio.create_task_group()
        await tasks.__aenter__()
        self._tasks = tasks
        if self._room_source is not None:
            self._unsubscribe = self._room_source.on_room(self._poke)
        tasks.start_soon(self._run)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        for item in list(self._items.values()):
            self._refuse(item, FlowRefused(503, "the router is shutting down", "shutdown"))
        tasks, self._tasks = self._tasks, None
        assert tasks is not None
        tasks.cancel_scope.cancel()
        return await tasks.__aexit__(exc_type, exc, tb)

    # --- the request's side ---------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        return len(self._items)

    async def hold(
        self,
        request: SchedRequest,
        admitted: Admitted,
        identity: Identity,
        size: int,
        receive: Receive | None = None,
    ) -> Released:
        """Wait until ``request`` may go; return where. Raises :class:`FlowRefused` or
        :class:`Disconnected` (``receive``: the client's ASGI receive, watched for its disconnect)."""
        now = self._clock.now()
        decision = admitted.decision
        sent = self._following(request, now)
        if sent is not None and _unknown_there(request, decision, sent):
            decision = first(decision, sent.endpoint)
            admitted = dataclasses.replace(admitted, decision=decision)
        room = self._room_now(request.model, decision.ranked[0].name)
        if room is not None and (
            (self._opens(room, identity.priority) and not self._models.get(request.model))
            or (self._rides_along(request, admitted, room, sent) and not self._group_queued(request))
        ):
            self._note_sent(request, room.name, now)
            return Released(decision, admitted.role, admitted.shared_blocks, 0.0, queued=False)
        config = self._config
        if identity.sheddable:
            self._record(identity.priority, "shed", 0.0)
            raise FlowRefused(
                429,
                f"the pool has no room and this request's priority ({identity.priority}) is sheddable",
                "shed",
                config.retry_after_s,
            )
        self._check_bounds(identity.priority, size)
        self._seq += 1
        key: Hashable = (
            (request.model, identity.priority, request.block_hashes[self._key_at])
            if len(request.block_hashes) > self._key_at
            else (request.model, identity.priority, -self._seq)
        )
        item = _Item(self._seq, request, identity, size, now, key)
        self._add(item)
        self._poke()
        try:
            async with anyio.create_task_group() as tg:
                if receive is not None:
                    tg.start_soon(_watch_disconnect, receive, item.done, tg.cancel_scope)
                await item.done.wait()
                tg.cancel_scope.cancel()
        finally:
            if item.seq in self._items:  # cancelled or disconnected while queued: leave now
                self._remove(item)
                self._record(identity.priority, "cancelled", self._clock.now() - item.since)
            self._unreserve(item)  # released: the caller dispatches it now (or was cancelled meanwhile)
        if item.released is None and item.refused is None:
            raise Disconnected()
        if item.refused is not None:
            raise item.refused
        assert item.released is not None
        return item.released

    async def wait_ready(self, ready: Callable[[], bool]) -> None:
        """Wait until ``ready()`` (e.g. the pool has a healthy endpoint), at most ``no_endpoint_wait_ms``;
        checked whenever the pool reports a change, and every tick."""
        with anyio.move_on_after(self._config.no_endpoint_wait_ms / 1000.0):
            while not ready():
                event = anyio.Event()
                self._ready_waiters.append(event)
                with anyio.move_on_after(TICK_S):
                    await event.wait()

    def completed(self, flow: str, prompt_tokens: int, output_tokens: int) -> None:
        """A request of ``flow`` finished having used these tokens (program-aware fairness counts them)."""
        if self._service is not None:
            self._service.add(flow, prompt_tokens, output_tokens, self._clock.now())

    def _check_bounds(self, priority: int, size: int) -> None:
        config = self._config
        band = self._bands.get(priority, _Band())
        bounds = config.bands.get(priority)
        full = len(self._items) >= config.max_requests or self._bytes + size > config.max_bytes
        if bounds is not None:
            full = full or (bounds.max_requests is not None and band.requests >= bounds.max_requests)
            full = full or (bounds.max_bytes is not None and band.bytes + size > bounds.max_bytes)
        if full:
            self._record(priority, "full", 0.0)
            raise FlowRefused(429, "the router's queue is full", "full", config.retry_after_s)

    # --- bookkeeping ----------------------------------------------------------------------------------

    def _add(self, item: _Item) -> None:
        self._items[item.seq] = item
        self._models[item.request.model] = self._models.get(item.request.model, 0) + 1
        prefix = self._prefix(item.request)
        if prefix is not None:
            self._prefixes[prefix] = self._prefixes.get(prefix, 0) + 1
        self._order.append(item.seq)
        band = self._bands.setdefault(item.identity.priority, _Band())
        band.requests += 1
        band.bytes += item.size
        flow = item.identity.flow
        if flow not in band.flows:
            band.served.setdefault(flow, min(band.served.values(), default=0))
        band.flows[flow] = band.flows.get(flow, 0) + 1
        self._bytes += item.size
        if self._metrics is not None:
            self._metrics.flow_depth(item.identity.priority, flow, 1)

    def _remove(self, item: _Item) -> None:
        del self._items[item.seq]
        model = item.request.model
        self._models[model] -= 1
        if self._models[model] == 0:
            del self._models[model]
        prefix = self._prefix(item.request)
        if prefix is not None:
            self._prefixes[prefix] -= 1
            if self._prefixes[prefix] == 0:
                del self._prefixes[prefix]
        index = bisect.bisect_left(self._order, item.seq)
        del self._order[index]
        band = self._bands[item.identity.priority]
        band.requests -= 1
        band.bytes -= item.size
        flow = item.identity.flow
        band.flows[flow] -= 1
        if band.flows[flow] == 0:
            del band.flows[flow]
            band.served.pop(flow, None)
        if band.requests == 0:
            del self._bands[item.identity.priority]
        self._bytes -= item.size
        if self._metrics is not None:
            self._metrics.flow_depth(item.identity.priority, flow, -1)

    def _record(self, priority: int, outcome: str, waited_s: float, overtook: int = 0) -> None:
        tally = self._outcomes.setdefault(outcome, _Outcome())
        tally.requests += 1
        tally.longest_wait_s = max(tally.longest_wait_s, waited_s)
        tally.most_overtaken = max(tally.most_overtaken, overtook)
        if self._metrics is not None:
            self._metrics.flow_done(priority, outcome, waited_s, overtook)

    def _refuse(self, item: _Item, refusal: FlowRefused) -> None:
        self._remove(item)
        item.refused = refusal
        self._record(item.identity.priority, refusal.reason, self._clock.now() - item.since)
        item.done.set()

    def _release(self, item: _Item, released: Released, endpoint: str, tokens: int) -> None:
        overtook = bisect.bisect_left(self._order, item.seq)
        self._remove(item)
        band = self._bands.get(item.identity.priority)
        if band is not None and item.identity.flow in band.served:
            band.served[item.identity.flow] += 1
        item.released = dataclasses.replace(released, overtook=overtook)
        reserved = self._reserved.setdefault(endpoint, Reserved())
        reserved.tokens += tokens
        reserved.requests += 1
        item.reserved = (endpoint, tokens)
        self._record(item.identity.priority, "released", released.waited_s, overtook)
        item.done.set()

    def _unreserve(self, item: _Item) -> None:
        """The released request is being dispatched now: the pool counts it from here on."""
        if item.reserved is None:
            return
        endpoint, tokens = item.reserved
        item.reserved = None
        reserved = self._reserved.get(endpoint)
        if reserved is not None:
            reserved.tokens -= tokens
            reserved.requests -= 1
            if reserved.requests <= 0:
                del self._reserved[endpoint]

    def _room_now(self, model: str, name: str) -> Room | None:
        """Endpoint ``name``'s room now (its current snapshot, this queue's reservations); None: gone.

        Every request that reaches the queue asks this once, so with a room source it reads that one
        endpoint, not the whole pool (the decision already chose it among endpoints serving ``model``)."""
        if self._room_source is not None:
            endpoint = self._room_source.member(name)
            return None if endpoint is None else self._room(endpoint)
        for endpoint in self._snapshots(model):
            if endpoint.name == name:
                return self._room(endpoint)
        return None

    def _prefix(self, request: SchedRequest) -> tuple[str, int] | None:
        """The group prefix ``request`` would be queued under: its chain hash at the group's last shared
        block (None: the request is shorter than a group's prefix)."""
        hashes = request.block_hashes
        return (request.model, hashes[self._key_at]) if len(hashes) > self._key_at else None

    def _group_queued(self, request: SchedRequest) -> bool:
        """Requests of ``request``'s group wait in the queue: it waits with them, to be released together
        (riding along alone, it would compute their prefix where they may not go)."""
        prefix = self._prefix(request)
        return prefix is not None and prefix in self._prefixes

    def _following(self, request: SchedRequest, now: float) -> _Sent | None:
        """Where the last request of ``request``'s group prefix went, in the last ``follow_s``."""
        prefix = self._prefix(request)
        sent = self._sent.get(prefix) if prefix is not None else None
        if sent is None or sent.until <= now:
            return None
        return sent

    def _note_sent(self, request: SchedRequest, endpoint: str, now: float) -> None:
        """``request`` goes to ``endpoint`` now: later requests of its group prefix follow it there."""
        prefix = self._prefix(request)
        if prefix is None or self._follow_s <= 0:
            return
        self._sent[prefix] = _Sent(endpoint, request.block_hashes, now + self._follow_s)
        if len(self._sent) >= self._sweep_at:
            self._sent = {k: v for k, v in self._sent.items() if v.until > now}
            self._sweep_at = max(64, 2 * len(self._sent))

    def _rides_along(
        self, request: SchedRequest, admitted: Admitted, room: Room, sent: _Sent | None = None
    ) -> bool:
        """A request with at most ``ride_along_tokens`` of its prompt to compute on its endpoint goes at
        once, room or not (unless the endpoint is blocked): vLLM schedules so small a prefill with the
        chunks of the one ahead, so holding it here would only add to its wait. A burst member (or a late
        member that joined its group) counts only what follows its group's shared prefix, which its leader
        is computing there now: held, it could be released elsewhere and split the burst. So does a request
        following its group prefix to where it went (``sent``), past the prefix it shares with that one."""
        limit = self._config.headroom.ride_along_tokens
        if limit <= 0 or room.blocked:
            return False
        own = uncached_tokens(request, admitted.decision.matches.get(room.name))
        if admitted.role in SHARING_ROLES:
            own = min(own, tokens_past(request, admitted.shared_blocks))
        if sent is not None and sent.endpoint == room.name:
            own = min(own, tokens_past(request, shared_blocks(sent.chain, request.block_hashes)))
        return own <= limit

    def _opens(self, room: Room, priority: int) -> bool:
        """Whether ``room`` takes a request of band ``priority``: it is open, and less of it is in use than
        the band's ``room_share``."""
        bounds = self._config.bands.get(priority)
        share = bounds.room_share if bounds is not None else None
        return room.open and (share is None or room.used() < share)

    def _opener(self, rooms: Mapping[str, Room], priority: int, overdue: bool) -> Callable[[str], bool]:
        """Whether an endpoint has room for a group of band ``priority`` in this pass: any room for an
        overdue group (nothing waits past ``max_reorder_ms`` for a band's share), else its band's share."""
        if overdue:
            return lambda name: rooms[name].open
        return lambda name: self._opens(rooms[name], priority)

    def _room(self, endpoint: EndpointSnapshot) -> Room:
        return room_of(endpoint, self._config.headroom, self._reserved.get(endpoint.name))

    def describe(self) -> dict[str, object]:
        """The queue now, for ``GET /admin/queue``."""
        now = self._clock.now()
        oldest: dict[int, float] = {}
        for item in self._items.values():
            priority = item.identity.priority
            oldest[priority] = max(oldest.get(priority, 0.0), now - item.since)
        bands = {
            str(priority): {
                "requests": band.requests,
                "bytes": band.bytes,
                "oldest_wait_s": round(oldest.get(priority, 0.0), 3),
                "flows": dict(sorted(band.flows.items())),
            }
            for priority, band in sorted(self._bands.items(), reverse=True)
        }
        return {
            "enabled": True,
            "requests": len(self._items),
            "bytes": self._bytes,
            "bands": bands,
            "reserved": {name: r.requests for name, r in sorted(self._reserved.items())},
            "since_start": {
                outcome: {
                    "requests": tally.requests,
                    "longest_wait_s": round(tally.longest_wait_s, 3),
                    "most_overtaken": tally.most_overtaken,
                }
                for outcome, tally in sorted(self._outcomes.items())
            },
        }

    # --- the release loop -----------------------------------------------------------------------------

    def _poke(self) -> None:
        self._wake.set()
        waiters, self._ready_waiters = self._ready_waiters, []
        for event in waiters:
            event.set()

    async def _run(self) -> None:
        while True:
            self._wake = anyio.Event()
            if self._items:
                try:
                    self.release_pass()
                except Exception:  # a bug here must not strand every queued request
                    log.exception("flow control: release pass failed")
            timeout = TICK_S if self._items else None
            with anyio.move_on_after(timeout):
                await self._wake.wait()

    def release_pass(self) -> None:
        """Refuse what expired, then release what may go now (see the module's docstring)."""
        now = self._clock.now()
        self._expire(now)
        models: dict[str, list[_Item]] = {}
        for seq in self._order:
            item = self._items[seq]
            models.setdefault(item.request.model, []).append(item)
        for model, items in models.items():
            self._release_model(model, items, now)

    def _expire(self, now: float) -> None:
        config = self._config
        ttl = config.ttl_ms / 1000.0
        no_endpoint = config.no_endpoint_wait_ms / 1000.0
        ready: dict[str, bool] = {}
        for seq in list(self._order):
            item = self._items[seq]
            model = item.request.model
            if model not in ready:
                ready[model] = any(e.healthy for e in self._snapshots(model))
            waited = now - item.since
            if not ready[model] and waited >= no_endpoint:
                self._refuse(
                    item, FlowRefused(503, f"no endpoint is ready to serve {model!r}", "no_endpoint")
                )
            elif waited >= ttl:
                status = 429 if ready[model] else 503
                message = f"the request waited {waited:.1f} s in the router's queue, its limit (ttl_ms)"
                self._refuse(item, FlowRefused(status, message, "expired", config.retry_after_s))

    def _release_model(self, model: str, items: list[_Item], now: float) -> None:
        endpoints = self._snapshots(model)
        rooms = {e.name: self._room(e) for e in endpoints}
        max_wait = self._config.max_wait_ms / 1000.0 if self._config.max_wait_ms is not None else None
        due = max_wait is not None and now - items[0].since >= max_wait  # items: in arrival order
        if not due and not any(r.open for r in rooms.values()):
            return
        reorder = self._config.max_reorder_ms / 1000.0
        groups = self._groups(items, now, reorder)
        states: list[tuple[tuple[object, ...], list[_Item], SchedRequest, CycleState]] = []
        for members, cheap_key in groups[:MAX_GROUPS_PER_PASS]:
            leader = members[0].request
            as_one = dataclasses.replace(leader, group_size=len(members))
            state = self._scheduler.produce(as_one, endpoints)
            warmth = _warmth(state, endpoints, len(leader.block_hashes))
            states.append(((*cheap_key[:3], -warmth, *cheap_key[3:]), members, as_one, state))
        states.sort(key=lambda entry: entry[0])
        pending: dict[str, int] = {}
        backlog = _Backlog(endpoints, self._reserved)
        gate = self._ceiling_gate(endpoints, rooms)
        for sort_key, members, as_one, state in states:
            forced = max_wait is not None and now - members[0].since >= max_wait
            if not forced and not any(r.open for r in rooms.values()):
                if not due:
                    return
                continue  # only groups past max_wait_ms go now
            if not forced and gate is not None and not gate.allows(members[0].identity.priority):
                continue  # its band is at its ceiling: it stays queued
            overdue = sort_key[1] == 0
            loaded = [dataclasses.replace(e, pending=e.pending + pending.get(e.name, 0)) for e in endpoints]
            decision = self._scheduler.schedule(as_one, loaded, produced=state)
            ranked = [scored.name for scored in decision.ranked]
            if not ranked:
                continue
            members = members[: self._max_per_endpoint]
            own = _own_tokens(members, decision)
            opens = self._opener(rooms, members[0].identity.priority, overdue)
            sent = self._following(as_one, now)
            if sent is not None and sent.endpoint in rooms and opens(sent.endpoint):
                target: str | None = sent.endpoint
            else:
                target = _target(ranked, opens, backlog, own, overdue, self._config.stay_margin)
            if target is None and forced:
                target = ranked[0]  # past max_wait_ms: it goes, and waits in the replica
            if target is None:
                pending[ranked[0]] = pending.get(ranked[0], 0) + len(members)
                backlog.add(ranked[0], own(ranked[0]))
                continue
            self._release_group(members, decision, target, rooms[target], now)
            pending[target] = pending.get(target, 0) + len(members)
            backlog.add(target, own(target))

    def _groups(
        self, items: list[_Item], now: float, reorder: float
    ) -> list[tuple[list[_Item], tuple[object, ...]]]:
        """The queued groups of one model, with their order key before warmth: (-priority, not overdue,
        fairness count, then (after warmth) the oldest member's arrival)."""
        grouped: dict[Hashable, list[_Item]] = {}
        for item in items:  # arrival order: each group's first member is its oldest
            grouped.setdefault(item.key, []).append(item)
        round_robin = self._config.fairness == "round-robin"
        least_served = self._least_served_first(items, now)
        out: list[tuple[list[_Item], tuple[object, ...]]] = []
        for members in grouped.values():
            oldest = members[0]
            priority = oldest.identity.priority
            overdue = now - oldest.since >= reorder
            served: float = 0
            if round_robin:
                band = self._bands.get(priority)
                served = min((band.served.get(m.identity.flow, 0) for m in members), default=0) if band else 0
            elif least_served is not None:
                served = min(least_served[priority, m.identity.flow] for m in members)
            out.append((members, (-priority, 0 if overdue else 1, served, oldest.seq)))
        out.sort(key=lambda entry: entry[1])
        return out

    def _least_served_first(self, items: list[_Item], now: float) -> dict[tuple[int, str], float] | None:
        """Program-aware fairness: each (band, flow)'s rank in this pass (lower goes first: minus its least
        attained service score among the band's waiting flows); None under other fairness."""
        if self._service is None:
            return None
        head_waits: dict[int, dict[str, float]] = {}
        for item in items:  # arrival order: a flow's first item is its oldest
            flows = head_waits.setdefault(item.identity.priority, {})
            flows.setdefault(item.identity.flow, now - item.since)
        return {
            (priority, flow): -score
            for priority, flows in head_waits.items()
            for flow, score in self._service.scores(flows, now).items()
        }

    def _ceiling_gate(
        self, endpoints: Sequence[EndpointSnapshot], rooms: Mapping[str, Room]
    ) -> CeilingGate | None:
        """Per-priority dispatch ceilings over this pass (None: none configured)."""
        if self._ceilings is None:
            return None
        healthy = [rooms[e.name] for e in endpoints if e.healthy]
        return CeilingGate(self._ceilings, healthy, list(self._bands))

    def _release_group(
        self, members: Sequence[_Item], decision: Decision, target: str, room: Room, now: float
    ) -> None:
        leader = members[0].request
        chosen = first(decision, target)
        match = decision.matches.get(target)
        self._note_sent(leader, target, now)
        for index, item in enumerate(members):
            request = item.request
            if index == 0:
                tokens = uncached_tokens(request, match)
                released = Released(chosen, Role.LEADER, 0, now - item.since, queued=True)
            else:
                shared = shared_blocks(leader.block_hashes, request.block_hashes)
                tokens = tokens_past(request, shared)
                released = Released(chosen, Role.MEMBER, shared, now - item.since, queued=True)
            room.take(tokens)
            self._release(item, released, target, tokens)


@dataclass(frozen=True, slots=True)
class _Sent:
    """Where a group prefix's last request went (``chain``: its block hashes), and until when others
    follow it."""

    endpoint: str
    chain: Sequence[Hashable]
    until: float


def _unknown_there(request: SchedRequest, decision: Decision, sent: _Sent) -> bool:
    """The decision's first endpoint is not ``sent``'s and is not known to hold the prefix ``request``
    shares with ``sent``'s request (a gap the prefix index has not caught up with): it follows ``sent``."""
    name = decision.ranked[0].name
    if name == sent.endpoint:
        return False
    shared = shared_blocks(sent.chain, request.block_hashes)
    match = decision.matches.get(name)
    return match is None or match.matched_blocks * match.block_tokens < shared * request.block_tokens


class _Backlog:
    """Per endpoint, during one pass: the prompt tokens ahead of the next group there (the router's queued
    prefill, what this queue released but did not dispatch yet, and what groups earlier in the pass were
    released there or chose to wait for), and its prefill speed (1 for all when one is unknown: tokens are
    then compared as they are)."""

    def __init__(self, endpoints: Sequence[EndpointSnapshot], reserved: Mapping[str, Reserved]) -> None:
        self.tokens: dict[str, float] = {}
        self.speed: dict[str, float] = {}
        known = all(e.prefill_tokens_per_s for e in endpoints)
        for e in endpoints:
            held = reserved.get(e.name)
            self.tokens[e.name] = e.queued_prefill_tokens + (held.tokens if held is not None else 0)
            rate = (e.prefill_tokens_per_s or 1.0) / (e.engine_tokens_per_prompt_token or 1.0)
            self.speed[e.name] = rate if known else 1.0

    def add(self, name: str, tokens: int) -> None:
        self.tokens[name] = self.tokens.get(name, 0.0) + tokens

    def ttft(self, name: str, own: int) -> float:
        """Seconds (or tokens) until a group computing ``own`` tokens there has its first token."""
        return (self.tokens.get(name, 0.0) + own) / self.speed.get(name, 1.0)


def _target(
    ranked: Sequence[str],
    opens: Callable[[str], bool],
    backlog: _Backlog,
    own: Callable[[str], int],
    overdue: bool,
    stay_margin: float,
) -> str | None:
    """Where a group goes now: its first-ranked endpoint if that has room. Else the endpoint with room
    where it would get its first token soonest, if that is no later than by waiting for its first choice
    (whose backlog it then joins): a cold group takes any room; a group warmer at its first choice moves
    only when waiting there costs more than ``1 + stay_margin`` times its first token elsewhere (moving
    computes its prefix again and adds that to the pool's work, so an estimate's error must not move it).
    An overdue group takes the best-ranked room. None: it waits. (``opens``: whether an endpoint has room for
    this group's band.)"""
    first_choice = ranked[0]
    if opens(first_choice):
        return first_choice
    with_room = [name for name in ranked if opens(name)]
    if not with_room:
        return None
    if overdue:
        return with_room[0]
    best = min(with_room, key=lambda name: backlog.ttft(name, own(name)))
    margin = 1.0 + stay_margin if own(best) > own(first_choice) else 1.0
    if backlog.ttft(best, own(best)) * margin <= backlog.ttft(first_choice, own(first_choice)):
        return best
    return None


def _own_tokens(members: Sequence[_Item], decision: Decision) -> Callable[[str], int]:
    """The prompt tokens a group would compute on an endpoint: its leader's uncached ones there, and each
    member's part past the prefix it shares with the leader."""
    leader = members[0].request
    tails = 0
    for item in members[1:]:
        shared = shared_blocks(leader.block_hashes, item.request.block_hashes)
        tails += tokens_past(item.request, shared)

    def on(name: str) -> int:
        return uncached_tokens(leader, decision.matches.get(name)) + tails

    return on


def _warmth(state: CycleState, endpoints: Sequence[EndpointSnapshot], total: int) -> float:
    """The largest share of the request's blocks any endpoint holds (0: cold everywhere)."""
    if total <= 0:
        return 0.0
    best = 0
    for endpoint in endpoints:
        match = state.get(endpoint.name, PrefixMatch)
        if match is not None and match.total_blocks > 0:
            best = max(best, round(match.matched_blocks * total / match.total_blocks))
    return best / total


async def _watch_disconnect(receive: Receive, done: anyio.Event, scope: anyio.CancelScope) -> None:
    """Return when the client disconnects (cancelling the wait), unless its request is decided first."""
    while not done.is_set():
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return
