"""Headroom: whether an endpoint has room for one more request from the router's queue (a pure function).

An endpoint has room while the prompt tokens the router sent it that have not produced their first token
would take less than ``max_prefill_ms`` at its measured prefill speed (the pool's ledger, in the router's
tokens, converted to the engine's with the ratio the pool learned), or, until that speed is known, while
fewer than ``max_prefill_requests`` of its requests are before their first token. The replica's KV usage,
its own waiting queue and the router's in-flight count can close it too (each optional but KV usage).
Requests released by the queue but not dispatched yet count as reserved.
"""

from __future__ import annotations

from dataclasses import dataclass

from burstsched.config.flow_control import HeadroomConfig
from burstsched.framework import EndpointSnapshot


@dataclass(slots=True)
class Room:
    """What is left of one endpoint's room during a release pass, in the router's prompt tokens (``tokens``)
    or in requests (``requests``, when its prefill speed is unknown)."""

    name: str
    tokens: float | None
    requests: int
    open: bool
    capacity: float = 0.0
    """Its whole room in the unit it is counted in (``tokens``, else requests before their first token)."""
    blocked: bool = False
    """Closed whatever the prefill: unhealthy, KV usage, the replica's waiting queue or the in-flight cap."""

    def take(self, tokens: int) -> None:
        """A request with ``tokens`` to compute there was released to this endpoint."""
        self.requests -= 1
        if self.tokens is not None:
            self.tokens -= tokens
            self.open = self.open and self.tokens > 0
        else:
            self.open = self.open and self.requests > 0

    def used(self) -> float:
        """The share of its room in use, in [0, 1]: 1 when closed."""
        if not self.open or self.capacity <= 0:
            return 1.0
        left = self.tokens if self.tokens is not None else self.requests
        return min(1.0, max(0.0, 1.0 - left / self.capacity))


@dataclass(slots=True)
class Reserved:
    """Released to an endpoint by the queue, not dispatched yet (the pool does not count it yet)."""

    tokens: int = 0
    requests: int = 0


def room_of(endpoint: EndpointSnapshot, config: HeadroomConfig, reserved: Reserved | None = None) -> Room:
    """The room ``endpoint`` has now."""
    held = reserved or Reserved()
    in_flight = endpoint.in_flight + held.requests
    closed = (
        not endpoint.healthy
        or (not endpoint.stale and endpoint.kv_usage >= config.max_kv_usage)
        or (config.max_waiting is not None and not endpoint.stale and endpoint.waiting > config.max_waiting)
    )
    count_left = (config.max_in_flight - in_flight) if config.max_in_flight is not None else 1 << 30
    speed = endpoint.prefill_tokens_per_s
    if speed is not None and speed > 0:
        per_token = endpoint.engine_tokens_per_prompt_token or 1.0
        budget = speed * config.max_prefill_ms / 1000.0 / per_token
        left = budget - endpoint.queued_prefill_tokens - held.tokens
        is_open = not closed and left > 0 and count_left > 0
        return Room(endpoint.name, left, count_left, is_open, budget, closed or count_left <= 0)
    requests = min(count_left, config.max_prefill_requests - endpoint.prefilling - held.requests)
    blocked = closed or count_left <= 0
    return Room(
        endpoint.name, None, requests, not closed and requests > 0, config.max_prefill_requests, blocked
    )
