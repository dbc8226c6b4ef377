"""The overhead benchmark's rows: one per target and level, as a text table and a markdown report."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from loadtests.http_load import LoadResult, percentile
from loadtests.overhead_targets import Target


@dataclass
class Tally:
    """One target's measurements at one level, summed over its slices (CPU in seconds)."""

    load: LoadResult = field(default_factory=LoadResult)
    router_cpu: float = 0.0
    backends_cpu: float = 0.0
    client_cpu: float = 0.0
    receiver_cpu: float = 0.0
    idle_cpu: float = 0.0
    """The router's CPU while other targets were loaded (seconds)…"""
    idle_seconds: float = 0.0
    """…over this long."""


@dataclass(frozen=True, slots=True)
class Row:
    target: str
    clients: int
    requests: int
    errors: int
    error_statuses: dict[int, int]
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    rps_vs_direct: float | None = None
    added_p50_ms: float | None = None
    added_p99_ms: float | None = None
    router_cpu_us: float | None = None
    """The router's CPU (its whole process group) per request, microseconds."""
    router_cores: float | None = None
    """The router's CPU seconds per second of its slices."""
    idle_cores: float | None = None
    """The router's CPU seconds per second while the other targets were loaded (its background work)."""
    backends_cpu_us: float | None = None
    client_cpu_us: float | None = None
    client_cores: float | None = None
    receiver_cpu_us: float | None = None
    """The trace receiver's CPU per request (traced targets only)."""


def summarize(clients: int, tallies: Sequence[tuple[Target, Tally]]) -> list[Row]:
    """One row per target at one level; the ``direct`` target (if there) is what the others add to."""
    rows = []
    for target, tally in tallies:
        load = tally.load
        latencies = sorted(load.latencies)
        n = len(latencies)
        per_request = partial(_per_request, n)

        seconds = load.seconds or float("nan")
        rows.append(
            Row(
                target=target.name,
                clients=clients,
                requests=n,
                errors=load.errors,
                error_statuses=dict(load.statuses),
                seconds=load.seconds,
                rps=n / seconds,
                p50_ms=percentile(latencies, 0.50) * 1e3,
                p99_ms=percentile(latencies, 0.99) * 1e3,
                router_cpu_us=per_request(tally.router_cpu) if target.is_router else None,
                router_cores=tally.router_cpu / seconds if target.is_router else None,
                idle_cores=tally.idle_cpu / tally.idle_seconds
                if target.is_router and tally.idle_seconds
                else None,
                backends_cpu_us=per_request(tally.backends_cpu),
                client_cpu_us=per_request(tally.client_cpu),
                client_cores=tally.client_cpu / seconds,
                receiver_cpu_us=per_request(tally.receiver_cpu) if target.traced else None,
            )
        )
    direct = next((r for r in rows if r.target == "direct"), None)
    if direct is None:
        return rows
    return [_with_direct(r, direct) for r in rows]


def _per_request(requests: int, cpu_s: float) -> float | None:
    return cpu_s / requests * 1e6 if requests else None


def _with_direct(row: Row, direct: Row) -> Row:
    return replace(
        row,
        rps_vs_direct=row.rps / direct.rps if direct.rps else None,
        added_p50_ms=row.p50_ms - direct.p50_ms,
        added_p99_ms=row.p99_ms - direct.p99_ms,
    )


_COLUMNS: tuple[tuple[str, str, int], ...] = (
    # header, field, width
    ("target", "target", 22),
    ("conns", "clients", 5),
    ("requests", "requests", 8),
    ("errors", "errors", 6),
    ("req/s", "rps", 7),
    ("x direct", "rps_vs_direct", 8),
    ("p50 ms", "p50_ms", 7),
    ("p99 ms", "p99_ms", 7),
    ("+p50 ms", "added_p50_ms", 7),
    ("+p99 ms", "added_p99_ms", 7),
    ("router µs/req", "router_cpu_us", 13),
    ("router cores", "router_cores", 12),
    ("idle cores", "idle_cores", 10),
    ("backends µs/req", "backends_cpu_us", 15),
    ("client µs/req", "client_cpu_us", 13),
)


