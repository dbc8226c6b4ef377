"""The fidelity workload (loadtests/fidelity.py) on the session replica and on a simulator set up like it."""

from __future__ import annotations

from pathlib import Path

import pytest

from burstsched.testing.backends import sim_backend
from burstsched.testing.fixtures import REAL_VLLM_TIMEOUT_S
from burstsched.testing.vllm_replica import VllmPool
from burstsched.workloads.fidelity import Target, mismatches, run_workload

pytestmark = [pytest.mark.anyio, pytest.mark.real_vllm, pytest.mark.timeout(REAL_VLLM_TIMEOUT_S)]


async def test_simulator_counts_what_vllm_counts(vllm_pool: VllmPool, tiny_model_dir: Path) -> None:
    real = await run_workload(Target(vllm_pool.urls[0], vllm_pool.model), pairs=2)
    with sim_backend(tiny_model_dir, kv_events=False) as sim:
        simulated = await run_workload(Target(sim.url, sim.model), pairs=2)
    assert [r.key() for r in real] == [r.key() for r in simulated]
    assert mismatches(real, simulated) == []
    warm = [r for r in real if r.case == "seed" and r.label.endswith("warm")]
    assert warm and all(r.hits > 0 and r.computed < r.prompt_tokens for r in warm)
