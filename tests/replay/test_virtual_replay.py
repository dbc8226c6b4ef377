"""A trace replayed in one process on virtual time: the real router app over in-process replicas."""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import pytest
import yaml

from burstsched.config import RouterConfig
from burstsched.replay.cli import add_arguments, run, simulated_kv_cache
from burstsched.replay.rebuild import rebuild_prompts
from burstsched.replay.runner import ReplayOptions
from burstsched.replay.trace import ReplicaGeometry, longest_gap, read_replicas, read_trace
from burstsched.replay.virtual_run import RecordedPlacement, replay_virtual_all, run_config

from .test_replay_run import _write_trace

REPO = Path(__file__).resolve().parents[2]


def _replay_parser() -> argparse.ArgumentParser:
    """``burstsched replay``'s own arguments."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser


def _config(name: str) -> RouterConfig:
    return RouterConfig.model_validate(yaml.safe_load((REPO / "config" / name).read_text()))


def test_a_replay_on_virtual_time_is_exact_and_repeatable(tmp_path: Path) -> None:
    """Requests 5 s apart: each arrives on an idle pool, so every warm TTFT is the same virtual duration up
    to its own unique tail's few tokens, and a second run gives the same figures to the last digit."""
    trace = tmp_path / "trace.jsonl"
    _write_trace(trace, count=8, gap_s=5.0)
    requests = read_trace([trace])
    prompts = rebuild_prompts(requests)
    options = ReplayOptions(replicas=2, virtual_time=True)
    first = run_config("default", RouterConfig(), requests, prompts, options)
    again = run_config("default", RouterConfig(), requests, prompts, options)
    assert first.ok == first.requests == 8
    assert first.ttfts_ms == again.ttfts_ms and first.hit_rate == again.hit_rate
    cold, *warm = sorted(first.ttfts_ms, reverse=True)
    assert max(warm) - min(warm) < 2.0  # one shared document, an idle pool: the same work, the same time
    assert cold > 2 * warm[0]
    assert first.hit_rate > 0.8  # every request after the first finds the document on its replica
    assert sorted(first.requests_per_replica.values()) == [0, 8]


