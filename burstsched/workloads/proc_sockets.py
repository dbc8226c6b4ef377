"""The machine's TCP sockets from ``/proc`` (Linux), and which local process listens on a port.

``/proc/net/tcp`` and ``tcp6`` list every socket by inode with its ports and state; each process's ``fd``
folder links to the sockets it holds. A load test uses them to find a router it reaches only by URL (its
own child, or a peer router's launcher and the process that really serves), and the soak test to tell
what a router's descriptors are. A process of another user, whose folder cannot be read, is not found.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from burstsched.workloads.proc_cpu import PROC, stat_fields

TCP_STATES = {
    "01": "ESTABLISHED",
    "02": "SYN_SENT",
    "03": "SYN_RECV",
    "04": "FIN_WAIT1",
    "05": "FIN_WAIT2",
    "06": "TIME_WAIT",
    "07": "CLOSE",
    "08": "CLOSE_WAIT",
    "09": "LAST_ACK",
    "0A": "LISTEN",
    "0B": "CLOSING",
}


@dataclass(frozen=True, slots=True)
class TcpSocket:
    local_port: int
    remote_port: int
    state: str
    """As :data:`TCP_STATES` names it (the kernel's code when it is not there)."""


def tcp_sockets(proc: Path = PROC) -> dict[str, TcpSocket]:
    """Socket inode to its ports and state, from ``/proc/net/tcp`` and ``tcp6``."""
    sockets: dict[str, TcpSocket] = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            sockets[inode] = TcpSocket(
                int(local.rsplit(":", 1)[1], 16),
                int(remote.rsplit(":", 1)[1], 16),
                TCP_STATES.get(state, state),
            )
    return sockets


def listening_pid(port: int, proc: Path = PROC) -> int | None:
    """The process holding a socket that listens on ``port`` (any address, IPv4 or IPv6), or None. Forked
    workers sharing one listening socket all hold it: then their parent among them (the lowest PID if that
    does not tell)."""
    targets = {
        f"socket:[{inode}]"
        for inode, tcp in tcp_sockets(proc).items()
        if tcp.state == "LISTEN" and tcp.local_port == port
    }
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
    roots = [
        pid for pid in found if (fields := stat_fields(pid, proc)) is None or int(fields[1]) not in found
    ]
    return min(roots or found)
