"""A killed simulated replica closes every connection it accepted, even one accepted a step before the kill.

asyncio accepts a connection in one loop step and builds its transport in the next; a kill that closed
the listener in between used to leave that accepted socket open for good (the kill tests' old leak). A
blocking connect on 127.0.0.1 is complete in the kernel when it returns, so the next loop step accepts it;
killing after 0..4 further steps walks the kill across every point of that hand-over.
"""

from __future__ import annotations

import asyncio
import gc
import socket

import anyio.to_thread
import pytest

from burstsched.sim import SimConfig
from burstsched.sim.replica import SimReplica

pytestmark = pytest.mark.anyio


def _wait_closed(sock: socket.socket) -> bytes:
    """What the peer sends before it closes: b"" on a clean close; a reset counts as closed too."""
    try:
        return sock.recv(1)
    except ConnectionResetError:
        return b""


@pytest.mark.parametrize("steps", range(5))
async def test_kill_closes_a_connection_it_was_still_accepting(steps: int) -> None:
    replica = SimReplica(SimConfig(time_scale=0.0))
    await replica.start()
    assert replica.port is not None
    with socket.create_connection(("127.0.0.1", replica.port), timeout=5) as client:
        for _ in range(steps):
            await asyncio.sleep(0)  # one event-loop step each: where in the accept the kill lands
        await replica.kill()
        client.settimeout(5)  # a leaked server socket never closes: recv times out and the test fails
        assert await anyio.to_thread.run_sync(_wait_closed, client) == b""
    gc.collect()  # a leaked, unreferenced server socket would warn here (warnings are errors)
