from __future__ import annotations

from pathlib import Path

import pytest

from burstsched import cli


def test_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in cli.SUBCOMMANDS:
        assert name in out


def test_unknown_subcommand_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["nope"])
    assert exc.value.code == 2


# --- burstsched check ---------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]
_BAD_LLMD = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: approx-prefix-cache-producer
    parameters: {autoTune: maybe}
  - type: max-score-picker
schedulingProfiles: [{name: default, plugins: [{pluginRef: max-score-picker}]}]
"""


def test_check_accepts_an_llmd_file_and_summarizes_its_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", "--config", str(REPO / "config" / "llmd-prefix-aware.yaml")]) == 0
    out = capsys.readouterr().out
    assert "llmd-prefix-aware.yaml: ok (llm-d EndpointPickerConfig llm-d.ai/v1alpha1, translated)" in out
    assert "producers: approx-prefix-producer {default_capacity_blocks: 31250}" in out
    assert "scorers:   prefix-cache-scorer x3, queue-scorer x2, kv-utilization-scorer x2" in out
    assert "picker:    max-score-picker" in out
    assert "admission: off" in out
    assert "Kubernetes discovery of the pods labelled app=vllm-llama3 (the pool selector), port 8000" in out


def test_check_takes_several_files_and_every_shipped_config_passes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    paths = sorted((REPO / "config").glob("*.yaml"))
    assert len(paths) >= 2
    args = ["check"] + [arg for path in paths for arg in ("--config", str(path))]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert out.count(": ok (") == len(paths)


def test_check_reports_each_issue_with_its_path_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(_BAD_LLMD)
    good = REPO / "config" / "random.yaml"
    assert cli.main(["check", "--config", str(good), "--config", str(bad)]) == 1
    captured = capsys.readouterr()
    assert "random.yaml: ok (burstsched format)" in captured.out
    assert f"{bad}: invalid" in captured.err
    assert "plugins[0].parameters.autoTune: approx-prefix-cache-producer 'approx-prefix-cache-producer'" in (
        captured.err
    )


def test_check_fails_on_what_only_the_plugin_registry_sees(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "plugins: [{type: max-score-picker, parameters: {tie_break: sometimes}}]\n"
        "profile: {plugins: [], picker: max-score-picker}\n"
    )
    assert cli.main(["check", "--config", str(bad)]) == 1
    assert "plugins[0].parameters.tie_break" in capsys.readouterr().err


def test_check_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["check"])
    assert exc.value.code == 2
