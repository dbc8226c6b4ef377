"""The admission facade: the one call the app makes per request.

``await admission.admit(request)`` returns an :class:`Admitted`: the request's :class:`Decision` (its
endpoint first, then the failover order) and, for tracing and metrics, its window, group, role and wait.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType

from burstsched.admission.assign import Limits, Role
from burstsched.admission.clock import Clock, LoopClock
from burstsched.admission.errors import NoEndpointAvailable
from burstsched.admission.placed_groups import PlacedGroup, PlacedGroups
from burstsched.admission.placement import GroupPlacer, Placed, Produced, Snapshots, first, warm_blocks
from burstsched.admission.window import AdmissionWindow, Batch
from burstsched.config.admission import AdmissionConfig
from burstsched.framework import CycleState, Decision, EndpointSnapshot, SchedRequest
from burstsched.scheduling import Decider


@dataclass(frozen=True, slots=True)
class Admitted:
    """Where a request goes and how it got there.

    ``window_id`` is None when admission is off; ``group_id`` is ``"<window>.<group>"``; ``role`` is leader,
    member or spill for windowed requests, joined for a late member sent at once to the endpoint its group
    of an earlier window went to, and bypass for those scheduled alone at once; ``waited_s`` is the time
    from ``admit`` to the decision (window wait plus placement).
    """

    decision: Decision
    window_id: int | None
    group_id: str | None
    role: Role
    group_size: int
    shared_blocks: int
    waited_s: float
    scheduled_s: float = 0.0
    """The time the scheduler took to decide (for a windowed request: to place its whole window)."""

    @property
    def endpoint(self) -> EndpointSnapshot:
        return self.decision.endpoint


@dataclass(eq=False, slots=True)
class _Held:
    """A request in the window, with what its bypass check's producers found (placement reuses it)."""

    request: SchedRequest
    produced: Produced | None = None
    joins: tuple[PlacedGroup, int] | None = None
    """The placed group this late member joins, and how many leading blocks it shares with it."""


