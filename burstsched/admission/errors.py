"""Errors raised by the admission layer.

::

    AdmissionError
    ├── AdmissionQueueFull     the window holds queue_limit requests; answer 429 with Retry-After
    ├── AdmissionClosed        the window is not running (before start-up or after shut-down)
    └── NoEndpointAvailable    placement found no endpoint for a group; answer 503
"""

from __future__ import annotations


class AdmissionError(Exception):
    """Base of the admission layer's errors."""


class AdmissionQueueFull(AdmissionError):
    """The admission queue is full; the caller should retry after ``retry_after_s`` seconds."""

    def __init__(self, limit: int, retry_after_s: int) -> None:
        super().__init__(f"admission queue full ({limit} requests waiting); retry after {retry_after_s} s")
        self.limit = limit
        self.retry_after_s = retry_after_s


class AdmissionClosed(AdmissionError):
    """The admission window is not running."""


class NoEndpointAvailable(AdmissionError):
    """No endpoint could take a group."""
