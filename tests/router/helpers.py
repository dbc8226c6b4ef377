"""Shared builders for the router tests."""

from __future__ import annotations

import random
import subprocess
from collections.abc import Awaitable, Callable, Sequence

import anyio
import httpx
from prometheus_client.parser import text_string_to_metric_families

from burstsched.config import EndpointConfig, PoolConfig, RouterConfig, parse_config_text
from burstsched.framework import ApiKind, PluginContext, PluginRegistry, SchedRequest
from burstsched.scheduling import Scheduler, build_scheduler

FAST_POOL = PoolConfig(scrape_interval_ms=20, staleness_threshold_ms=2000, health_check_interval_ms=100)


def router_config(urls: Sequence[tuple[str, str]], yaml_text: str = "", **updates: object) -> RouterConfig:
    """A config from YAML text (default: the recommended one) with these endpoints and a fast pool."""
    base = parse_config_text(yaml_text) if yaml_text else RouterConfig()
    endpoints = [EndpointConfig(name=name, url=url) for name, url in urls]
    return base.model_copy(update={"endpoints": endpoints, "pool": FAST_POOL, **updates})


def scheduler_for(config: RouterConfig, seed: int = 0) -> Scheduler:
    return build_scheduler(config, PluginRegistry.discover(), PluginContext(rng=random.Random(seed)))


def sched_request(hashes: Sequence[int] = (), *, group_size: int = 1, request_id: str = "r") -> SchedRequest:
    return SchedRequest(
        request_id=request_id,
        model="m",
        api=ApiKind.CHAT,
        block_hashes=tuple(hashes),
        prompt_tokens=64 * len(hashes),
        group_size=group_size,
    )


async def eventually(
    check: Callable[[], Awaitable[bool]], *, within_s: float = 10.0, poll: float = 0.01
) -> None:
    """Wait until ``check()`` holds, polling; fail after ``within_s`` seconds."""
    with anyio.fail_after(within_s):
        while not await check():  # noqa: ASYNC110 - polls state owned by another server
            await anyio.sleep(poll)


async def until_serving(proc: subprocess.Popen[bytes], client: httpx.AsyncClient) -> None:
    """Wait (30 s at most) until the ``burstsched serve`` process ``proc`` answers ``/ready``."""

    async def ready() -> bool:
        assert proc.poll() is None, "burstsched serve exited early"
        try:
            return (await client.get("/ready")).status_code == 200
        except httpx.TransportError:
            return False

    await eventually(ready, within_s=30, poll=0.1)


def metric(text: str, name: str, **labels: str) -> float:
    """The value of sample ``name`` with these labels in a Prometheus exposition (0 when absent)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0