class Admission:
    """Window, grouping and group placement in front of the scheduler; an async context (the app's lifespan).

    ``snapshots(model)`` gives the endpoints serving ``model`` as they are now (e.g. ``pool.snapshots``).
    ``scheduler`` is used through its :class:`~burstsched.scheduling.Decider` contract only.
    """

    def __init__(
        self,
        config: AdmissionConfig,
        scheduler: Decider,
        snapshots: Snapshots,
        *,
        clock: Clock | None = None,
    ) -> None:
        self._config = config
        self._scheduler = scheduler
        self._snapshots = snapshots
        self._clock: Clock = clock or LoopClock()
        self._produced: tuple[Produced, Sequence[EndpointSnapshot]] | None = None
        """The last bypass check's producer results and snapshots, for its immediate scheduling."""
        self._given: tuple[SchedRequest, Sequence[EndpointSnapshot]] | None = None
        """The snapshots the caller of :meth:`admit` passed, while that request is being admitted."""
        self._placer = GroupPlacer(
            scheduler,
            snapshots,
            min_shared_blocks=config.min_shared_blocks,
            limits=Limits(config.max_per_endpoint, config.fair_share_factor),
        )
        self._groups = PlacedGroups(config.min_shared_blocks, config.late_members_ms / 1000)
        self._window: AdmissionWindow[_Held, Admitted] = AdmissionWindow(
            self._place,
            window_s=config.window_ms / 1000,
            max_batch=config.max_batch,
            queue_limit=config.queue_limit,
            retry_after_s=config.retry_after_s,
            bypass=self._bypasses,
            clock=self._clock,
        )

    def reconfigure(self, config: AdmissionConfig) -> None:
        """Swap in new settings (a live config reload): requests already placed keep their decisions, those
        waiting in the open window are placed with the new limits, later windows use the new window."""
        old, self._config = self._config, config
        self._placer = GroupPlacer(
            self._scheduler,
            self._snapshots,
            min_shared_blocks=config.min_shared_blocks,
            limits=Limits(config.max_per_endpoint, config.fair_share_factor),
        )
        if (old.min_shared_blocks, old.late_members_ms) != (config.min_shared_blocks, config.late_members_ms):
            self._groups = PlacedGroups(config.min_shared_blocks, config.late_members_ms / 1000)
        self._window.configure(
            window_s=config.window_ms / 1000,
            max_batch=config.max_batch,
            queue_limit=config.queue_limit,
            retry_after_s=config.retry_after_s,
        )

    @property
    def held(self) -> int:
        """Requests waiting in a window or being placed."""
        return self._window.held

    def reset(self) -> None:
        """Forget where recent groups went (with the scheduler's learned state, e.g. ``/admin/reset``)."""
        self._groups.clear()

    async def __aenter__(self) -> Admission:
        await self._window.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return await self._window.__aexit__(exc_type, exc, tb)

    async def admit(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot] | None = None
    ) -> Admitted:
        """Decide where ``request`` goes, after its window if it waits in one.

        ``endpoints``: the snapshots of ``request.model``'s endpoints taken just now, if the caller has them
        (a request that skips the window is checked and scheduled on them instead of new ones).

        Raises :class:`AdmissionQueueFull` (answer 429 with ``Retry-After: retry_after_s``),
        :class:`NoEndpointAvailable` (503), :class:`AdmissionClosed` (503, shutting down).
        """
        started = self._clock.now()
        self._given = (request, endpoints) if endpoints is not None else None
        try:
            if not self._config.enabled:
                decision = self._schedule_alone(request)
                now = self._clock.now()
                return Admitted(decision, None, None, Role.BYPASS, 1, 0, now - started, now - started)
            a = await self._window.submit(_Held(request))
        finally:
            self._given = None
        waited = self._clock.now() - started
        return Admitted(
            a.decision, a.window_id, a.group_id, a.role, a.group_size, a.shared_blocks, waited, a.scheduled_s
        )

    def _endpoints(self, request: SchedRequest) -> Sequence[EndpointSnapshot]:
        given = self._given
        if given is not None and given[0] is request:
            return given[1]
        return self._snapshots(request.model)

    def bypasses(self, request: SchedRequest) -> bool:
        """Whether ``request`` skips the window: too short to share a group's prefix, warm on an endpoint
        that is healthy and not saturated (with ``bypass_warm``; saturated as the scheduler judges it), or a
        late member of a group placed in the last ``late_members_ms`` whose prefix no such endpoint is known
        to hold as far as the group's does (it joins the group's endpoint, if that is open and below
        ``max_per_endpoint`` of the group)."""
        return self._bypasses(_Held(request))

    def _bypasses(self, held: _Held) -> bool:
        config = self._config
        request = held.request
        chain = request.block_hashes
        if len(chain) < config.min_shared_blocks:
            return True
        placed = self._groups.find(chain, self._clock.now()) if self._groups.enabled else None
        if not config.bypass_warm and placed is None:
            return False
        endpoints = self._endpoints(request)
        scheduler = self._scheduler
        open_ = [e for e in endpoints if e.healthy and not scheduler.saturated(e)]
        if not open_:
            return False
        # the producers run once, over every endpoint: a bypassing request is scheduled on these results,
        # a waiting one is placed on them when it stays alone in its group and nothing changed meanwhile
        version = scheduler.state_version
        state = scheduler.produce(request, endpoints)
        produced = Produced(request, tuple(e.name for e in endpoints), state, version)
        self._produced = (produced, endpoints)
        held.produced = produced
        if placed is not None and self._join(held, placed, state, open_):
            return True
        matched = warm_blocks(state, open_)
        return config.bypass_warm and max(matched.values(), default=0) >= config.min_shared_blocks

    def _join(
        self,
        held: _Held,
        placed: tuple[PlacedGroup, int],
        state: CycleState,
        open_: Sequence[EndpointSnapshot],
    ) -> bool:
        """Whether ``held`` joins the placed group it belongs to (and if so, mark it): the group's endpoint is
        open (healthy, not saturated) and below ``max_per_endpoint`` of the group, and no open endpoint is
        known to hold as much of the prompt as the group shares (else the index decides)."""
        group, shared = placed
        if group.members >= self._config.max_per_endpoint or not any(e.name == group.endpoint for e in open_):
            return False
        if max(warm_blocks(state, open_).values(), default=0) >= shared:
            return False
        held.joins = placed
        group.members += 1
        return True

    def _schedule_alone(self, request: SchedRequest) -> Decision:
        last, self._produced = self._produced, None
        if last is not None and last[0].request is request:  # the bypass check's snapshots and producers
            return self._scheduler.schedule(request, last[1], produced=last[0].state)
        endpoints = self._endpoints(request)
        if not endpoints:
            raise NoEndpointAvailable(f"no endpoint serves model {request.model!r}")
        return self._scheduler.schedule(request, endpoints)

    async def _place(self, batch: Batch[_Held]) -> Mapping[str, Admitted]:
        started = self._clock.now()
        if batch.bypass:
            ((ticket, held),) = batch.entries
            decision = self._schedule_alone(held.request)
            took = self._clock.now() - started
            if held.joins is not None:
                return {ticket: self._joined(batch.window_id, held, decision, took)}
            return {ticket: Admitted(decision, batch.window_id, None, Role.BYPASS, 1, 0, 0.0, took)}
        joined = self._joiners(batch.entries)
        entries = tuple((ticket, held) for ticket, held in batch.entries if ticket not in joined)
        produced = {ticket: held.produced for ticket, held in entries if held.produced is not None}
        placed = self._placer.place([(ticket, held.request) for ticket, held in entries], produced)
        took = self._clock.now() - started
        self._remember(batch.window_id, entries, placed)
        admitted = {ticket: _admitted(batch.window_id, p, took) for ticket, p in placed.items()}
        for ticket, held in joined.items():
            admitted[ticket] = self._joined(batch.window_id, held, self._schedule_alone(held.request), took)
        return admitted

    def _joiners(self, entries: Sequence[tuple[str, _Held]]) -> dict[str, _Held]:
        """The requests of a sealed window that join a group placed in an earlier window: one whose
        placement had not run yet when they arrived (a window is placed just after it seals)."""
        if not self._groups.enabled:
            return {}
        now = self._clock.now()
        joined: dict[str, _Held] = {}
        for ticket, held in entries:
            placed = self._groups.find(held.request.block_hashes, now)
            if placed is None:
                continue
            request = held.request
            endpoints = self._endpoints(request)
            open_ = [e for e in endpoints if e.healthy and not self._scheduler.saturated(e)]
            state = self._scheduler.produce(request, endpoints)
            if self._join(held, placed, state, open_):
                joined[ticket] = held
        return joined

    def _joined(self, window_id: int, held: _Held, decision: Decision, took: float) -> Admitted:
        assert held.joins is not None
        group, shared = held.joins
        decision = first(decision, group.endpoint)
        return Admitted(decision, window_id, group.group_id, Role.JOINED, group.members, shared, 0.0, took)

    def _remember(
        self, window_id: int, entries: Sequence[tuple[str, _Held]], placed: Mapping[str, Placed]
    ) -> None:
        """Record where each group of the window went: its leader's endpoint, with the members sent there."""
        if not self._groups.enabled:
            return
        leaders: dict[int, tuple[str, SchedRequest, Placed]] = {}
        counts: dict[tuple[int, str], int] = {}
        for ticket, held in entries:
            p = placed[ticket]
            endpoint = p.decision.ranked[0].name
            counts[p.group, endpoint] = counts.get((p.group, endpoint), 0) + 1
            if p.role is Role.LEADER and p.group not in leaders:
                leaders[p.group] = (endpoint, held.request, p)
        now = self._clock.now()
        for group, (endpoint, request, p) in leaders.items():
            prefix = request.block_hashes[: p.shared_blocks]
            self._groups.record(f"{window_id}.{group}", prefix, endpoint, counts[group, endpoint], now)


def _admitted(window_id: int, placed: Placed, scheduled_s: float) -> Admitted:
    return Admitted(
        decision=placed.decision,
        window_id=window_id,
        group_id=f"{window_id}.{placed.group}",
        role=placed.role,
        group_size=placed.group_size,
        shared_blocks=placed.shared_blocks,
        waited_s=0.0,
        scheduled_s=scheduled_s,
    )
