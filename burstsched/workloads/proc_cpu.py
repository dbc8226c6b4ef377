"""CPU time of processes from ``/proc``: user + system, all threads, summed over whole process groups.

A router started in its own session (``start_new_session=True``) leads its process group, so the group
holds the router and anything it started (a Python launcher and its Rust child, say). Times are read as
the kernel keeps them (``utime`` + ``stime`` of ``/proc/PID/stat``, which cover every thread of the
process); a process that ended between two readings takes its last slice of CPU with it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


def _stat_fields(pid: int, proc: Path = PROC) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (``state`` first), or None."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def process_cpu_seconds(pid: int, proc: Path = PROC) -> float | None:
    """User + system CPU seconds of one process (all its threads); None when it is gone."""
    fields = _stat_fields(pid, proc)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS


def group_cpu_seconds(pgids: Iterable[int], proc: Path = PROC) -> dict[int, float]:
    """CPU seconds of every process in each of the process groups, summed per group (one scan of /proc)."""
    wanted = set(pgids)
    totals = dict.fromkeys(wanted, 0.0)
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name), proc)
        if fields is None:
            continue
        pgid = int(fields[2])
        if pgid in wanted:
            totals[pgid] += (int(fields[11]) + int(fields[12])) / _TICKS
    return totals


def tree_cpu_seconds(pid: int, proc: Path = PROC) -> float | None:
    """CPU seconds of one process and every live descendant of it (one scan of /proc); None when it is gone.

    For a router started without a session of its own (its process group is its parent's), whatever it
    started itself (a launcher's worker, say) still counts."""
    parents: dict[int, int] = {}
    seconds: dict[int, float] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name), proc)
        if fields is None:
            continue
        parents[int(entry.name)] = int(fields[1])
        seconds[int(entry.name)] = (int(fields[11]) + int(fields[12])) / _TICKS
    if pid not in seconds:
        return None
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        total += seconds.get(current, 0.0)
        stack.extend(children.get(current, ()))
    return total


def group_pids(pgid: int, proc: Path = PROC) -> list[int]:
    """The live processes of one process group."""
    pids = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name), proc)
            if fields is not None and int(fields[2]) == pgid:
                pids.append(int(entry.name))
    return sorted(pids)


def self_cpu_seconds() -> float:
    """This process's own CPU seconds (all threads)."""
    times = os.times()
    return times.user + times.system
