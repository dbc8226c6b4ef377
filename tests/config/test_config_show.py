"""``burstsched config show``: the effective config with every default filled in, each value's origin."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from burstsched import cli
from burstsched.config import parse_config_document, read_config
from burstsched.framework import PluginRegistry
from burstsched.server.config_show import origins

REPO = Path(__file__).resolve().parents[2]
REGISTRY = PluginRegistry.discover()


def test_precise_yaml_marks_what_the_file_says_and_fills_the_rest(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["config", "show", "--config", str(REPO / "config" / "precise.yaml")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# ") and "burstsched format" in out.splitlines()[0]
    shown = yaml.safe_load(out)  # the output is YAML (origins are comments)
    loaded = read_config(REPO / "config" / "precise.yaml").config
    assert shown["admission"] == loaded.admission.model_dump(mode="json")
    assert shown["kv_events"] == loaded.kv_events.model_dump(mode="json")
    assert shown["plugins"][0]["type"] == "precise-prefix-producer"
    marks = origins(read_config(REPO / "config" / "precise.yaml"), REGISTRY)
    assert marks["plugins[0].type"] == "file"
    assert marks["plugins[0].name"] == "default"  # the type names it
    assert marks["prewarm.enabled"] == "default"  # a section the file leaves out is default all through
    assert marks["tracing.service_name"] == "default"


def test_a_value_left_out_of_a_written_section_is_default_and_plugin_defaults_are_filled(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "admission: {enabled: true, window_ms: 5}\n"
        "plugins:\n"
        "  - {type: approx-prefix-producer}\n"
        "  - {type: queue-scorer}\n"
        "  - {type: max-score-picker, parameters: {tie_break: random}}\n"
        "profile: {plugins: [{plugin_ref: approx-prefix-producer}, {plugin_ref: queue-scorer}]}\n"
    )
    marks = origins(read_config(path), REGISTRY)
    assert marks["admission.window_ms"] == "file"
    assert marks["admission.max_batch"] == "default"
    assert marks["plugins[2].parameters.tie_break"] == "file"
    assert marks["plugins[2].parameters.tie_tolerance"] == "default"  # the picker's own default, filled in
    assert marks["profile.plugins[1].plugin_ref"] == "file"
    assert marks["profile.picker"] == "default"
    shown = yaml.safe_load(_show(path))
    assert shown["plugins"][2]["parameters"] == {"tie_break": "random", "tie_tolerance": 1e-09}


def test_an_llm_d_file_marks_what_its_translation_set() -> None:
    path = REPO / "tests" / "config" / "llmd_corpus" / "router-deploy-sim-epp-kvcache-config.yaml"
    loaded = parse_config_document(path.read_text(encoding="utf-8"), source=str(path))
    marks = origins(loaded, REGISTRY)
    assert marks["kv_events.bind"] == "llm-d"  # zmqEndpoint: central mode
    assert marks["kv_events.endpoint_template"] == "default"
    assert marks["pool.scrape_interval_ms"] == "llm-d"  # llm-d's 50 ms
    assert marks["admission.enabled"] == "llm-d"
    assert marks["tracing.enabled"] == "default"
    assert "llm-d EndpointPickerConfig" in _show(path).splitlines()[0]


def test_an_invalid_file_exits_1_with_its_issues(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("admission: {window_ms: -1}\n")
    assert cli.main(["config", "show", "--config", str(bad)]) == 1
    assert "admission.window_ms" in capsys.readouterr().err


def _show(path: Path) -> str:
    import io

    from burstsched.server.config_show import show

    out = io.StringIO()
    show(path, read_config(path), REGISTRY, out=out)
    return out.getvalue()
