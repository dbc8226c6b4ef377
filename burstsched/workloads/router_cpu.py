"""The CPU a routing target's router processes spend over a run, read from ``/proc``.

A target is reached by URL only. :func:`router_pids` finds the processes listening on the URLs its route
sends requests to (several for a fleet of routers taking turns); :func:`routers_cpu_seconds` sums their
CPU (user + system, every thread, and every process each one started). Client-side routing has no router:
None. The figure covers all a router does meanwhile, its idle work (scrapes, health checks) included.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

from burstsched.workloads.proc_cpu import tree_cpu_seconds
from burstsched.workloads.proc_sockets import listening_pid
from burstsched.workloads.targets import Route

PROBED_REQUESTS = 64
"""Requests whose routes are looked at to find every router a target sends to."""


def router_pids(route: Route) -> list[int] | None:
    """The processes serving the routers ``route`` sends to; None for client-side routing, or when a
    router's process cannot be found (not on this machine, another user's)."""
    urls: set[str] = set()
    for index in range(PROBED_REQUESTS):
        dispatch = route(index)
        if dispatch.replica is not None:
            return None
        urls.add(dispatch.base_url)
    pids = []
    for url in sorted(urls):
        port = urlsplit(url).port
        pid = listening_pid(port) if port is not None else None
        if pid is None:
            return None
        pids.append(pid)
    return pids


def routers_cpu_seconds(pids: Sequence[int]) -> float | None:
    """CPU seconds of the routers so far (with what each started); None when one of them is gone."""
    total = 0.0
    for pid in pids:
        seconds = tree_cpu_seconds(pid)
        if seconds is None:
            return None
        total += seconds
    return total
