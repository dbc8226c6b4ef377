"""``burstsched serve`` as a command: configuration errors, and a real process started and stopped by PID."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
import httpx
import pytest

from burstsched import cli
from burstsched.testing.ports import free_port
from burstsched.testing.replicas import MODEL, sim_replicas

from .helpers import until_serving

REPO = Path(__file__).resolve().parents[2]


def test_bad_config_exits_2_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("pool:\n  scrape_interval_ms: -5\n")
    assert cli.main(["serve", "--config", str(config), "--endpoint", "http://127.0.0.1:9"]) == 2
    assert "pool.scrape_interval_ms:" in capsys.readouterr().err


def test_missing_endpoints_and_bad_endpoint_argument(capsys: pytest.CaptureFixture[str]) -> None:
    default = str(REPO / "config" / "default.yaml")
    assert cli.main(["serve", "--config", default]) == 2
    assert "no endpoints" in capsys.readouterr().err
    assert cli.main(["serve", "--config", default, "--endpoint", "a=127.0.0.1:9"]) == 2
    assert "--endpoint.url" in capsys.readouterr().err


@pytest.mark.anyio
async def test_serve_process_routes_and_stops_on_sigint() -> None:
    async with sim_replicas(2) as replicas:
        port = free_port()
        args = [
            sys.executable,
            "-m",
            "burstsched",
            "serve",
            "--config",
            str(REPO / "config" / "prefix-aware.yaml"),
        ]
        args += ["--port", str(port)]
        for replica in replicas:
            args += ["--endpoint", f"{replica.name}={replica.url}"]
        log = tempfile.TemporaryFile()  # not a pipe: nobody reads it while the server runs
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)  # noqa: ASYNC220
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
                await until_serving(proc, client)
                body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
                response = await client.post("/v1/chat/completions", json=body)
                assert response.status_code == 200, response.text
                assert response.headers["x-burstsched-endpoint"] in {r.name for r in replicas}
        finally:
            proc.send_signal(signal.SIGINT)
            with anyio.fail_after(20):
                code = await anyio.to_thread.run_sync(proc.wait)
            log.seek(0)
            stderr = log.read().decode()
            log.close()
        assert code == 0, stderr
        assert "Traceback" not in stderr
