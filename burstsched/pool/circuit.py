"""A per-endpoint circuit breaker: repeated dispatch failures open it, a successful probe closes it.

States:

- **closed**: every request may go; ``failure_threshold`` consecutive failures open the circuit.
- **open**: no request goes until ``open_s`` has passed; then half-open. Health checks do not shorten the
  wait: a replica can pass ``/health`` and still fail every request.
- **half-open**: one request at a time goes as a probe; its success closes the circuit, its failure opens it
  again for twice as long (up to ``max_open_s``). A probe that ends with neither (the client went away)
  frees the slot for the next one.

Time comes from an injected clock (monotonic seconds), so the breaker is tested without sleeping.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum


class CircuitState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class CircuitSettings:
    """``failure_threshold`` consecutive failures open the circuit for ``open_s`` (doubling up to
    ``max_open_s`` while probes fail)."""

    failure_threshold: int = 3
    open_s: float = 1.0
    max_open_s: float = 30.0

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ValueError("failure_threshold must be at least 1")
        if not 0 < self.open_s <= self.max_open_s:
            raise ValueError("need 0 < open_s <= max_open_s")


class CircuitBreaker:
    """One endpoint's breaker; every method takes no time of its own: ``clock`` says what time it is."""

    def __init__(self, settings: CircuitSettings, clock: Callable[[], float]) -> None:
        self._settings = settings
        self._clock = clock
        self._state = CircuitState.CLOSED
        self._failures = 0
        self._open_for = settings.open_s
        self._retry_at = 0.0
        self._probe_out = False

    @property
    def state(self) -> CircuitState:
        """The state now (an open circuit whose wait is over reads as half-open)."""
        if self._state is CircuitState.OPEN and self._clock() >= self._retry_at:
            self._state = CircuitState.HALF_OPEN
            self._probe_out = False
        return self._state

    def admits(self) -> bool:
        """Whether a request may be sent now (without taking the probe slot)."""
        state = self.state
        return state is CircuitState.CLOSED or (state is CircuitState.HALF_OPEN and not self._probe_out)

    def begin(self) -> bool:
        """Claim the right to send a request now: always when closed, the one probe slot when half-open."""
        state = self.state
        if state is CircuitState.CLOSED:
            return True
        if state is CircuitState.HALF_OPEN and not self._probe_out:
            self._probe_out = True
            return True
        return False

    def end(self) -> None:
        """A request claimed with :meth:`begin` ended without a verdict (e.g. the client went away)."""
        self._probe_out = False

    def record_success(self) -> None:
        self._failures = 0
        self._probe_out = False
        if self._state is not CircuitState.CLOSED:
            self._state = CircuitState.CLOSED
            self._open_for = self._settings.open_s

    def record_failure(self) -> None:
        state = self.state
        self._probe_out = False
        if state is CircuitState.HALF_OPEN:
            self._open(min(self._open_for * 2, self._settings.max_open_s))
            return
        if state is CircuitState.OPEN:
            return  # a request sent before the circuit opened: the wait already runs
        self._failures += 1
        if self._failures >= self._settings.failure_threshold:
            self._open(self._settings.open_s)

    def _open(self, seconds: float) -> None:
        self._state = CircuitState.OPEN
        self._open_for = seconds
        self._retry_at = self._clock() + seconds
        self._failures = 0
