"""Finding a target's router by the port it listens on, and the CPU it spends (``/proc``, this machine)."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys

import pytest

from burstsched.workloads.proc_cpu import process_cpu_seconds, tree_cpu_seconds
from burstsched.workloads.proc_sockets import listening_pid
from burstsched.workloads.router_cpu import router_pids, routers_cpu_seconds
from burstsched.workloads.run_summary import RunSummary, with_router_cpu
from burstsched.workloads.targets import Dispatch


def _listener(family: int = socket.AF_INET, host: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen()
    return sock


def test_the_listening_process_is_found_by_port_ipv4_and_ipv6() -> None:
    with _listener() as v4:
        assert listening_pid(v4.getsockname()[1]) == os.getpid()
    try:
        v6 = _listener(socket.AF_INET6, "::1")
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with v6:
        assert listening_pid(v6.getsockname()[1]) == os.getpid()
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # bound, not listening
        assert listening_pid(port) is None


def test_a_process_tree_counts_its_children() -> None:
    """A live child that burnt 0.3 s of CPU counts in this process's tree, not in this process."""
    burn = (
        "import sys, time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
        "print(1, flush=True)\nsys.stdin.read()"
    )
    with subprocess.Popen(
        [sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdin is not None and child.stdout is not None
        assert child.stdout.readline().strip() == "1"
        own = process_cpu_seconds(os.getpid())
        tree = tree_cpu_seconds(os.getpid())
        child_cpu = process_cpu_seconds(child.pid)
        child.stdin.close()
        child.wait(timeout=10)
    assert own is not None and tree is not None and child_cpu is not None
    assert child_cpu >= 0.25
    assert tree >= own + child_cpu - 0.05  # read a moment apart; this process keeps running
    assert tree_cpu_seconds(2**22 + 12345) is None  # no such process


def test_a_router_target_is_measured_and_client_side_routing_is_not() -> None:
    with _listener() as a, _listener() as b:
        urls = [f"http://127.0.0.1:{s.getsockname()[1]}" for s in (a, b)]
        fleet = router_pids(lambda i: Dispatch(urls[i % 2]))
        assert fleet == [os.getpid(), os.getpid()]
        spent = routers_cpu_seconds(fleet)
        assert spent is not None and spent > 0
    assert router_pids(lambda i: Dispatch(urls[0], replica="r0")) is None  # the client chose a replica
    assert router_pids(lambda i: Dispatch(urls[0])) is None  # nothing listens there any more


def _summary(completed: int) -> RunSummary:
    nan = math.nan
    return RunSummary(
        "t", 1.0, completed, completed, 0, 0, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan,
        {}, "header", 1.0, nan,
    )  # fmt: skip


def test_the_summary_carries_cpu_per_completed_request() -> None:
    assert with_router_cpu(_summary(200), 0.5).router_cpu_ms == pytest.approx(2.5)
    assert math.isnan(with_router_cpu(_summary(200), None).router_cpu_ms)
    assert math.isnan(with_router_cpu(_summary(0), 0.5).router_cpu_ms)
