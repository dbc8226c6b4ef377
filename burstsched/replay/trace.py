"""Reading a recorded trace (JSONL, format ``v`` 1: burstsched/recording/README.md)."""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from burstsched.recording import LINE_VERSION, REPLICA_KIND, parse_chain
from burstsched.workloads.stats import percentile, ratio


@dataclass(frozen=True, slots=True)
class TracedRequest:
    """One recorded request, as far as replaying it needs."""

    t: float
    """Arrival, seconds after the trace's first request."""
    api: str
    blocks: tuple[int, ...]
    prompt_tokens: int
    block_tokens: int
    bytes_per_token: int
    max_tokens: int | None
    output_tokens: int | None
    stream: bool
    input_tokens: int | None = None
    cached_tokens: int | None = None
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    endpoint: str | None = None
    outcome: str = "ok"
    held_ms: float = 0.0
    """How long the router held it before sending it: admission's wait plus the flow queue's."""

    @property
    def output_budget(self) -> int:
        """How many tokens the replayed request generates: what the original produced, else its limit."""
        return max(1, self.output_tokens or self.max_tokens or 16)


@dataclass(frozen=True, slots=True)
class ReplicaGeometry:
    """A recorded replica's KV cache: ``num_gpu_blocks`` blocks of ``block_size`` tokens."""

    block_size: int
    num_gpu_blocks: int


def _open(path: str | Path) -> TextIO:
    """A trace file for reading; one whose name ends in ``.gz`` is read through gzip (a rotated file
    compressed by logrotate, a trace kept in a repository)."""
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")  # noqa: SIM115 - the caller's with closes it


def _lines(paths: Sequence[str | Path]) -> Iterator[dict[str, object]]:
    for path in paths:
        with _open(path) as handle:
            for number, text in enumerate(handle, 1):
                if not text.strip():
                    continue
                line = json.loads(text)
                if line.get("v") != LINE_VERSION:
                    raise ValueError(
                        f"{path}:{number}: trace line version {line.get('v')!r}, not {LINE_VERSION}"
                    )
                yield line


def read_replicas(paths: Sequence[str | Path]) -> dict[str, ReplicaGeometry]:
    """Each recorded replica's KV-cache geometry, the last one its ``kind: replica`` lines gave."""
    found: dict[str, ReplicaGeometry] = {}
    for line in _lines(paths):
        if line.get("kind") != REPLICA_KIND:
            continue
        name, size, blocks = line.get("replica"), line.get("block_size"), line.get("num_gpu_blocks")
        if isinstance(name, str) and isinstance(size, int) and isinstance(blocks, int):
            found[name] = ReplicaGeometry(size, blocks)
    return found


def simulated_cache(found: dict[str, ReplicaGeometry]) -> ReplicaGeometry | None:
    """One geometry for every simulated replica: the recorded one, or the smallest cache in tokens when the
    recorded replicas differ; None when the trace gives none."""
    if not found:
        return None
    return min(found.values(), key=lambda g: (g.block_size * g.num_gpu_blocks, g.block_size))


def read_trace(paths: Sequence[str | Path]) -> list[TracedRequest]:
    """Every request line of the files (a rotated set may be given oldest first), sorted by arrival."""
    raw = [line for line in _lines(paths) if "kind" not in line]
    raw.sort(key=lambda line: float(line["t"]))  # type: ignore[arg-type]
    start = float(raw[0]["t"]) if raw else 0.0  # type: ignore[arg-type]
    return [_request(line, start) for line in raw]


def _request(line: dict[str, object], start: float) -> TracedRequest:
    def opt_int(key: str) -> int | None:
        value = line.get(key)
        return value if isinstance(value, int) else None

    ttft = line.get("ttft_ms")
    e2e = line.get("e2e_ms")
    return TracedRequest(
        t=float(line["t"]) - start,  # type: ignore[arg-type]
        api=str(line.get("api", "chat")),
        blocks=parse_chain(str(line.get("blocks", ""))),
        prompt_tokens=int(line.get("prompt_tokens", 0)),  # type: ignore[call-overload]
        block_tokens=int(line.get("block_tokens", 64)),  # type: ignore[call-overload]
        bytes_per_token=int(line.get("bytes_per_token", 4)),  # type: ignore[call-overload]
        max_tokens=opt_int("max_tokens"),
        output_tokens=opt_int("output_tokens"),
        stream=bool(line.get("stream", False)),
        input_tokens=opt_int("input_tokens"),
        cached_tokens=opt_int("cached_tokens"),
        ttft_ms=float(ttft) if isinstance(ttft, int | float) else None,
        e2e_ms=float(e2e) if isinstance(e2e, int | float) else None,
        endpoint=line.get("endpoint") if isinstance(line.get("endpoint"), str) else None,  # type: ignore[arg-type]
        outcome=str(line.get("outcome", "ok")),
        held_ms=_ms(line.get("waited_ms")) + _ms(line.get("queued_ms")),
    )


def _ms(value: object) -> float:
    return float(value) if isinstance(value, int | float) and value > 0 else 0.0


@dataclass(frozen=True, slots=True)
class TraceSummary:
    """What the trace itself says: the recorded run's figures, to set beside a replay's."""

    requests: int
    duration_s: float
    hit_rate: float
    """Cached prompt tokens over prompt tokens, from the responses' usage (NaN when none reported it)."""
    ttft_p50_ms: float
    ttft_p95_ms: float
    ttft_p99_ms: float
    requests_per_endpoint: dict[str, int]


LONG_GAP_S = 3600.0
"""A pause between two recorded arrivals this long suggests recordings of different runs in one file."""


def longest_gap(requests: Sequence[TracedRequest]) -> tuple[float, int]:
    """The longest pause between consecutive arrivals (seconds) and the index of the request after it;
    (0.0, 0) for fewer than two requests. ``requests`` sorted by arrival, as :func:`read_trace` gives them."""
    gap, after = 0.0, 0
    for index in range(1, len(requests)):
        pause = requests[index].t - requests[index - 1].t
        if pause > gap:
            gap, after = pause, index
    return gap, after


def summarize_trace(requests: Iterable[TracedRequest]) -> TraceSummary:
    items = list(requests)
    counted = [r for r in items if r.input_tokens is not None and r.cached_tokens is not None]
    ttfts = [r.ttft_ms for r in items if r.ttft_ms is not None and r.outcome == "ok"]
    per_endpoint: dict[str, int] = {}
    for r in items:
        if r.endpoint is not None:
            per_endpoint[r.endpoint] = per_endpoint.get(r.endpoint, 0) + 1
    return TraceSummary(
        requests=len(items),
        duration_s=items[-1].t if items else 0.0,
        hit_rate=ratio(sum(r.cached_tokens or 0 for r in counted), sum(r.input_tokens or 0 for r in counted))
        if counted
        else math.nan,
        ttft_p50_ms=percentile(ttfts, 50),
        ttft_p95_ms=percentile(ttfts, 95),
        ttft_p99_ms=percentile(ttfts, 99),
        requests_per_endpoint=dict(sorted(per_endpoint.items())),
    )
