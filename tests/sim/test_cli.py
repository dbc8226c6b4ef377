"""``burstsched sim``: flags map onto SimConfig; a real process serves and stops on SIGINT."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time

import httpx
import pytest

from burstsched.sim import SimConfig
from burstsched.sim.cli import add_arguments, config_from_args, run
from burstsched.testing.ports import free_port


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_match_simconfig() -> None:
    config = config_from_args(parse("--port", "9000"))
    assert config.port == 9000
    assert config.name == "sim-9000"
    assert config == SimConfig(name="sim-9000", port=9000)


def test_flags_and_vllm_style_kv_events_config() -> None:
    args = parse(
        "--served-model-name", "m",
        "--block-size", "128",
        "--num-gpu-blocks-override", "80",
        "--max-num-seqs", "8",
        "--max-num-batched-tokens", "2048",
        "--time-scale", "0.1",
        "--max-waiting-requests", "5",
        "--kv-events-encoding", "array",
        "--kv-events-config", '{"enable_kv_cache_events": true, "endpoint": "tcp://*:5999", "topic": "t"}',
        "--seed", "4",
        "--no-enable-prefix-caching",
    )  # fmt: skip
    config = config_from_args(args)
    assert (config.served_model_name, config.block_size, config.num_gpu_blocks) == ("m", 128, 80)
    assert (config.max_num_seqs, config.max_num_batched_tokens, config.time_scale) == (8, 2048, 0.1)
    assert (config.kv_events_endpoint, config.kv_events_topic, config.kv_events_encoding) == (
        "tcp://*:5999",
        "t",
        "array",
    )
    assert config.max_waiting_requests == 5 and config.seed == 4 and not config.enable_prefix_caching


def test_prompt_tokens_details_flag_defaults_on() -> None:
    assert config_from_args(parse()).enable_prompt_tokens_details is True
    assert config_from_args(parse("--enable-prompt-tokens-details")).enable_prompt_tokens_details is True
    assert config_from_args(parse("--no-enable-prompt-tokens-details")).enable_prompt_tokens_details is False


def test_invalid_settings_exit_with_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(parse("--block-size", "0")) == 2
    assert "block_size" in capsys.readouterr().err


def test_the_command_serves_and_stops_on_sigint() -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "burstsched", "sim", "--port", str(port), "--time-scale", "0.01"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        with httpx.Client() as http:
            while True:
                try:
                    if http.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline, "sim did not come up"
                time.sleep(0.05)
            body = {"model": "kv-demo", "prompt": "hello", "max_tokens": 2}
            assert http.post(f"http://127.0.0.1:{port}/v1/completions", json=body).status_code == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
        if proc.stdout:
            proc.stdout.close()
