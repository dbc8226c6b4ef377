"""Real vLLM (CPU build) replicas for tests: start on free ports, wait for health, stop by PID."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import anyio.to_thread
import httpx

from burstsched.testing.cpu_quota import CpuQuota
from burstsched.testing.ports import free_ports
from burstsched.testing.replica_hooks import burstsched_request_ids as request_ids
from burstsched.testing.tiny_model import ensure_model
from burstsched.testing.vllm_env import venv_python, venv_ready

START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 20.0
LOG_TAIL_CHARS = 4000
PORT_RETRIES = 3


class VllmStartError(RuntimeError):
    """A replica died or did not answer `/health` in time; the message ends with its log's tail."""


class VllmEnvMissing(RuntimeError):
    """The vLLM venv is absent (run `make real-vllm`)."""


@dataclass(frozen=True)
class VllmConfig:
    """How to run each replica; `None` fields leave vLLM's defaults."""

    served_model_name: str = "kv-demo"
    model: Path | None = None
    max_model_len: int = 8192
    kv_cache_space_gib: int = 1
    num_gpu_blocks_override: int | None = None
    kv_events: bool = False
    prompt_tokens_details: bool = True
    otlp_traces_endpoint: str | None = None
    extra_args: tuple[str, ...] = ()
    start_timeout_s: float = START_TIMEOUT_S
    cpu_quota_cores: float | None = None
    """Cap each replica (all its processes) at this many CPUs through a cgroup (see
    :mod:`burstsched.testing.cpu_quota`); None leaves them uncapped."""
    record_request_ids: bool = False
    """Each replica writes the ``X-Request-Id`` of every inference request it receives to a file beside its
    log (``VllmReplica.request_ids_path``), through vLLM's ``--middleware``
    (:mod:`burstsched.testing.replica_hooks.burstsched_request_ids`)."""


@dataclass
class VllmReplica:
    """One running API server: its URL, PID, log and (optionally) its KV-event endpoint."""

    index: int
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    kv_events_port: int | None = None
    kv_topic: str = ""
    stopped: bool = field(default=False)
    kv_replay_port: int | None = None
    request_ids_path: Path | None = None
    """Where it writes the id of each inference request it receives (``VllmConfig.record_request_ids``)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def kv_events_endpoint(self) -> str | None:
        """Where a ZMQ SUB socket connects to receive this replica's KV events."""
        return None if self.kv_events_port is None else f"tcp://127.0.0.1:{self.kv_events_port}"

    @property
    def kv_replay_endpoint(self) -> str | None:
        """Where a ZMQ DEALER asks this replica to replay its buffered KV-event batches."""
        return None if self.kv_replay_port is None else f"tcp://127.0.0.1:{self.kv_replay_port}"

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError as exc:
            return f"(no log: {exc})"


