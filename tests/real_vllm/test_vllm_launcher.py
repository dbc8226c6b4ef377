"""The launcher's own behaviour, without vLLM: environment checks, start-up failures, stopping by PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from burstsched.testing import vllm_env
from burstsched.testing.fixtures import skip_reason
from burstsched.testing.ports import free_ports
from burstsched.testing.vllm_replica import (
    STOP_TIMEOUT_S,
    VllmConfig,
    VllmEnvMissing,
    VllmPool,
    VllmStartError,
    group_alive,
    pin_engine,
    server_args,
    stop_process,
)


def _fake_venv(cache: Path, script: str) -> None:
    """A 'vLLM venv' whose python is a shell script, stamped as ready."""
    venv = cache / "vllm-venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\n" + script + "\n")
    python.chmod(0o755)
    (venv / vllm_env.STAMP_NAME).write_text(vllm_env.stamp_text())


def test_cache_root_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BURSTSCHED_CACHE", str(tmp_path / "explicit"))
    assert vllm_env.venv_dir() == tmp_path / "explicit" / "vllm-venv"
    monkeypatch.delenv("BURSTSCHED_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert vllm_env.cache_root() == tmp_path / "xdg" / "burstsched"


def test_missing_environment_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BURSTSCHED_CACHE", str(tmp_path))
    assert not vllm_env.venv_ready()
    reason = skip_reason()
    assert reason is not None and "make real-vllm" in reason
    with pytest.raises(VllmEnvMissing):
        VllmPool(1).start()


def test_a_server_that_dies_at_start_names_its_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BURSTSCHED_CACHE", str(tmp_path))
    _fake_venv(tmp_path, 'echo "fake engine: no AVX512 here" >&2\nexit 3')
    pool = VllmPool(1, VllmConfig(model=tmp_path, start_timeout_s=20), log_dir=tmp_path / "logs")
    with pytest.raises(VllmStartError, match="exited with 3") as info:
        pool.start()
    assert "fake engine: no AVX512 here" in str(info.value)
    assert all(r.stopped for r in pool.replicas)


def test_a_port_taken_before_the_server_binds_it_is_replaced(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The first start dies as vLLM does when its KV-event port was taken meanwhile; the pool starts the
    replica again on fresh ports, and this time it answers /health."""
    monkeypatch.setenv("BURSTSCHED_CACHE", str(tmp_path))
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "health").write_text("ok")
    marker = tmp_path / "failed-once"
    _fake_venv(
        tmp_path,
        f'if [ ! -e {marker} ]; then touch {marker}; echo "zmq.error.ZMQError: Address already in use" >&2; '
        "exit 1; fi\n"
        'while [ "$1" != "--port" ]; do shift; done\n'
        f"exec {sys.executable} -m http.server $2 --bind 127.0.0.1 --directory {tmp_path / 'www'}",
    )
    pool = VllmPool(1, VllmConfig(model=tmp_path, start_timeout_s=20), log_dir=tmp_path / "logs")
    with pool:
        assert httpx.get(f"{pool.urls[0]}/health").status_code == 200
    logs = sorted((tmp_path / "logs").iterdir())
    assert len(logs) == 2
    assert sum("Address already in use" in log.read_text() for log in logs) == 1


def test_a_server_that_never_answers_is_stopped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BURSTSCHED_CACHE", str(tmp_path))
    _fake_venv(tmp_path, 'echo "loading weights"\nexec sleep 60')
    pool = VllmPool(1, VllmConfig(model=tmp_path, start_timeout_s=2), log_dir=tmp_path / "logs")
    with pytest.raises(VllmStartError, match="did not answer /health") as info:
        pool.start()
    assert "loading weights" in str(info.value)
    replica = pool.replicas[0]
    assert replica.process.returncode is not None
    assert not group_alive(replica.pid)


_INTERRUPTED_LOAD_TEST = """
import faulthandler, signal, sys
from pathlib import Path

import anyio

from burstsched.testing.vllm_replica import VllmConfig, VllmPool


def interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")  # as the load tests unwind on SIGTERM


async def main(model):
    async with VllmPool(2, VllmConfig(model=model, start_timeout_s=60), log_dir=model / "logs"):
        await anyio.sleep(60)


faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for the stacks if it hangs
signal.signal(signal.SIGTERM, interrupt)
anyio.run(main, Path(sys.argv[1]))
"""

_EXIT_BOUND_S = 2 * STOP_TIMEOUT_S + 15
"""How long the interrupted load test may take to exit: each of its 2 replicas may need the whole stop
timeout before SIGKILL, and a loaded machine's interpreter some seconds more."""


