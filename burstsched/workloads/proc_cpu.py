"""CPU time of processes from ``/proc``: user + system, all threads, summed over whole process groups.

A router started in its own session (``start_new_session=True``) leads its process group, so the group
holds the router and anything it started (a Python launcher and its Rust child, say). Times are read as
the kernel keeps them (``utime`` + ``stime`` of ``/proc/PID/stat``, which cover every thread of the
process); a process that ended between two readings takes its last slice of CPU with it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


def stat_fields(pid: int, proc: Path = PROC) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (``state`` first), or None."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def _cpu(fields: list[str]) -> float:
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _processes(proc: Path) -> Iterator[tuple[int, list[str]]]:
    """(pid, stat fields) of every live process (one scan of /proc)."""
    for entry in proc.iterdir():
        if entry.name.isdigit():
            fields = stat_fields(int(entry.name), proc)
            if fields is not None:
                yield int(entry.name), fields


def process_cpu_seconds(pid: int, proc: Path = PROC) -> float | None:
    """User + system CPU seconds of one process (all its threads); None when it is gone."""
    fields = stat_fields(pid, proc)
    return None if fields is None else _cpu(fields)


def group_cpu_seconds(pgids: Iterable[int], proc: Path = PROC) -> dict[int, float]:
    """CPU seconds of every process in each of the process groups, summed per group (one scan of /proc)."""
    totals = dict.fromkeys(set(pgids), 0.0)
    for _, fields in _processes(proc):
        pgid = int(fields[2])
        if pgid in totals:
            totals[pgid] += _cpu(fields)
    return totals


def tree_cpu_seconds(pid: int, proc: Path = PROC) -> float | None:
    """CPU seconds of one process and every live descendant of it (one scan of /proc); None when it is gone.

    For a router started without a session of its own (its process group is its parent's), whatever it
    started itself (a launcher's worker, say) still counts."""
    seconds: dict[int, float] = {}
    children: dict[int, list[int]] = {}
    for child, fields in _processes(proc):
        seconds[child] = _cpu(fields)
        children.setdefault(int(fields[1]), []).append(child)
    if pid not in seconds:
        return None
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        total += seconds[current]
        stack.extend(children.get(current, ()))
    return total


def group_pids(pgid: int, proc: Path = PROC) -> list[int]:
    """The live processes of one process group."""
    return sorted(pid for pid, fields in _processes(proc) if int(fields[2]) == pgid)


def self_cpu_seconds() -> float:
    """This process's own CPU seconds (all threads)."""
    times = os.times()
    return times.user + times.system
