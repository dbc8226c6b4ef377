"""Fault injection for a replica: errors, stalls before the first byte, cut connections, a dead ``/metrics``.

Set through ``POST /sim/faults`` (JSON with any of the fields; ``{}`` clears all) or the Python API.
``error_rate`` is the chance that an inference request (``/v1/chat/completions``, ``/v1/completions``)
is answered with ``error_status`` and an OpenAI error body; ``stall_before_first_byte_s`` holds every
inference response that long (wall-clock seconds, not scaled) before anything is sent;
``disconnect_after_events`` closes every inference response's connection abruptly after that many SSE
events of a stream (0: right after the response head), and a non-streaming response's before its head,
as when the replica's process dies mid-response; ``metrics_dead`` makes ``/metrics`` hang without
answering until the fault is cleared.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import asdict, dataclass, fields
from typing import Any


class FaultSpecError(ValueError):
    """A faults body with wrong fields or types."""


@dataclass(frozen=True, slots=True)
class Faults:
    """Faults to inject; the defaults inject none."""

    error_rate: float = 0.0
    error_status: int = 500
    stall_before_first_byte_s: float = 0.0
    metrics_dead: bool = False
    disconnect_after_events: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.error_rate <= 1.0:
            raise FaultSpecError("error_rate must be in [0, 1]")
        if not 400 <= self.error_status <= 599:
            raise FaultSpecError("error_status must be an HTTP error status (400..599)")
        if self.stall_before_first_byte_s < 0:
            raise FaultSpecError("stall_before_first_byte_s must be >= 0")
        if self.disconnect_after_events is not None and self.disconnect_after_events < 0:
            raise FaultSpecError("disconnect_after_events must be >= 0 (or null: no disconnect)")

    @classmethod
    def from_json(cls, body: Any) -> Faults:
        """Faults from a JSON object; unknown fields and wrong types raise :class:`FaultSpecError`."""
        if not isinstance(body, dict):
            raise FaultSpecError("faults must be a JSON object")
        unknown = set(body) - {f.name for f in fields(cls)}
        if unknown:
            raise FaultSpecError(f"unknown fault fields: {sorted(unknown)}")
        kwargs: dict[str, Any] = {}
        for name in ("error_rate", "stall_before_first_byte_s"):
            if name in body:
                value = body[name]
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise FaultSpecError(f"{name} must be a number")
                kwargs[name] = float(value)
        if "error_status" in body:
            value = body["error_status"]
            if isinstance(value, bool) or not isinstance(value, int):
                raise FaultSpecError("error_status must be an integer")
            kwargs["error_status"] = value
        if "disconnect_after_events" in body:
            value = body["disconnect_after_events"]
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise FaultSpecError("disconnect_after_events must be an integer or null")
            kwargs["disconnect_after_events"] = value
        if "metrics_dead" in body:
            if not isinstance(body["metrics_dead"], bool):
                raise FaultSpecError("metrics_dead must be a boolean")
            kwargs["metrics_dead"] = body["metrics_dead"]
        return cls(**kwargs)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class FaultState:
    """The faults in force on one replica, with its seeded RNG for ``error_rate``."""

    def __init__(self, seed: int = 0) -> None:
        self._faults = Faults()
        self._rng = random.Random(f"faults:{seed}")
        self._changed = asyncio.Event()
        self._closed = False

    @property
    def current(self) -> Faults:
        return self._faults

    def set(self, faults: Faults) -> None:
        self._faults = faults
        self._changed.set()

    def close(self) -> None:
        """Release everything waiting on a fault (the replica is stopping)."""
        self._closed = True
        self._changed.set()

    def roll_error(self) -> int | None:
        """The status to fail this request with, or None."""
        rate = self._faults.error_rate
        if rate > 0 and self._rng.random() < rate:
            return self._faults.error_status
        return None

    async def wait_metrics_alive(self) -> bool:
        """Wait while ``metrics_dead`` holds; False if the replica stopped meanwhile."""
        while self._faults.metrics_dead and not self._closed:
            self._changed.clear()
            await self._changed.wait()
        return not self._closed
