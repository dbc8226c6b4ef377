"""A load test's router log is deleted when the router ran clean and kept, with its path said, when not."""

from __future__ import annotations

from pathlib import Path

import pytest

from burstsched.workloads.router_process import keep_if_troubled

CLEAN = "2026-12-06 02:00:00,000 INFO burstsched.server: listening on 127.0.0.1:8000\n"


def test_a_clean_log_is_deleted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "router.log"
    log.write_text(CLEAN)
    keep_if_troubled(log)
    assert not log.exists()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "line",
    [
        "2026-12-06 02:00:14,070 WARNING burstsched.dispatch: request r1: a failed (boom)",
        "2026-12-06 02:00:14,070 ERROR uvicorn.error: Exception in ASGI application",
        "Traceback (most recent call last):",
    ],
)
def test_a_log_with_warnings_or_errors_is_kept_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str
) -> None:
    log = tmp_path / "router.log"
    log.write_text(CLEAN + line + "\n")
    keep_if_troubled(log)
    assert log.read_text() == CLEAN + line + "\n"
    err = capsys.readouterr().err
    assert f"router log kept: {log} (1 line of warnings or errors)" in err
    assert line in err


def test_a_missing_log_is_no_error(tmp_path: Path) -> None:
    keep_if_troubled(tmp_path / "gone.log")
