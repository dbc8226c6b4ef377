"""Run ``burstsched serve`` as a child process on a free 127.0.0.1 port, for workloads and the demo.

The router runs in its own process so that the load generator never shares its event loop; it is
stopped by PID (SIGINT, then SIGKILL after a bounded wait).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx

from burstsched.testing.ports import free_port


class RouterStartError(RuntimeError):
    """The router did not become ready in time; the message carries its log's tail."""


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@asynccontextmanager
async def router_process(
    config: Path,
    endpoints: Sequence[tuple[str, str]],
    *,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    ready_timeout_s: float = 30.0,
) -> AsyncIterator[str]:
    """Start ``burstsched serve --config CONFIG --endpoint name=url ...``; yield its base URL."""
    port = free_port()
    args = [sys.executable, "-m", "burstsched", "serve", "--config", str(config)]
    args += ["--host", "127.0.0.1", "--port", str(port)]
    for name, url in endpoints:
        args += ["--endpoint", f"{name}={url}"]
    args += list(extra_args)
    proc, log_path = await anyio.to_thread.run_sync(_spawn, args, {**os.environ, **(env or {})})
    base_url = f"http://127.0.0.1:{port}"
    try:
        await _wait_ready(proc, base_url, ready_timeout_s, log_path)
        yield base_url
    finally:
        await _stop(proc)
        await anyio.to_thread.run_sync(keep_if_troubled, log_path)


_TROUBLE = (" WARNING ", " ERROR ", " CRITICAL ", "Traceback")


def keep_if_troubled(log: Path) -> None:
    """Delete the router's log, unless it warned or failed: then keep it and say where, on stderr (a load
    test's failed request is explained by the router's side of it)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return
    troubled = [line for line in text.splitlines() if any(mark in line for mark in _TROUBLE)]
    if not troubled:
        log.unlink(missing_ok=True)
        return
    lines = f"{len(troubled)} line{'s' if len(troubled) != 1 else ''}"
    print(f"router log kept: {log} ({lines} of warnings or errors); its end:", file=sys.stderr)
    print(_tail(log, 10), file=sys.stderr)


def _spawn(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Path]:
    with tempfile.NamedTemporaryFile(prefix="burstsched-router-", suffix=".log", delete=False) as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        return proc, Path(log.name)


async def _wait_ready(proc: subprocess.Popen[bytes], base_url: str, timeout_s: float, log: Path) -> None:
    async with httpx.AsyncClient(timeout=1.0) as client:
        with anyio.move_on_after(timeout_s):
            while proc.poll() is None:
                try:
                    if (await client.get(f"{base_url}/ready")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await anyio.sleep(0.1)
    state = f"exited with {proc.returncode}" if proc.poll() is not None else f"not ready after {timeout_s} s"
    await _stop(proc)
    raise RouterStartError(f"burstsched serve {state}; log tail:\n{_tail(log)}")


async def _stop(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        await anyio.to_thread.run_sync(proc.wait, grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        await anyio.to_thread.run_sync(proc.wait)
