"""llm-d's own configs (``llmd_corpus/``): each loads, or is refused with exactly its entry's lines."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from burstsched.config import ConfigError, parse_config_document
from burstsched.framework import PluginContext, PluginRegistry
from burstsched.scheduling import build_scheduler
from tests.config import llmd_corpus_refresh

CORPUS = Path(__file__).resolve().parent / "llmd_corpus"
ENTRIES: list[dict[str, Any]] = yaml.safe_load((CORPUS / "corpus.yaml").read_text(encoding="utf-8"))[
    "entries"
]
REGISTRY = PluginRegistry.discover()


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["file"] for e in ENTRIES])
def test_each_config_loads_or_is_refused_as_recorded(entry: dict[str, Any]) -> None:
    text = (CORPUS / entry["file"]).read_text(encoding="utf-8")
    expect = entry["expect"]
    if expect == "loads":
        loaded = parse_config_document(text, source=entry["file"])
        build_scheduler(loaded.config, REGISTRY, PluginContext(rng=random.Random(0)))
        return
    with pytest.raises(ConfigError) as excinfo:
        parse_config_document(text, source=entry["file"])
    assert [str(issue) for issue in excinfo.value.issues] == expect["refused"]


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["file"] for e in ENTRIES])
def test_each_file_names_its_source_and_commit(entry: dict[str, Any]) -> None:
    head = (CORPUS / entry["file"]).read_text(encoding="utf-8").splitlines()[:3]
    assert head == llmd_corpus_refresh.header(entry, entry["commit"]).splitlines()


def test_every_file_is_in_the_index() -> None:
    files = {p.name for p in CORPUS.glob("*.yaml")} - {"corpus.yaml"}
    assert files == {e["file"] for e in ENTRIES}


def test_a_refused_plugin_type_gives_one_line_and_no_knock_on_reference_lines() -> None:
    refused = [e for e in ENTRIES if e["expect"] != "loads"]
    assert refused
    for entry in refused:
        lines = entry["expect"]["refused"]
        assert len(lines) == len(set(lines))
        assert not any("unknown plugin" in line for line in lines), entry["file"]


def test_the_chart_template_renders_with_default_values() -> None:
    template = """\
  one.yaml: |
    {{- $type := .Values.router.modelServers.type | default "vllm" }}
    plugins:
    - type: queue-scorer
    - type: metrics-data-source
      parameters:
        scheme: {{ .Values.router.epp.metricsDataSource.scheme | default "http" | quote }}
        insecureSkipVerify: {{ .Values.router.epp.metricsDataSource.insecureSkipVerify | default true }}
    {{- if .Values.router.latencyPredictor.enabled }}
    - type: latency-scorer
    {{- else if eq (lower $modelServerType) "triton" }}
    - type: triton-only
    {{- else }}
    - type: prefix-cache-scorer
    {{- end }}
  two.yaml: |
    other: 1
"""
    rendered = llmd_corpus_refresh.render_chart_default(template, "one.yaml")
    assert yaml.safe_load(rendered) == {
        "plugins": [
            {"type": "queue-scorer"},
            {"type": "metrics-data-source", "parameters": {"scheme": "http", "insecureSkipVerify": True}},
            {"type": "prefix-cache-scorer"},
        ]
    }


def test_an_unknown_template_condition_is_an_error_not_a_guess() -> None:
    template = "  one.yaml: |\n    {{- if .Values.somethingNew }}\n    a: 1\n    {{- end }}\n"
    with pytest.raises(llmd_corpus_refresh.RefreshError, match="somethingNew"):
        llmd_corpus_refresh.render_chart_default(template, "one.yaml")