def test_configs_replay_in_worker_processes_in_their_order(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    _write_trace(trace, count=10)
    requests = read_trace([trace])
    options = ReplayOptions(replicas=2, virtual_time=True)
    configs = [("prefix-aware", RouterConfig()), ("random", _config("random.yaml"))]
    results, skipped, _ = replay_virtual_all(configs, requests, options, jobs=2, progress=False)
    assert not skipped
    assert [r.label for r in results] == ["prefix-aware", "random"]
    assert all(r.ok == 10 for r in results)
    assert results[0].hit_rate > results[1].hit_rate  # random splits the document over both replicas
    alone, _, _ = replay_virtual_all(configs[:1], requests, options, jobs=1, progress=False)
    assert alone[0].ttfts_ms == results[0].ttfts_ms  # a worker process replays exactly as this one does


def test_the_precise_index_is_fed_the_replicas_events_in_process(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    _write_trace(trace, count=6, gap_s=1.0)
    requests = read_trace([trace])
    options = ReplayOptions(replicas=2, virtual_time=True)
    result = run_config("precise", _config("precise.yaml"), requests, rebuild_prompts(requests), options)
    assert result.ok == 6
    assert sorted(result.requests_per_replica.values()) == [0, 6]
    assert result.hit_rate > 0.7


def test_the_cli_sweeps_on_virtual_time_and_names_the_best(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.jsonl"
    _write_trace(trace, count=6)
    parser = _replay_parser()
    out = tmp_path / "out"
    args = parser.parse_args(
        [str(trace), "--sweep", "admission.window_ms=2,20", "--jobs", "1", "--no-calibrate"]
        + ["--out", str(out)]
    )
    assert run(args) == 0
    printed = capsys.readouterr().out
    assert "window_ms=2" in printed and "window_ms=20" in printed and "best under ttft_p95" in printed
    report = json.loads((out / "replay.json").read_text())
    assert report["options"]["virtual_time"] is True
    assert len(report["results"]) == 2
    assert "virtual time" in (out / "replay.md").read_text()


def test_a_missing_or_broken_trace_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = _replay_parser()
    assert run(parser.parse_args([str(tmp_path / "absent.jsonl")])) == 2
    assert "cannot read the trace" in capsys.readouterr().err
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"v": 1}\n')
    assert run(parser.parse_args([str(broken)])) == 2
    assert "not a trace" in capsys.readouterr().err


def test_recorded_placement_sends_each_request_to_its_recorded_endpoint_s_replica(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    _write_trace(trace, count=6)
    lines = [json.loads(text) for text in trace.read_text().splitlines()]
    for index, line in enumerate(lines):
        line["endpoint"] = "vllm-b" if index in (1, 2) else "vllm-a"
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    requests = read_trace([trace])
    options = ReplayOptions(replicas=2, virtual_time=True)
    placement = RecordedPlacement()
    assert placement.replicas(requests) == {"vllm-a": "sim-0", "vllm-b": "sim-1", None: "sim-0"}
    result = run_config(placement.label, placement, requests, rebuild_prompts(requests), options)
    assert result.ok == 6
    assert result.requests_per_replica == {"sim-0": 4, "sim-1": 2}
    assert len(result.ttft_by_request_ms) == 6  # in the trace's order, for the per-request comparison
    assert all(ttft is not None and ttft > 0 for ttft in result.ttft_by_request_ms)
    assert sorted(t for t in result.ttft_by_request_ms if t is not None) == result.ttfts_ms

    parser = _replay_parser()
    too_few = parser.parse_args([str(trace), "--recorded-placement", "--replicas", "1"])
    assert run(too_few) == 2


def test_recorded_placement_sends_a_held_request_when_the_router_did_and_times_it_from_arrival(
    tmp_path: Path,
) -> None:
    """A request the live router held (admission's ``waited_ms`` plus the flow queue's ``queued_ms``) leaves
    that much later in a recorded-placement replay, and its TTFT still counts from its arrival: on virtual
    time, exactly the hold more than the same trace without it."""
    trace = tmp_path / "trace.jsonl"
    _write_trace(trace, count=4)
    lines = [json.loads(text) for text in trace.read_text().splitlines()]
    for line in lines:
        line["waited_ms"] = 0.0
    plain = read_trace([trace])
    lines[2]["waited_ms"], lines[2]["queued_ms"] = 10.0, 1490.0
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    held = read_trace([trace])
    assert [r.held_ms for r in held] == [0.0, 0.0, 1500.0, 0.0]
    options = ReplayOptions(replicas=2, virtual_time=True)
    placement = RecordedPlacement()
    before = run_config(placement.label, placement, plain, rebuild_prompts(plain), options)
    after = run_config(placement.label, placement, held, rebuild_prompts(held), options)
    assert before.ok == after.ok == 4
    late, early = after.ttft_by_request_ms[2], before.ttft_by_request_ms[2]
    assert late is not None and early is not None and late >= early + 1500.0 - 1e-6


def test_the_replicas_kv_caches_come_from_the_trace_unless_the_flags_say_otherwise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.jsonl"
    _write_trace(trace, count=4)
    replicas = [
        {"v": 1, "kind": "replica", "t": 1.7e9, "replica": name, "block_size": 32, "num_gpu_blocks": blocks}
        for name, blocks in (("e0", 90), ("e1", 60))
    ]
    trace.write_text("".join(json.dumps(line) + "\n" for line in replicas) + trace.read_text())
    assert len(read_trace([trace])) == 4  # the replica lines are no requests
    parser = _replay_parser()

    out = tmp_path / "out"
    args = parser.parse_args([str(trace), "--jobs", "1", "--no-calibrate", "--out", str(out)])
    assert run(args) == 0
    recorded = json.loads((out / "replay.json").read_text())["options"]
    assert (recorded["kv_blocks"], recorded["block_size"]) == (60, 32)  # the smaller of the two caches
    assert "e0 90×32, e1 60×32; each simulated replica gets the smallest, 60×32" in capsys.readouterr().out
    found = read_replicas([trace])

    def cache(*flags: str, found: dict[str, ReplicaGeometry] = found) -> tuple[int | None, int]:
        return simulated_kv_cache(parser.parse_args([str(trace), *flags]), found)

    assert cache("--block-size", "16") == (120, 16)  # as many tokens as recorded
    assert cache("--block-size", "16", "--kv-blocks", "500") == (500, 16)
    assert cache(found={}) == (None, 16)  # an older trace: the simulator's defaults


def test_a_gzipped_trace_reads_as_the_plain_one(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    _write_trace(trace, count=5)
    replica = {"v": 1, "kind": "replica", "t": 1.7e9, "replica": "e0", "block_size": 32, "num_gpu_blocks": 9}
    trace.write_text(json.dumps(replica) + "\n" + trace.read_text())
    packed = tmp_path / "trace.jsonl.gz"
    packed.write_bytes(gzip.compress(trace.read_bytes()))
    assert read_trace([packed]) == read_trace([trace]) and len(read_trace([packed])) == 5
    assert read_replicas([packed]) == read_replicas([trace]) == {"e0": ReplicaGeometry(32, 9)}


def test_metrics_render_ms_prices_each_scrape_and_its_absence_is_noted_when_intervals_differ(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.jsonl"
    _write_trace(trace, count=4)
    configs = []
    for interval in (50, 1000):
        config = yaml.safe_load((REPO / "config" / "default.yaml").read_text())
        config.setdefault("pool", {})["scrape_interval_ms"] = interval
        path = tmp_path / f"scrape-{interval}.yaml"
        path.write_text(yaml.safe_dump(config))
        configs += ["--config", str(path)]
    parser = _replay_parser()
    common = [str(trace), *configs, "--jobs", "1", "--no-calibrate"]
    for render, noted in (("0", True), ("12", False)):
        out = tmp_path / f"out-{render}"
        assert run(parser.parse_args([*common, "--metrics-render-ms", render, "--out", str(out)])) == 0
        assert ("each scrape costs the simulated replicas nothing" in capsys.readouterr().out) is noted
        cost = json.loads((out / "replay.json").read_text())["options"]["cost"]
        assert (cost is None) if noted else cost["metrics_render_s"] == pytest.approx(0.012)
    assert run(parser.parse_args([*common, "--metrics-render-ms", "-1"])) == 2


def test_two_recordings_in_one_file_are_noted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The recorder appends: a file can hold an earlier run's requests hours before this run's."""
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    _write_trace(first, count=3)
    _write_trace(second, count=3)
    lines = [json.loads(line) for line in second.read_text().splitlines()]
    later = "".join(json.dumps({**line, "t": line["t"] + 7200.0}) + "\n" for line in lines)
    both = tmp_path / "trace.jsonl"
    both.write_text(first.read_text() + later)
    requests = read_trace([both])
    gap, after = longest_gap(requests)
    assert gap == pytest.approx(7200.0 - 0.4) and after == 3
    parser = _replay_parser()
    for trace, noted in ((first, False), (both, True)):
        out = tmp_path / f"out-{trace.stem}"
        args = parser.parse_args([str(trace), "--jobs", "1", "--no-calibrate", "--out", str(out)])
        assert run(args) == 0
        assert ("the trace pauses 2.0 h before request 4 of 6" in capsys.readouterr().out) is noted


def test_record_dir_keeps_each_replayed_router_s_requests_and_decisions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.jsonl"
    _write_trace(trace, count=6)
    parser = _replay_parser()
    record_dir = tmp_path / "replayed"
    args = parser.parse_args(
        [str(trace), "--config", str(REPO / "config" / "default.yaml"), "--jobs", "1", "--no-calibrate"]
        + ["--record-dir", str(record_dir), "--out", str(tmp_path / "out")]
    )
    assert run(args) == 0
    lines = [json.loads(text) for text in (record_dir / "default.jsonl").read_text().splitlines()]
    requests = [line for line in lines if "kind" not in line]
    assert sorted(line["id"] for line in requests) == [f"replay-{i}" for i in range(6)]
    for line in requests:
        assert line["decision"][0]["endpoint"] == line["endpoint"]  # the pick comes first
        assert {c["endpoint"] for c in line["decision"]} == {"sim-0", "sim-1"}
    assert {line["replica"] for line in lines if line.get("kind") == "replica"} <= {"sim-0", "sim-1"}
    realtime = parser.parse_args([str(trace), "--realtime", "--record-dir", str(record_dir)])
    assert run(realtime) == 2
    assert "virtual time only" in capsys.readouterr().err
