"""llm-d's label-selector-filter (and its deprecated name by-label-selector) and lora-affinity-scorer: what
their llm-d files become, refusals at llm-d's own paths, and ``--explain``."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import pytest

from burstsched.config import ConfigError, parse_config_document
from burstsched.server.check import check_files


def _llmd(body: str) -> str:
    return "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n" + textwrap.dedent(body)


CONFIG = _llmd("""
    plugins:
    - type: label-selector-filter
      name: h100
      parameters:
        matchLabels: {hardware-type: H100}
        matchExpressions:
        - {key: tier, operator: NotIn, values: [spot]}
        - {key: llm-d.ai/role, operator: Exists}
    - type: by-label-selector
      name: legacy
    - type: lora-affinity-scorer
    - type: queue-scorer
    - type: max-score-picker
    schedulingProfiles:
    - name: default
      plugins:
      - pluginRef: h100
      - pluginRef: lora-affinity-scorer
        weight: 2
      - pluginRef: queue-scorer
      - pluginRef: max-score-picker
    """)


def test_both_plugins_become_burstsched_s_with_their_parameters() -> None:
    config = parse_config_document(CONFIG).config
    specs = {p.instance_name: p for p in config.plugins}
    assert specs["h100"].type == "label-selector-filter"
    assert specs["h100"].parameters == {
        "match_labels": {"hardware-type": "H100"},
        "match_expressions": [
            {"key": "tier", "operator": "NotIn", "values": ["spot"]},
            {"key": "llm-d.ai/role", "operator": "Exists", "values": []},
        ],
    }
    assert specs["lora-affinity-scorer"].type == "lora-affinity-scorer"
    refs = [(r.plugin_ref, r.weight) for r in config.profile.plugins]
    assert ("h100", None) in refs and ("lora-affinity-scorer", 2.0) in refs
    assert "legacy" not in specs  # declared, in no profile: not used


def test_bad_selectors_and_parameters_are_refused_at_llmd_paths() -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_config_document(
            _llmd("""
            plugins:
            - type: label-selector-filter
              parameters:
                matchLabels: {"bad key": x}
                matchExpressions:
                - {key: tier, operator: In}
                - {key: zone, operator: DoesNotExist, values: [a]}
                - {key: x, operator: Gt, values: ["1"]}
                - {operator: Exists}
            - type: lora-affinity-scorer
              parameters: {maxAdapters: 4}
            - type: max-score-picker
            """)
        )
    lines = sorted(str(i) for i in excinfo.value.issues)
    assert lines == [
        "plugins[0].parameters.matchExpressions[0].values: label-selector-filter 'label-selector-filter': "
        "must list at least one value for In",
        "plugins[0].parameters.matchExpressions[1].values: label-selector-filter 'label-selector-filter': "
        "must be empty for DoesNotExist",
        "plugins[0].parameters.matchExpressions[2].operator: label-selector-filter 'label-selector-filter': "
        "must be one of In, NotIn, Exists, DoesNotExist; got 'Gt'",
        "plugins[0].parameters.matchExpressions[3].key: label-selector-filter 'label-selector-filter': "
        "required: the label key",
        "plugins[0].parameters.matchLabels.bad key: label-selector-filter 'label-selector-filter': label key "
        "'bad key': the name must be 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a "
        "letter or digit",
        "plugins[1].parameters.maxAdapters: lora-affinity-scorer 'lora-affinity-scorer': unknown or "
        "unsupported parameter",
    ]


def test_check_explain_says_what_each_became(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG)
    out = io.StringIO()
    assert check_files([path], out=out, err=io.StringIO(), explain=True) == 0
    text = out.getvalue()
    assert "label-selector-filter 'h100': label-selector-filter 'h100' {match_labels:" in text
    assert "its filters fail open" in text and "EndpointSlices carry no labels" in text
    assert "by-label-selector 'legacy': label-selector-filter 'legacy' {match_labels: {}" in text
    assert "lora-affinity-scorer 'lora-affinity-scorer': lora-affinity-scorer; reads each replica's" in text


def test_the_conformance_suites_testing_filter_loads_from_its_endpoint_picker_config() -> None:
    """The Gateway API Inference Extension conformance suite's picker config names the
    header-based-testing-filter: it becomes burstsched's filter of that name, in the profile."""
    config = parse_config_document(
        _llmd("""
        plugins:
        - type: header-based-testing-filter
        - type: max-score-picker
        schedulingProfiles:
        - name: default
          plugins:
          - pluginRef: header-based-testing-filter
          - pluginRef: max-score-picker
        """)
    ).config
    specs = {p.instance_name: p for p in config.plugins}
    assert specs["header-based-testing-filter"].type == "header-based-testing-filter"
    assert "header-based-testing-filter" in [r.plugin_ref for r in config.profile.plugins]
