"""A bounded run of ``loadtests/epp_identity.py``: mixed requests through a real Envoy and ``burstsched epp``
(both child processes) arrive byte-identical to the same requests sent to the replica directly, none lost,
and the client's cancellations reach the replicas."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from loadtests.epp_identity import MODES, Outcome, main, make_specs, parse_args, same

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("mode", sorted(MODES))
async def test_mixed_requests_are_byte_identical_and_none_is_lost(envoy_path: Path, mode: str) -> None:
    args = parse_args(["--requests", "60", "--mode", mode, "--config", str(REPO / "config" / "default.yaml")])
    with anyio.fail_after(100):
        report = await main(args)
    assert report.lost == [] and report.mismatches == []
    assert report.largest_prompt_bytes == 200_000
    assert set(report.by_kind) == {"chat", "chat-stream", "completions", "completions-stream"}
    assert report.cancelled_asked >= 3 and report.cancelled_cut >= 1
    assert report.compared == report.completed == report.identical == 60 - report.cancelled_asked
    assert len(report.served_by) == 2
    assert not any(report.replicas_busy_after.values()), report.replicas_busy_after


def test_the_comparison_sees_one_byte_and_ignores_only_created() -> None:
    spec = make_specs(1, 100, 0.0, 0)[0]
    body = b'{"id":"cmpl-x","created": 1700000000,"choices":[{"text":"ab"}]}'
    a = Outcome(spec, 200, "application/json", body)
    assert same(a, Outcome(spec, 200, "application/json", body.replace(b"1700000000", b"1700000001")))
    assert not same(a, Outcome(spec, 200, "application/json", body.replace(b'"ab"', b'"ac"')))
    assert not same(a, Outcome(spec, 200, "text/event-stream", body))
