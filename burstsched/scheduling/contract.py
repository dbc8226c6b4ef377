"""What the rest of the router needs of the scheduler: the :class:`Decider` contract.

Admission depends on this Protocol, not on the :class:`~burstsched.scheduling.Scheduler` class or its
profile: it runs the producers once, schedules on their results, and asks whether an endpoint is
saturated by the same definition the saturation filter applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from burstsched.framework import CycleState, Decision, EndpointSnapshot, SchedRequest


class Decider(Protocol):
    """Decides where requests go (the :class:`~burstsched.scheduling.Scheduler`)."""

    def produce(self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot]) -> CycleState:
        """The producers' results for ``request`` on ``endpoints`` (e.g. each one's prefix match)."""
        ...

    def schedule(
        self,
        request: SchedRequest,
        endpoints: Sequence[EndpointSnapshot],
        *,
        produced: CycleState | None = None,
    ) -> Decision:
        """Rank ``endpoints`` for ``request``; ``produced``: :meth:`produce`'s results for the same request
        and endpoint names, taken at the current :attr:`state_version` (the producers do not run again)."""
        ...

    def saturated(self, endpoint: EndpointSnapshot) -> bool:
        """Whether ``endpoint`` is saturated (the router's one definition)."""
        ...

    @property
    def state_version(self) -> int:
        """Changes whenever producers' results taken before may be out of date."""
        ...
