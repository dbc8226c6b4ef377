"""The load generator's collector is frozen for a run and handed back after it."""

from __future__ import annotations

import gc

import pytest

from burstsched.workloads.quiet_gc import quiet_gc


def test_live_objects_are_frozen_during_the_block_and_released_after() -> None:
    sequence = [{"prompt": f"request {i}"} for i in range(1000)]
    before = gc.get_freeze_count()  # another test in this process may have frozen objects already
    with quiet_gc():
        assert gc.get_freeze_count() >= before + len(sequence)
    assert gc.get_freeze_count() == 0


def test_the_freeze_is_released_when_the_run_fails() -> None:
    with pytest.raises(RuntimeError), quiet_gc():
        raise RuntimeError("the run failed")
    assert gc.get_freeze_count() == 0
