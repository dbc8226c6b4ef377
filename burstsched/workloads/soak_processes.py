"""A soak run's child processes: simulated replicas (``burstsched sim``), the router (``burstsched serve``).

Each runs in its own process, on a 127.0.0.1 port chosen free, with its output in a log file of the run's
work folder. A replica is killed with SIGKILL by PID and restarted on the same port; the router is stopped by
PID (SIGINT, then SIGKILL after a bounded wait). Every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx

from burstsched.testing.ports import free_port, free_ports


class ChildStartError(RuntimeError):
    """A child did not become ready in time; the message carries its log's tail."""


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Child:
    """One ``python -m burstsched ...`` process, ready when ``GET url + ready_path`` answers 200."""

    def __init__(self, name: str, args: Sequence[str], url: str, ready_path: str, log: Path) -> None:
        self.name = name
        self.args = [sys.executable, "-m", "burstsched", *args]
        self.url = url
        self.ready_path = ready_path
        self.log = log
        self.starts = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError(f"{self.name} is not running")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    async def start(self, timeout_s: float = 30.0) -> None:
        """Spawn the process and wait until it answers; :class:`ChildStartError` after ``timeout_s``."""
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        self._proc = await anyio.to_thread.run_sync(self._spawn)
        self.starts += 1
        proc = self._proc
        async with httpx.AsyncClient(timeout=1.0) as client:
            with anyio.move_on_after(timeout_s):
                while proc.poll() is None:
                    try:
                        if (await client.get(self.url + self.ready_path)).status_code == 200:
                            return
                    except httpx.TransportError:
                        pass
                    await anyio.sleep(0.05)
        state = f"exited with {proc.returncode}" if proc.poll() is not None else f"not ready in {timeout_s} s"
        await self.stop()
        raise ChildStartError(f"{self.name} {state}; log tail:\n{_tail(self.log)}")

    def _spawn(self) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as log:
            return subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    async def kill(self) -> None:
        """SIGKILL by PID, then reap it."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGKILL)
        await anyio.to_thread.run_sync(proc.wait)

    async def stop(self, grace_s: float = 10.0) -> None:
        """SIGINT by PID; SIGKILL if it has not exited after ``grace_s``."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGINT)
        try:
            await anyio.to_thread.run_sync(proc.wait, grace_s)
        except subprocess.TimeoutExpired:
            await self.kill()


def sim_child(name: str, port: int, work: Path, *, time_scale: float, seed: int) -> Child:
    args = ["sim", "--host", "127.0.0.1", "--port", str(port), "--name", name]
    args += ["--time-scale", repr(time_scale), "--seed", str(seed), "--log-level", "warning"]
    return Child(name, args, f"http://127.0.0.1:{port}", "/health", work / f"{name}.log")


def router_child(config: Path, endpoints: Sequence[tuple[str, str]], work: Path) -> Child:
    port = free_port()
    args = ["serve", "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    for name, url in endpoints:
        args += ["--endpoint", f"{name}={url}"]
    return Child("router", args, f"http://127.0.0.1:{port}", "/ready", work / "router.log")


@asynccontextmanager
async def running(children: Sequence[Child], timeout_s: float = 30.0) -> AsyncIterator[None]:
    """Start ``children`` together; stop every one of them on exit."""
    try:
        async with anyio.create_task_group() as tg:
            for child in children:
                tg.start_soon(child.start, timeout_s)
        yield
    finally:
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for child in children:
                    tg.start_soon(child.stop)


def sim_children(count: int, work: Path, *, time_scale: float, seed: int) -> list[Child]:
    """``count`` simulated replicas ``sim-0``… on distinct free ports (not started)."""
    ports = free_ports(count)
    return [
        sim_child(f"sim-{i}", port, work, time_scale=time_scale, seed=seed + i)
        for i, port in enumerate(ports)
    ]
