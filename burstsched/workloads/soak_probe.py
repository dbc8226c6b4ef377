"""Reading the router process during a soak: RSS and open file descriptors from ``/proc/PID``, live asyncio
tasks and event-loop lag from its ``/metrics``.

The lag is a Prometheus histogram, so its quantiles are estimates: :func:`histogram_quantile` interpolates
inside the bucket the rank falls in, as Prometheus's ``histogram_quantile`` does, and the quantile of an
interval is that of the bucket counts' difference between two readings.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from burstsched.workloads.proc_sockets import tcp_sockets

LAG = "burstsched_event_loop_lag_seconds"
TASKS = "burstsched_asyncio_tasks"
REQUESTS = "burstsched_requests_total"

Buckets = tuple[tuple[float, float], ...]
"""``(upper bound, cumulative count)`` pairs sorted by bound, the last ``+Inf``."""


@dataclass(frozen=True, slots=True)
class ProcessReading:
    rss_bytes: int
    fds: int


def read_process(pid: int, proc: Path = Path("/proc")) -> ProcessReading:
    """Resident memory (``VmRSS``) and the number of open file descriptors of process ``pid``."""
    rss_kib = 0
    for line in (proc / str(pid) / "status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kib = int(line.split()[1])
            break
    return ProcessReading(rss_bytes=rss_kib * 1024, fds=len(os.listdir(proc / str(pid) / "fd")))


@dataclass(frozen=True, slots=True)
class RuntimeReading:
    """The router's runtime families at one scrape."""

    tasks: float
    lag: Buckets
    requests: dict[str, float] = field(default_factory=dict)
    """``burstsched_requests_total`` summed by outcome."""


def parse_runtime(text: str) -> RuntimeReading:
    """The runtime families out of a ``/metrics`` page; :class:`ValueError` when the router lacks them."""
    tasks: float | None = None
    lag: list[tuple[float, float]] = []
    requests: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == TASKS:
                tasks = float(sample.value)
            elif sample.name == f"{LAG}_bucket":
                lag.append((float(sample.labels["le"]), float(sample.value)))
            elif sample.name == REQUESTS:
                outcome = sample.labels.get("outcome", "")
                requests[outcome] = requests.get(outcome, 0.0) + float(sample.value)
    if tasks is None or not lag:
        raise ValueError(f"the router's /metrics has no {TASKS} or {LAG}")
    return RuntimeReading(tasks=tasks, lag=tuple(sorted(lag)), requests=requests)


def bucket_difference(later: Buckets, earlier: Buckets) -> Buckets:
    """The counts observed between two readings of the same histogram."""
    if [b for b, _ in later] != [b for b, _ in earlier]:
        raise ValueError("the readings have different buckets")
    return tuple((bound, a - b) for (bound, a), (_, b) in zip(later, earlier, strict=True))


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """The ``q`` quantile of cumulative ``buckets`` (None when empty), interpolated within a bucket; a rank in
    the ``+Inf`` bucket gives the highest finite bound."""
    if not buckets or not 0.0 <= q <= 1.0:
        raise ValueError("need buckets and 0 <= q <= 1")
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank and count > below:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def median(values: Sequence[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def fd_kinds(pid: int, own_port: int, peers: dict[int, str], proc: Path = Path("/proc")) -> dict[str, int]:
    """What process ``pid``'s descriptors are: ``upstream NAME STATE`` (TCP to a port of ``peers``),
    ``client STATE`` (TCP on ``own_port``), ``listen``, ``other tcp``, ``socket``, ``pipe``, ``file`` or the
    anonymous inode's kind. A descriptor closed while being read is skipped."""
    sockets = tcp_sockets(proc)
    kinds: dict[str, int] = {}
    folder = proc / str(pid) / "fd"
    for fd in os.listdir(folder):
        try:
            target = os.readlink(folder / fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            tcp = sockets.get(target[8:-1])
            if tcp is None:
                kind = "socket"
            elif tcp.state == "LISTEN":
                kind = "listen"
            elif tcp.remote_port in peers:
                kind = f"upstream {peers[tcp.remote_port]} {tcp.state}"
            elif tcp.local_port == own_port:
                kind = f"client {tcp.state}"
            else:
                kind = "other tcp"
        elif target.startswith("pipe:"):
            kind = "pipe"
        elif target.startswith("anon_inode:"):
            kind = target[len("anon_inode:") :].strip("[]")
        else:
            kind = "file"
        kinds[kind] = kinds.get(kind, 0) + 1
    return dict(sorted(kinds.items()))
