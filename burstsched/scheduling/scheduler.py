"""The scheduling engine: producers → filters → weighted scorers → picker, for one request or one group."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from burstsched.framework import (
    CycleState,
    Decision,
    EndpointForgetter,
    EndpointSnapshot,
    PrefixMatch,
    SchedRequest,
    ScoredEndpoint,
)
from burstsched.scheduling.profile import SchedulerProfile

PluginObserver = Callable[[str, str, float], None]
"""Called as ``observer(extension_point, plugin_name, seconds)`` after each plugin call."""

CycleObserver = Callable[[float], None]
"""Called with the seconds one whole ``schedule`` call took."""


class NoEndpointsError(Exception):
    """``schedule`` was given no endpoints."""


class PluginContractError(Exception):
    """A plugin returned something the contracts forbid (e.g. a picker dropping candidates)."""


def clamp_score(value: float) -> float:
    """A score forced into [0, 1]; NaN counts as 0."""
    if math.isnan(value):
        return 0.0
    return 0.0 if value < 0.0 else 1.0 if value > 1.0 else value


class Scheduler:
    """Runs a :class:`SchedulerProfile`.

    ``schedule`` is synchronous and pure apart from the plugins' own state (the picker's tie-break memory,
    the prefix index, which changes only through ``on_dispatch``).
    """

    def __init__(
        self,
        profile: SchedulerProfile,
        *,
        observer: PluginObserver | None = None,
        cycle_observer: CycleObserver | None = None,
        timing_every: int = 1,
    ) -> None:
        if timing_every < 1:
            raise ValueError("timing_every must be at least 1")
        self._profile = profile
        self._version = 0
        self._observer = observer
        self._cycle_observer = cycle_observer
        self._timing_every = timing_every
        self._cycles = [0, 0]  # calls of produce() alone and of schedule() since each was last timed

    @property
    def profile(self) -> SchedulerProfile:
        """The plugins this scheduler runs."""
        return self._profile

    @profile.setter
    def profile(self, profile: SchedulerProfile) -> None:
        """Swap in new plugins (a live config reload); producers' results from the old ones go out of date."""
        self._profile = profile
        self._version += 1

    @property
    def state_version(self) -> int:
        """Changes whenever the plugins' learned state may have changed through this scheduler (a dispatch,
        a reset, a forgotten endpoint, a new profile): producers' results from another version may be out
        of date."""
        return self._version

    def saturated(self, endpoint: EndpointSnapshot) -> bool:
        """Whether ``endpoint`` is saturated by the profile's definition (its saturation filter's, else the
        config's ``saturation:``), the one the saturation filter applies."""
        return self._profile.saturation.saturated(endpoint)

    def _timed(self, which: int) -> bool:
        """Whether this call is one of the sampled ones (one in ``timing_every``) that the observers see."""
        count = self._cycles[which] + 1
        if count >= self._timing_every:
            self._cycles[which] = 0
            return True
        self._cycles[which] = count
        return False

    def produce(self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot]) -> CycleState:
        """Run the producers alone: what they know of ``request`` on each endpoint (e.g. its prefix match).

        Pass the result to :meth:`schedule` (same request, same endpoints) so they do not run twice.
        """
        return self._produce(request, endpoints, self._observer if self._timed(0) else None)

    def _produce(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], observe: PluginObserver | None
    ) -> CycleState:
        state = CycleState()
        for producer in self.profile.producers:
            started = time.perf_counter() if observe else 0.0
            producer.produce(request, endpoints, state)
            if observe:
                observe("producer", producer.name, time.perf_counter() - started)
        return state

    def schedule(
        self,
        request: SchedRequest,
        endpoints: Sequence[EndpointSnapshot],
        *,
        produced: CycleState | None = None,
    ) -> Decision:
        """Rank ``endpoints`` for ``request`` (a single request or a group of ``request.group_size``).

        ``produced``: the producers' state from :meth:`produce` for this request and these endpoints.
        """
        if not endpoints:
            raise NoEndpointsError("no endpoints to schedule on")
        timed = self._timed(1)
        cycle_started = time.perf_counter() if timed else 0.0
        profile = self.profile
        observe = self._observer if timed else None
        state = produced if produced is not None else self._produce(request, endpoints, observe)

        candidates: Sequence[EndpointSnapshot] = endpoints
        for filter_ in profile.filters:
            started = time.perf_counter() if observe else 0.0
            kept = filter_.filter(request, candidates, state)
            if observe:
                observe("filter", filter_.name, time.perf_counter() - started)
            if kept:  # a filter never empties the candidate list: fail open
                candidates = kept

        names = [e.name for e in candidates]
        scores: list[dict[str, float]] = [{} for _ in names]
        totals = [0.0] * len(names)
        for weighted in profile.scorers:
            scorer = weighted.scorer
            started = time.perf_counter() if observe else 0.0
            raw = scorer.score(request, candidates, state)
            if observe:
                observe("scorer", scorer.name, time.perf_counter() - started)
            weight = weighted.weight
            for i, name in enumerate(names):
                value = clamp_score(raw.get(name, 0.0))
                scores[i][scorer.name] = value
                totals[i] += weight * value
        scored = [ScoredEndpoint(e, scores[i], totals[i]) for i, e in enumerate(candidates)]

        picker = profile.picker
        started = time.perf_counter() if observe else 0.0
        ranked = tuple(picker.pick(request, scored))
        if observe:
            observe("picker", picker.name, time.perf_counter() - started)
        if len(ranked) != len(scored) or {s.name for s in ranked} != {s.name for s in scored}:
            raise PluginContractError(f"picker {picker.name!r} must return every candidate exactly once")
        if timed and self._cycle_observer is not None:
            self._cycle_observer(time.perf_counter() - cycle_started)
        matches = {}
        for scored_endpoint in ranked:
            match = state.get(scored_endpoint.name, PrefixMatch)
            if match is not None:
                matches[scored_endpoint.name] = match
        return Decision(ranked, matches)

    def on_dispatch(self, request: SchedRequest, endpoint: EndpointSnapshot) -> None:
        """Tell the dispatch hooks that ``request`` (or its whole group) went to ``endpoint``."""
        self._version += 1
        for hook in self.profile.dispatch_hooks:
            hook.on_dispatch(request, endpoint)

    def reset(self) -> None:
        """Drop every plugin's learned state (e.g. the prefix index)."""
        self._version += 1
        for plugin in self.profile.resettables:
            plugin.reset()

    def forget_endpoint(self, endpoint: str) -> None:
        """Drop what the plugins learned about ``endpoint`` (it went away; its cache is gone with it)."""
        self._version += 1
        for plugin in self.profile.plugins:
            if isinstance(plugin, EndpointForgetter):
                plugin.forget_endpoint(endpoint)