def server_env(core: int) -> dict[str, str]:
    """The environment a CPU replica needs; one OpenMP core each."""
    env = dict(os.environ)
    env.update(
        VLLM_TARGET_DEVICE="cpu",
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CPU_OMP_THREADS_BIND=str(core),
        VLLM_SERVER_DEV_MODE="1",
        HF_HUB_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    return env


def server_args(
    config: VllmConfig,
    model: Path,
    port: int,
    kv_port: int | None,
    topic: str,
    replay_port: int | None = None,
) -> list[str]:
    """The API server's command line (after the interpreter)."""
    args = [
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        config.served_model_name,
        "--dtype",
        "float32",
        "--max-model-len",
        str(config.max_model_len),
        "--enable-prefix-caching",
        "--enforce-eager",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    if kv_port is not None:
        # vLLM binds only an endpoint with a wildcard (`tcp://*:PORT`); `tcp://127.0.0.1:PORT` would connect.
        events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{kv_port}",
            "topic": topic,
        }
        if replay_port is not None:
            events["replay_endpoint"] = f"tcp://*:{replay_port}"
        args += ["--kv-events-config", json.dumps(events)]
    if config.prompt_tokens_details:
        args.append("--enable-prompt-tokens-details")
    if config.num_gpu_blocks_override is not None:
        args += ["--num-gpu-blocks-override", str(config.num_gpu_blocks_override)]
    if config.otlp_traces_endpoint is not None:
        args += ["--otlp-traces-endpoint", config.otlp_traces_endpoint]
    if config.record_request_ids:
        module = request_ids.__name__.rsplit(".", 1)[-1]  # top-level there: its folder is on PYTHONPATH
        args += ["--middleware", f"{module}.{request_ids.RecordRequestIds.__name__}"]
    return args + list(config.extra_args)


def request_ids_env(env: dict[str, str], path: Path) -> dict[str, str]:
    """``env`` with the request-id middleware importable (its folder first on ``PYTHONPATH``) and writing
    to ``path``."""
    hooks = str(Path(request_ids.__file__).resolve().parent)
    search = env.get("PYTHONPATH")
    return {
        **env,
        "PYTHONPATH": hooks if not search else f"{hooks}{os.pathsep}{search}",
        request_ids.VARIABLE: str(path),
    }


def stop_process(process: subprocess.Popen[Any], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGINT the process group led by `process`; SIGKILL it after `timeout_s`; reap the leader."""
    pgid = process.pid
    _signal_group(pgid, signal.SIGINT)
    deadline = time.monotonic() + timeout_s
    try:
        process.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if group_alive(pgid) or process.poll() is None:
        _signal_group(pgid, signal.SIGKILL)
        process.wait(timeout=timeout_s)
        end = time.monotonic() + timeout_s
        while group_alive(pgid) and time.monotonic() < end:
            time.sleep(0.1)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs; zombies waiting for init to reap them do not count."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not Path("/proc").is_dir():
        return True
    return any(state not in ("Z", "X") for _, state in _group_members(pgid))


def _group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, state letter) of every process in the group, read from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # state, ppid, pgrp, ...
        if len(fields) > 2 and int(fields[2]) == pgid:
            members.append((int(entry.name), fields[0]))
    return members


def pin_engine(pgid: int, core: int) -> int:
    """Bind every thread of a replica's engine (its process group but the API server leading it) to `core`;
    returns how many threads were bound. Threads started later inherit the binding.

    vLLM binds only its worker's OpenMP threads; the engine-core process, which waits for the worker in a
    busy loop, floats. On a 2-core machine the pair then fills both cores while a request generates, and
    every other process (the replica's own API server, the tests) was measured waiting up to 7 s for a
    core: a stream's first token arrived after its last was generated. Bound to the worker's core, the
    engine leaves the other cores free (same measurement: no wait over 10 ms).
    """
    bound = 0
    for pid, _ in _group_members(pgid):
        if pid == pgid:
            continue
        try:
            threads = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
        except OSError:
            continue  # the process ended meanwhile
        for tid in threads:
            try:
                os.sched_setaffinity(tid, {core})
            except OSError:
                continue
            bound += 1
    return bound


class VllmPool:
    """N real vLLM replicas; a context manager (`with` or `async with`) that always stops what it started."""

    def __init__(
        self,
        n: int = 1,
        config: VllmConfig | None = None,
        *,
        cores: Sequence[int] | None = None,
        log_dir: Path | None = None,
    ):
        """`cores`: the core each replica's OpenMP threads bind to (default 0, 1, …). Logs go to `log_dir`
        (kept), else to a temporary folder removed on a clean stop and kept when something failed."""
        cpu_count = os.cpu_count() or 1
        if n < 1 or n > cpu_count:
            raise ValueError(f"between 1 and {cpu_count} replicas (one core each), not {n}")
        self.n = n
        self.config = config or VllmConfig()
        self.cores = list(cores) if cores is not None else list(range(n))
        if len(self.cores) != n:
            raise ValueError("one core per replica")
        self.replicas: list[VllmReplica] = []
        self._quotas: dict[int, CpuQuota] = {}
        self._log_dir: Path | None = log_dir
        self._own_log_dir = log_dir is None
        self._abort = threading.Event()
        """Set when the task awaiting :meth:`start` (in a thread) was cancelled: start-up gives up."""
        self._starting = threading.Lock()
        """Held while :meth:`start` runs."""

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    @property
    def names(self) -> list[str]:
        return [f"vllm-{r.index}" for r in self.replicas]

    @property
    def endpoints(self) -> list[tuple[str, str]]:
        """(name, base URL) of each replica."""
        return list(zip(self.names, self.urls, strict=True))

    @property
    def model(self) -> str:
        """The served model name requests must use."""
        return self.config.served_model_name

    def start(self) -> None:
        """Start every replica at once, then wait until each answers `/health` (bounded)."""
        with self._starting:
            self._abort.clear()
            self._start()

    def _start(self) -> None:
        if not venv_ready():
            raise VllmEnvMissing("the vLLM venv is not prepared: run `make real-vllm`")
        model = self.config.model or ensure_model()
        if self._log_dir is None:
            self._log_dir = Path(tempfile.mkdtemp(prefix="burstsched-vllm-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)
        ports = free_ports(self.n * (3 if self.config.kv_events else 1))
        try:
            for i in range(self.n):
                self.replicas.append(self._launch(i, model, ports))
            deadline = time.monotonic() + self.config.start_timeout_s
            with httpx.Client(timeout=2.0, trust_env=False) as client:
                for i in range(self.n):
                    self._wait_started(client, i, model, deadline)
            for replica in self.replicas:
                pin_engine(replica.pid, self.cores[replica.index])
                self._cap(replica)
        except BaseException:
            self.stop(keep_logs=True)
            raise

    def _wait_started(self, client: httpx.Client, i: int, model: Path, deadline: float) -> None:
        """Wait until replica ``i`` answers ``/health``. A port is picked free and bound by vLLM seconds
        later; when another process took it meanwhile, the start fails on that alone and is repeated on
        fresh ports (at most PORT_RETRIES times, each with a full start timeout)."""
        for attempt in range(PORT_RETRIES + 1):
            replica = self.replicas[i]
            try:
                _wait_healthy(client, replica, deadline, self._abort)
                return
            except VllmStartError:
                if attempt == PORT_RETRIES or not _port_taken(replica):
                    raise
            stop_process(replica.process)  # what is left of its process group
            replica.stopped = True
            fresh = free_ports(3)
            ports = [0] * (3 * self.n)
            ports[i], ports[self.n + i], ports[2 * self.n + i] = fresh
            self.replicas[i] = self._launch(i, model, ports)
            deadline = time.monotonic() + self.config.start_timeout_s

    def _launch(self, i: int, model: Path, ports: list[int]) -> VllmReplica:
        assert self._log_dir is not None
        port = ports[i]
        kv_port = ports[self.n + i] if self.config.kv_events else None
        replay_port = ports[2 * self.n + i] if self.config.kv_events else None
        topic = f"kv@127.0.0.1:{port}@{self.config.served_model_name}" if kv_port is not None else ""
        log_path = self._log_dir / f"replica-{i}-{port}.log"
        env = server_env(self.cores[i])
        ids_path = None
        if self.config.record_request_ids:
            ids_path = self._log_dir / f"replica-{i}-{port}.ids"
            env = request_ids_env(env, ids_path)
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [str(venv_python()), *server_args(self.config, model, port, kv_port, topic, replay_port)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return VllmReplica(
            i, port, process, log_path, kv_port, topic, kv_replay_port=replay_port, request_ids_path=ids_path
        )

    def restart(self, i: int, *, kill: bool = True) -> VllmReplica:
        """Stop replica ``i`` (SIGKILL to its process group with ``kill``, else a clean stop) and start a new
        process on the same ports; returns once it answers ``/health`` (bounded)."""
        old = self.replicas[i]
        if not old.stopped:
            if kill:
                _signal_group(old.process.pid, signal.SIGKILL)
                old.process.wait(timeout=STOP_TIMEOUT_S)
                end = time.monotonic() + STOP_TIMEOUT_S
                while group_alive(old.process.pid) and time.monotonic() < end:
                    time.sleep(0.05)  # the engine's processes release the ports when they are gone
            else:
                stop_process(old.process)
            old.stopped = True
        ports = [0] * (3 * self.n)
        ports[i] = old.port
        if old.kv_events_port is not None:
            ports[self.n + i] = old.kv_events_port
        if old.kv_replay_port is not None:
            ports[2 * self.n + i] = old.kv_replay_port
        replica = self._launch(i, self.config.model or ensure_model(), ports)
        self.replicas[i] = replica
        deadline = time.monotonic() + self.config.start_timeout_s
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            _wait_healthy(client, replica, deadline)
        pin_engine(replica.pid, self.cores[i])
        self._cap(replica)
        return replica

    def _cap(self, replica: VllmReplica) -> None:
        """Move every process of the replica into its CPU quota's cgroup (``cpu_quota_cores``)."""
        cores = self.config.cpu_quota_cores
        if cores is None:
            return
        quota = self._quotas.get(replica.index)
        if quota is None:
            quota = CpuQuota(f"burstsched-replica-{os.getpid()}-{replica.index}", cores)
            self._quotas[replica.index] = quota
        quota.add([pid for pid, _ in _group_members(replica.pid)])

    def stop(self, *, keep_logs: bool = False) -> None:
        """Stop every replica by PID (whole process group); remove the logs unless asked to keep them."""
        for replica in self.replicas:
            if not replica.stopped:
                stop_process(replica.process)
                replica.stopped = True
        for quota in self._quotas.values():
            quota.close()
        self._quotas.clear()
        if self._log_dir is not None and self._own_log_dir and not keep_logs:
            shutil.rmtree(self._log_dir, ignore_errors=True)

    def __enter__(self) -> VllmPool:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop(keep_logs=exc is not None)

    async def __aenter__(self) -> VllmPool:
        try:
            await anyio.to_thread.run_sync(self.start)
        except BaseException:
            # Cancelled while the start-up thread runs (a deadline, or SIGTERM/Ctrl-C unwinding the event
            # loop): no __aexit__ follows, and the thread would go on starting replicas in their own
            # sessions after this process stopped waiting for it. Tell it to give up, then stop what it
            # started once it has returned.
            self._abort.set()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._stop_after_start)
            raise
        return self

    def _stop_after_start(self) -> None:
        with self._starting:
            self.stop(keep_logs=True)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(lambda: self.stop(keep_logs=exc is not None))


def _port_taken(replica: VllmReplica) -> bool:
    """Whether the replica exited because an address it was given was in use (its whole log, not a tail:
    the engine's error comes well before the API server's last traceback)."""
    if replica.process.poll() is None:
        return False
    try:
        log = replica.log_path.read_text(errors="replace")
    except OSError:
        return False
    return "address already in use" in log.lower()


def _wait_healthy(
    client: httpx.Client, replica: VllmReplica, deadline: float, abort: threading.Event | None = None
) -> None:
    while True:
        code = replica.process.poll()
        if code is not None:
            raise VllmStartError(
                f"vLLM replica {replica.index} (pid {replica.pid}) exited with {code} during start-up; "
                f"log {replica.log_path}:\n{replica.log_tail()}"
            )
        try:
            if client.get(f"{replica.url}/health").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise VllmStartError(
                f"vLLM replica {replica.index} (pid {replica.pid}) did not answer /health in time; "
                f"log {replica.log_path}:\n{replica.log_tail()}"
            )
        if abort is None:
            time.sleep(0.5)
        elif abort.wait(0.5):
            raise VllmStartError(f"vLLM replica {replica.index} (pid {replica.pid}): start-up abandoned")
