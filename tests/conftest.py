"""Shared test configuration: anyio runs async tests on asyncio; hypothesis is derandomized in CI."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# Locally each run explores new examples; CI (CI=true) replays a fixed set, so a run's verdict does not
# depend on which examples hypothesis happened to draw.
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
