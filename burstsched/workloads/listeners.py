"""Which local process listens on a TCP port, from ``/proc`` (Linux): how a load test finds a router it
reaches only by URL (its own child, or a peer router's launcher and the process that really serves).

``/proc/net/tcp`` and ``tcp6`` list the listening sockets by inode; each process's ``fd`` folder links to
the sockets it holds. A process of another user, whose folder cannot be read, is not found.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
LISTEN = "0A"
"""The kernel's TCP state code for a listening socket."""


def listening_inodes(port: int, proc: Path = PROC) -> set[str]:
    """The socket inodes listening on ``port`` (any address, IPv4 or IPv6)."""
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def listening_pid(port: int, proc: Path = PROC) -> int | None:
    """The process holding a socket that listens on ``port``, or None. Forked workers sharing one listening
    socket all hold it: then their parent among them (the lowest PID if that does not tell)."""
    targets = {f"socket:[{inode}]" for inode in listening_inodes(port, proc)}
    if not targets:
        return None
    found: list[int] = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = os.listdir(entry / "fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(entry / "fd" / fd)
            except OSError:
                continue
            if link in targets:
                found.append(int(entry.name))
                break
    if not found:
        return None
    roots = [pid for pid in found if _parent(pid, proc) not in found]
    return min(roots or found)


def _parent(pid: int, proc: Path) -> int | None:
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return int(text.rsplit(")", 1)[1].split()[1])