def _cell(name: str, value: Any) -> str:
    if value is None:
        return "-"
    if name in ("rps", "router_cpu_us", "backends_cpu_us", "client_cpu_us"):
        return f"{value:.0f}"
    if name == "idle_cores":
        return f"{value:.3f}"
    if name in ("rps_vs_direct", "router_cores"):
        return f"{value:.2f}"
    if name.endswith("_ms"):
        return f"{value:+.3f}" if name.startswith("added") else f"{value:.3f}"
    return str(value)


def format_table(rows: Sequence[Row], *, header: bool = True) -> str:
    """A fixed-width text table (one line per row)."""
    lines = []
    if header:
        lines.append(" ".join(f"{h:>{w}}" if i else f"{h:<{w}}" for i, (h, _, w) in enumerate(_COLUMNS)))
    for row in rows:
        cells = [_cell(name, getattr(row, name)) for _, name, _ in _COLUMNS]
        lines.append(
            " ".join(
                f"{c:>{w}}" if i else f"{c:<{w}}"
                for i, (c, (_, _, w)) in enumerate(zip(cells, _COLUMNS, strict=True))
            )
        )
    return "\n".join(lines)


def markdown_table(rows: Sequence[Row]) -> str:
    head = "| " + " | ".join(h for h, _, _ in _COLUMNS) + " |"
    rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(_COLUMNS))) + "|"
    body = ["| " + " | ".join(_cell(name, getattr(r, name)) for _, name, _ in _COLUMNS) + " |" for r in rows]
    return "\n".join([head, rule, *body])


def markdown_report(
    setup: dict[str, Any],
    rows: Sequence[Row],
    skipped: Sequence[tuple[str, str]],
    spans: int | None,
    traced_requests: int,
) -> str:
    load = setup.get("loadavg_start"), setup.get("loadavg_end")
    lines = [
        "# Router overhead",
        "",
        "`python loadtests/overhead.py`: every target in one run, taking turns in short slices; compare "
        "rows within this run only.",
        "",
        f"- date: {setup.get('date')}; commit {setup.get('commit')}"
        + (" (with uncommitted changes to burstsched/, plugins/ or config/)" if setup.get("dirty") else "")
        + (f"; before = {setup['baseline']}" if setup.get("baseline") else ""),
        f"- machine: {setup.get('cpus')} CPUs, Python {setup.get('python')}; load average at start "
        f"{_loadavg(load[0])}, at end {_loadavg(load[1])}",
        f"- {setup.get('backends')} fast backends (loadtests/fast_backend.py); burstsched config "
        f"`{setup.get('config')}`",
        f"- concurrency {setup.get('levels')}; {setup.get('duration_s')} s per target and level in "
        f"{setup.get('slice_s')} s slices after {setup.get('warmup_s')} s of warm-up",
        f"- request: `{setup.get('request')}`",
        "",
        markdown_table(rows),
        "",
        "`router µs/req`: user + system CPU time of the router's whole process group (all threads, from "
        "/proc) during its own slices, per successful request; `router cores`: the same per second; "
        "`idle cores`: its CPU per second while the other targets were loaded (scrapes, health checks). "
        "`+p50 ms`: p50 latency minus direct's at the same concurrency. `direct`: straight to backend 0. "
        "`python-floor`: burstsched's HTTP stack (uvicorn, aiohttp) passing each request to the backends in "
        "turn with nothing else: the least any router of that stack costs.",
    ]
    if spans is not None:
        per = f" ({spans / traced_requests:.2f} per request)" if traced_requests else ""
        lines += ["", f"Trace receiver: {spans} spans for {traced_requests} requests to traced targets{per}."]
    if skipped:
        lines += ["", "Skipped:", ""]
        lines += [f"- {name}: {reason.splitlines()[0] if reason else ''}" for name, reason in skipped]
    return "\n".join(lines) + "\n"


def _loadavg(value: Any) -> str:
    if not isinstance(value, (tuple, list)):
        return "?"
    return " ".join(f"{v:.2f}" for v in value)
