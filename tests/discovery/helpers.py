"""Waiting on conditions with a bound, for the discovery tests."""

from __future__ import annotations

from collections.abc import Callable

import anyio


async def eventually(check: Callable[[], bool], *, within_s: float = 10.0, poll: float = 0.01) -> None:
    """Wait until ``check()`` holds, polling state another task or server owns; fail after ``within_s``."""
    with anyio.fail_after(within_s):
        while not check():  # noqa: ASYNC110 - the state belongs to another task
            await anyio.sleep(poll)
