"""What a replica received, for tests that check what a router sends upstream (opt-in, test only).

``SimPool(..., record_requests=True)`` (or ``SimReplica(..., record_requests=True)``) keeps every inference
request a replica receives (``/v1/chat/completions``, ``/v1/completions``) as it arrives, before any fault
or validation applies: its method, path and headers. A real vLLM keeps no such record; nothing else in
the simulator reads it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One inference request as the replica received it; header names are lower case."""

    method: str
    path: str
    headers: dict[str, str]
