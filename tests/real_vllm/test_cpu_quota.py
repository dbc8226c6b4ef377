"""The CPU quota load tests put on real vLLM replicas: the cgroup files it writes, and a real cgroup."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from burstsched.testing.cpu_quota import CGROUP_ROOT, CpuQuota, CpuQuotaError


def test_v1_layout_gets_period_and_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    quota = CpuQuota("replica-0", 0.85, root=tmp_path, period_us=10_000)
    assert quota.path == tmp_path / "cpu" / "replica-0"
    assert (quota.path / "cpu.cfs_period_us").read_text() == "10000\n"
    assert (quota.path / "cpu.cfs_quota_us").read_text() == "8500\n"


def test_v2_layout_gets_cpu_max(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    quota = CpuQuota("replica-1", 1.5, root=tmp_path, period_us=10_000)
    assert quota.path == tmp_path / "replica-1"
    assert (quota.path / "cpu.max").read_text() == "15000 10000\n"


def test_no_cpu_controller_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CpuQuotaError, match="no cpu controller"):
        CpuQuota("x", 1.0, root=tmp_path)
    (tmp_path / "cgroup.controllers").write_text("cpu\n")
    with pytest.raises(ValueError, match="cores"):
        CpuQuota("x", 0.0, root=tmp_path)


def _writable_cgroups() -> bool:
    try:
        CpuQuota(f"burstsched-probe-{os.getpid()}", 1.0).close()
    except (CpuQuotaError, OSError):
        return False
    return True


@pytest.mark.skipif(not _writable_cgroups(), reason="the cgroup file system is not writable here")
def test_a_real_process_lands_in_the_group_and_the_group_goes_with_it() -> None:
    quota = CpuQuota(f"burstsched-test-{os.getpid()}", 0.5)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert quota.add([child.pid]) == 1
        membership = Path(f"/proc/{child.pid}/cgroup").read_text()
        assert quota.path.name in membership
    finally:
        child.kill()
        child.wait(timeout=10)
    quota.close()
    assert not quota.path.exists()
    assert CGROUP_ROOT.exists()
