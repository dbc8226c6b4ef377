"""A CPU quota for a group of processes, through a cgroup of the ``cpu`` controller (v1 or v2).

Load tests run real vLLM replicas on the same few cores as the router under test and the load generator.
Each replica's engine keeps its core busy while it has requests (its engine-core process polls its worker
without sleeping), so the router and the load generator wait for a core, and how long they wait depends
on how many replicas are busy at once, that is on the routing. A router that leaves one replica idle
frees a core for everything else and looks faster for it; one that spreads load pays for it in the
client's own clock. Measured on 2 cores, multi-tenant chat at 0.8 load, in 4 runs of 5 the load
generator's send lag p99 was 62-108 ms behind burstsched (which spreads) against 6-21 ms behind
sglang-router (which left one replica mostly idle in those runs); with a 0.85-core quota, 7-20 ms for
every target. A quota of a little under one core per replica leaves the rest to the router and the
client whatever the routing, which is what a pool whose engines run on their own accelerators and
cores looks like. It costs the replicas more than its share: their polling spends quota too (cold
capacity of 2 replicas on multi-tenant chat, two calibrations each: 6.1-7.0/s at 0.85 cores each,
8.4-8.6/s uncapped).

:class:`CpuQuota` makes one cgroup, caps it at ``cores`` (quota per period), moves processes into it
(their threads, and children started later, follow) and removes it on :meth:`close`. Only where the
cgroup file system is writable (root, or a delegated subtree); :class:`CpuQuotaError` otherwise.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 10_000
"""A short period: the capped group waits at most the period's unused remainder, not 100 ms."""


class CpuQuotaError(RuntimeError):
    """The cgroup could not be made or written (not root, or no ``cpu`` controller)."""


def _cpu_hierarchy(root: Path) -> tuple[Path, bool]:
    """The folder under which ``cpu`` cgroups are made, and whether it is cgroup v2."""
    if (root / "cgroup.controllers").exists():
        return root, True
    if (root / "cpu" / "cpu.cfs_quota_us").exists():
        return root / "cpu", False
    raise CpuQuotaError(f"no cpu controller under {root}")


class CpuQuota:
    """One cgroup capped at ``cores`` CPUs; processes are added with :meth:`add`."""

    def __init__(self, name: str, cores: float, *, root: Path = CGROUP_ROOT, period_us: int = PERIOD_US):
        if cores <= 0:
            raise ValueError("cores must be > 0")
        base, self._v2 = _cpu_hierarchy(root)
        self.path = base / name
        self.cores = cores
        quota_us = max(1000, round(cores * period_us))
        try:
            self.path.mkdir(exist_ok=True)
            if self._v2:
                (self.path / "cpu.max").write_text(f"{quota_us} {period_us}\n")
            else:
                (self.path / "cpu.cfs_period_us").write_text(f"{period_us}\n")
                (self.path / "cpu.cfs_quota_us").write_text(f"{quota_us}\n")
        except OSError as exc:
            raise CpuQuotaError(f"cannot set a CPU quota at {self.path}: {exc}") from exc

    def add(self, pids: list[int]) -> int:
        """Move the processes ``pids`` (with all their threads) into the group; returns how many moved.
        A process that ended meanwhile is skipped."""
        moved = 0
        for pid in pids:
            try:
                (self.path / "cgroup.procs").write_text(f"{pid}\n")
            except ProcessLookupError:
                continue
            except OSError as exc:
                if not os.path.exists(f"/proc/{pid}"):
                    continue
                raise CpuQuotaError(f"cannot move pid {pid} into {self.path}: {exc}") from exc
            moved += 1
        return moved

    def close(self, timeout_s: float = 5.0) -> None:
        """Remove the group once its processes are gone (bounded wait; left in place if they are not)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() >= deadline:
                    return
                time.sleep(0.1)
