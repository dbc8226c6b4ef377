"""The request-id middleware that real vLLM replicas load: what it writes, and that it loads alone."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest

from burstsched.testing.replica_hooks import burstsched_request_ids as hook
from burstsched.testing.vllm_replica import VllmConfig, request_ids_env, server_args


def _scope(method: str, path: str, rid: bytes | None) -> dict[str, Any]:
    headers = [(b"content-type", b"application/json")]
    if rid is not None:
        headers.append((b"x-request-id", rid))
    return {"type": "http", "method": method, "path": path, "headers": headers}


@pytest.mark.anyio
async def test_each_inference_request_id_is_written_before_the_app_sees_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ids.txt"
    seen: list[str] = []

    async def app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope.get("path", scope["type"]))

    async def receive() -> MutableMapping[str, Any]:
        return {"type": "http.request"}

    async def send(message: MutableMapping[str, Any]) -> None:
        return None

    monkeypatch.setenv(hook.VARIABLE, str(path))
    middleware = hook.RecordRequestIds(app)
    await middleware(_scope("POST", "/v1/chat/completions", b"r-1"), receive, send)
    assert hook.read_ids(path) == ["r-1"]  # on disk before the request's answer: line-buffered
    await middleware(_scope("GET", "/metrics", None), receive, send)
    await middleware(_scope("POST", "/v1/completions", None), receive, send)
    await middleware(_scope("POST", "/tokenize", b"t-1"), receive, send)
    await middleware(_scope("POST", "/v1/chat/completions", b"r-2"), receive, send)
    await middleware({"type": "lifespan"}, receive, send)
    middleware.close()
    assert hook.read_ids(path) == ["r-1", "-", "r-2"]
    assert len(seen) == 6  # everything passed through
    # without the variable nothing is written and everything passes
    monkeypatch.delenv(hook.VARIABLE)
    quiet = hook.RecordRequestIds(app)
    await quiet(_scope("POST", "/v1/chat/completions", b"r-3"), receive, send)
    assert hook.read_ids(path) == ["r-1", "-", "r-2"]
    assert hook.read_ids(tmp_path / "none.txt") == []


def test_the_replica_loads_it_as_a_top_level_module_without_burstsched(tmp_path: Path) -> None:
    config = VllmConfig(model=tmp_path, record_request_ids=True)
    args = server_args(config, tmp_path, 8001, None, "")
    target = args[args.index("--middleware") + 1]
    assert "--middleware" not in server_args(VllmConfig(model=tmp_path), tmp_path, 8001, None, "")
    env = request_ids_env({"PATH": os.environ.get("PATH", ""), "PYTHONPATH": "/elsewhere"}, tmp_path / "ids")
    assert env[hook.VARIABLE] == str(tmp_path / "ids")
    assert env["PYTHONPATH"].endswith(os.pathsep + "/elsewhere")
    # what vLLM does with the argument, in an interpreter that cannot import burstsched
    module, name = target.rsplit(".", 1)
    probe = (
        "import importlib, importlib.util\n"
        "assert importlib.util.find_spec('burstsched') is None, 'burstsched is importable'\n"
        f"cls = getattr(importlib.import_module({module!r}), {name!r})\n"
        "print(cls.__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "RecordRequestIds"
