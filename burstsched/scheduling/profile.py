"""A scheduling profile: the plugins one scheduling call runs, in order."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from burstsched.framework import (
    DispatchHook,
    EndpointEcho,
    Filter,
    HeaderReader,
    Picker,
    Plugin,
    Producer,
    Resettable,
    Saturation,
    Scorer,
)


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    """A scorer and the weight its clamped scores get in the total."""

    scorer: Scorer
    weight: float


@dataclass(frozen=True)
class SchedulerProfile:
    """Producers, filters and weighted scorers (each run in order) and the picker.

    ``saturation`` is what "saturated" means for this profile's decisions: its saturation filter's
    thresholds, or the config's ``saturation:`` section when it has none.
    """

    producers: tuple[Producer, ...]
    filters: tuple[Filter, ...]
    scorers: tuple[WeightedScorer, ...]
    picker: Picker
    dispatch_hooks: tuple[DispatchHook, ...] = ()
    resettables: tuple[Resettable, ...] = ()
    saturation: Saturation = field(default_factory=Saturation)

    @property
    def plugins(self) -> tuple[Plugin, ...]:
        """Every plugin of the profile once, in order."""
        seen: dict[int, Plugin] = {}
        everything: list[Plugin] = [
            *self.producers,
            *self.filters,
            *(w.scorer for w in self.scorers),
            self.picker,
            *self.dispatch_hooks,
            *self.resettables,
        ]
        for plugin in everything:
            seen.setdefault(id(plugin), plugin)
        return tuple(seen.values())

    @cached_property
    def request_headers(self) -> frozenset[str]:
        """The client request headers the profile's plugins read (lower case); worked out once."""
        return frozenset(h for p in self.plugins if isinstance(p, HeaderReader) for h in p.request_headers)

    @cached_property
    def echo_headers(self) -> tuple[str, ...]:
        """The response headers that carry the serving endpoint's token back to the client."""
        found = (h for p in self.plugins if isinstance(p, EndpointEcho) for h in p.echo_headers)
        return tuple(dict.fromkeys(found))