def test_a_load_test_interrupted_while_its_replicas_start_stops_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """SIGTERM reaches a load test while its pool waits for the replicas' /health (the start-up runs in a
    thread). The replicas run in their own sessions, so nothing else would stop them: the pool must, before
    the process exits."""
    monkeypatch.setenv("BURSTSCHED_CACHE", str(tmp_path))
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "health").write_text("ok")
    started = tmp_path / "started"
    _fake_venv(  # like vLLM: loads for a while, then answers /health
        tmp_path,
        f"echo $$ >> {started}\nsleep 3\n"
        'while [ "$1" != "--port" ]; do shift; done\n'
        f"exec {sys.executable} -m http.server $2 --bind 127.0.0.1 --directory {tmp_path / 'www'}",
    )
    stderr = tmp_path / "load-test.err"
    with stderr.open("wb") as err:
        test = subprocess.Popen([sys.executable, "-c", _INTERRUPTED_LOAD_TEST, str(tmp_path)], stderr=err)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 30
        while not (started.exists() and len(started.read_text().split()) == 2):
            assert time.monotonic() < deadline, "the fake replicas did not start"
            time.sleep(0.05)
        pids = [int(pid) for pid in started.read_text().split()]
        test.send_signal(signal.SIGTERM)  # they are still loading
        try:
            returncode = test.wait(timeout=_EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            test.send_signal(signal.SIGUSR1)  # every thread's stack to its stderr
            time.sleep(1.0)
            raise AssertionError(
                f"the load test did not exit within {_EXIT_BOUND_S} s of SIGTERM; its stderr:\n"
                + stderr.read_text(errors="replace")[-6000:]
            ) from None
        assert returncode != 0
        deadline = time.monotonic() + 10
        while any(group_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [pid for pid in pids if group_alive(pid)] == []
    finally:
        if test.poll() is None:
            test.kill()
            test.wait(timeout=10)  # reaped here, not left to warn in a later test
        for pid in pids:  # end what the test started, whatever happened
            if group_alive(pid):
                os.killpg(pid, signal.SIGKILL)


def test_stop_escalates_to_sigkill_for_the_whole_group() -> None:
    # A leader that ignores SIGINT, with a child in its process group that ignores it too.
    code = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)'])\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True, text=True
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    stop_process(process, timeout_s=1.0)
    process.stdout.close()
    assert process.returncode == -signal.SIGKILL
    assert not group_alive(process.pid)


def test_server_args_carry_the_options(tmp_path: Path) -> None:
    config = VllmConfig(
        model=tmp_path,
        num_gpu_blocks_override=80,
        kv_events=True,
        otlp_traces_endpoint="http://127.0.0.1:4318",
    )
    args = server_args(config, tmp_path, 8001, 5557, "kv@127.0.0.1:8001@kv-demo")
    assert args[:2] == ["-m", "vllm.entrypoints.openai.api_server"]
    for flag in ("--enable-prefix-caching", "--enforce-eager", "--enable-prompt-tokens-details"):
        assert flag in args
    assert args[args.index("--num-gpu-blocks-override") + 1] == "80"
    assert '"endpoint": "tcp://*:5557"' in args[args.index("--kv-events-config") + 1]
    assert args[args.index("--otlp-traces-endpoint") + 1] == "http://127.0.0.1:4318"
    assert args[args.index("--dtype") + 1] == "float32"


ENGINE_LIKE = """
import subprocess, sys, time
engine = ("import threading, time; "
          "threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); time.sleep(60)")
child = subprocess.Popen([sys.executable, "-c", engine])
print(child.pid, flush=True)
time.sleep(60)
"""


def test_pin_engine_binds_every_thread_of_the_group_but_its_leader() -> None:
    """A leader (the API server's place) with a two-thread child (the engine's): the child's threads go to
    the core, the leader keeps its cores."""
    core = max(os.sched_getaffinity(0))
    leader = subprocess.Popen(
        [sys.executable, "-c", ENGINE_LIKE], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert leader.stdout is not None
        child = int(leader.stdout.readline())
        tasks = Path(f"/proc/{child}/task")
        deadline = time.monotonic() + 10
        while len(list(tasks.iterdir())) < 2:
            assert time.monotonic() < deadline, "the child never started its thread"
            time.sleep(0.01)
        assert pin_engine(leader.pid, core) == 2
        assert [os.sched_getaffinity(int(t.name)) for t in tasks.iterdir()] == [{core}, {core}]
        assert os.sched_getaffinity(leader.pid) == os.sched_getaffinity(0)
    finally:
        stop_process(leader)
        if leader.stdout is not None:
            leader.stdout.close()
    assert not group_alive(leader.pid)


def test_pool_size_is_bounded_by_cores() -> None:
    with pytest.raises(ValueError):
        VllmPool((os.cpu_count() or 1) + 1)
    assert len(set(free_ports(4))) == 4


def test_public_names_exist() -> None:
    import burstsched.testing as testing

    assert sorted(testing.__all__) == testing.__all__
    assert all(hasattr(testing, name) for name in testing.__all__)
