"""Builders shared by the hardening tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import anyio

from burstsched.config import EndpointConfig, PoolConfig, RouterConfig

FAST_POOL = PoolConfig(scrape_interval_ms=20, staleness_threshold_ms=2000, health_check_interval_ms=100)


def config_for(urls: Sequence[tuple[str, str]], **updates: object) -> RouterConfig:
    """The recommended config with these endpoints, a fast pool and ``updates`` (whole sections)."""
    endpoints = [EndpointConfig(name=name, url=url) for name, url in urls]
    return RouterConfig().model_copy(update={"endpoints": endpoints, "pool": FAST_POOL, **updates})


async def eventually(check: Callable[[], Awaitable[bool]], *, within_s: float = 10.0) -> None:
    """Wait until ``check()`` holds, polling; fail after ``within_s`` seconds."""
    with anyio.fail_after(within_s):
        while not await check():  # noqa: ASYNC110 - polls state owned by another server
            await anyio.sleep(0.02)
