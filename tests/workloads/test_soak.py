"""A short soak (``loadtests/soak.py``): real ``burstsched sim`` and ``burstsched serve`` processes, one
replica killed and restarted, client disconnects and malformed requests; nothing may be lost, the report is
written.

Only outcomes are asserted, not speeds: the RSS, descriptor and task verdicts of a 20-second run on a shared
machine say little, so they are left to the long run.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest

from burstsched.wire.sse import data_payloads
from burstsched.workloads.soak_client import (
    KINDS,
    MALFORMED,
    StreamState,
    is_openai_error,
    malformed_body,
)
from burstsched.workloads.soak_probe import (
    ProcessReading,
    bucket_difference,
    histogram_quantile,
    parse_runtime,
    read_process,
)
from loadtests.soak import main as soak_main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_a_short_soak_loses_nothing_and_writes_its_report(tmp_path: Path) -> None:
    argv = ["--duration", "20", "--warmup", "2", "--replicas", "2", "--time-scale", "0.5"]
    argv += ["--kill-every", "4", "--down", "1"]  # one kill at 4 s: the next would restart too near the end
    argv += ["--capacity", "6", "--load", "1.0", "--disconnect", "0.2", "--malformed", "0.1"]
    argv += ["--sample-every", "1", "--settle-timeout", "5", "--seed", "3"]
    argv += ["--config", str(ROOT / "config" / "default.yaml"), "--out-dir", str(tmp_path), "--name", "short"]
    soak_main(argv)  # its exit status also holds the timing verdicts: not asserted here

    report = json.loads((tmp_path / "short.json").read_text())
    assert report["problems"] == [], report["problems"]
    outcomes = Counter(report["outcomes"])
    assert outcomes["lost"] == 0 and outcomes["bad_shape"] == 0
    assert sum(outcomes.values()) >= 60  # 6 req/s for 20 s, Poisson: the seed fixes the count
    assert outcomes["completed"] > outcomes["cancelled"] >= 1
    assert [k["replica"] for k in report["kills"]] == ["sim-0"]
    verdicts = {v["name"]: v for v in report["verdicts"]}
    assert verdicts["lost"]["passed"] and verdicts["cut_streams"]["passed"] and verdicts["kills"]["passed"]
    table = {
        row[0]: dict(zip(report["outcome_table"][0], row, strict=True)) for row in report["outcome_table"]
    }
    assert int(table["malformed"]["rejected"]) >= len(MALFORMED)  # the kinds in turn: each at least once
    assert int(table["malformed"]["rejected"]) == sum(int(table["malformed"][kind]) for kind in KINDS)
    assert report["samples"] and report["baseline"]["fds"] > 0 and report["lag_p99_s"] is not None
    assert report["router_outcomes"].get("cancelled", 0) >= 1  # the router saw the client go away

    markdown = (tmp_path / "short.md").read_text()
    assert "lost requests: 0 of" in markdown and "![RSS, fds, tasks and event-loop lag" in markdown
    assert (tmp_path / "short.png").read_bytes().startswith(b"\x89PNG")


# --- the pieces, without processes ------------------------------------------------------------------------


def test_histogram_quantile_interpolates_within_the_bucket_like_prometheus() -> None:
    buckets = ((0.001, 50.0), (0.01, 90.0), (0.1, 100.0), (math.inf, 100.0))
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.001)
    assert histogram_quantile(0.7, buckets) == pytest.approx(0.001 + 0.009 * 20 / 40)
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.01 + 0.09 * 9 / 10)
    assert histogram_quantile(0.99, ((0.1, 0.0), (math.inf, 4.0))) == 0.1  # in +Inf: the highest bound
    assert histogram_quantile(0.99, ((0.1, 0.0), (math.inf, 0.0))) is None
    later, earlier = ((0.1, 7.0), (math.inf, 9.0)), ((0.1, 5.0), (math.inf, 5.0))
    assert bucket_difference(later, earlier) == ((0.1, 2.0), (math.inf, 4.0))


def test_parse_runtime_reads_the_routers_families() -> None:
    text = (ROOT / "tests" / "observability" / "golden" / "runtime.txt").read_text()
    text += 'burstsched_requests_total{endpoint="sim-0",outcome="ok"} 3.0\n'
    text += 'burstsched_requests_total{endpoint="none",outcome="ok"} 1.0\n'
    reading = parse_runtime(text)
    assert reading.tasks == 7.0 and reading.requests == {"ok": 4.0}
    assert reading.lag[-1] == (math.inf, 4.0) and reading.lag[0] == (0.0005, 1.0)
    with pytest.raises(ValueError):
        parse_runtime("# nothing\n")


def test_read_process_reads_status_and_fd_of_the_pid(tmp_path: Path) -> None:
    (tmp_path / "42" / "fd").mkdir(parents=True)
    for fd in ("0", "1", "7"):
        (tmp_path / "42" / "fd" / fd).touch()
    (tmp_path / "42" / "status").write_text("Name:\tpython\nVmPeak:\t 9 kB\nVmRSS:\t  2048 kB\n")
    assert read_process(42, tmp_path) == ProcessReading(rss_bytes=2048 * 1024, fds=3)


def _kind(lines: list[str], transport_error: str | None = None) -> str:
    """How a stream of these ``data:`` lines (each one event) is classified."""
    state = StreamState()
    for data in data_payloads("".join(line + "\n\n" for line in lines)):
        state.read(data)
    return state.kind(transport_error)[0]


FINISHED = 'data: {"choices": [{"delta": {}, "finish_reason": "length"}]}'
ERROR = 'data: {"error": {"message": "upstream died", "type": "bad_gateway", "param": null, "code": null}}'


def test_streams_are_classified_by_how_they_end() -> None:
    assert _kind([FINISHED, "data: [DONE]"]) == "completed"
    assert _kind(['data: {"choices": []}', ERROR, "data: [DONE]"]) == "stream_error"
    assert _kind([ERROR]) == "lost"  # an error event without [DONE]
    assert _kind([FINISHED], "ReadError: reset") == "lost"  # cut without an error event
    assert _kind([FINISHED]) == "lost"  # ended without [DONE]
    assert _kind(["data: [DONE]"]) == "lost"  # no finish_reason
    assert _kind([FINISHED, "data: [DONE]", FINISHED]) == "bad_shape"


def test_openai_errors_and_malformed_bodies() -> None:
    assert is_openai_error({"error": {"message": "m", "type": "t", "param": None, "code": None}})
    assert not is_openai_error({"error": {"message": "m", "type": "t"}})
    assert not is_openai_error({"detail": "Not Found"})
    oversize = malformed_body("oversize", "kv-demo", 1000)
    assert len(oversize) == 1001 and json.loads(oversize)["model"] == "kv-demo"
    with pytest.raises(ValueError):
        json.loads(malformed_body("bad_json", "kv-demo", 1000))
    assert "messages" not in json.loads(malformed_body("no_messages", "kv-demo", 1000))
