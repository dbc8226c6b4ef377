"""Per-decision data that producers write and scorers read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, cast

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """How much of a request's block chain an endpoint holds: ``matched_blocks`` contiguous from block 0.

    ``source`` names the index that knew it: ``approximate`` (estimated from past routing, blocks of
    pseudo-tokens) or ``precise`` (from the replica's KV-cache events, blocks of the engine's tokens).
    ``fill``: how full the index believes the endpoint's prefix cache is (0..1), None when it cannot tell.
    """

    matched_blocks: int
    total_blocks: int
    block_tokens: int
    source: str = "approximate"
    fill: float | None = None

    @property
    def ratio(self) -> float:
        """Matched over total blocks; 0 for a prompt shorter than one block."""
        return self.matched_blocks / self.total_blocks if self.total_blocks > 0 else 0.0


class CycleState:
    """Typed per-endpoint data for one scheduling call, keyed by endpoint name and data type."""

    __slots__ = ("_data",)

    def __init__(self) -> None:
        self._data: dict[tuple[str, type], object] = {}

    def put(self, endpoint: str, value: object) -> None:
        """Store ``value`` for ``endpoint`` under its own type."""
        self._data[(endpoint, type(value))] = value

    def get(self, endpoint: str, kind: type[T]) -> T | None:
        """The value of type ``kind`` stored for ``endpoint``, if any."""
        return cast("T | None", self._data.get((endpoint, kind)))
