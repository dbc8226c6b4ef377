from __future__ import annotations

from pathlib import Path

import pytest

from burstsched.config import ConfigError, EndpointConfig, RouterConfig, load_config, parse_config_text
from burstsched.config.loader import parse_endpoint_arg
from burstsched.framework import PluginContext, PluginRegistry
from burstsched.scheduling import build_scheduler

REPO = Path(__file__).resolve().parents[2]


def _issues(excinfo: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    return [str(issue) for issue in excinfo.value.issues]


def _build(text: str) -> None:
    build_scheduler(parse_config_text(text), PluginRegistry.discover(), PluginContext())


def test_unknown_top_level_field_names_its_path() -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_config_text("endpoint: []\n")
    assert _issues(excinfo) == ["endpoint: unknown field"]


def test_nested_type_error_names_its_path() -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_config_text("pool:\n  scrape_interval_ms: fast\n")
    assert [i.path for i in excinfo.value.issues] == ["pool.scrape_interval_ms"]


def test_bad_endpoint_url_names_its_index() -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_config_text("endpoints:\n  - url: http://127.0.0.1:1\n  - url: ftp://x\n")
    assert [i.path for i in excinfo.value.issues] == ["endpoints[1].url"]
    assert "http" in excinfo.value.issues[0].message


def test_strict_types_refuse_coercion() -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_config_text("dispatch:\n  max_attempts: '2'\n")
    assert [i.path for i in excinfo.value.issues] == ["dispatch.max_attempts"]


def test_plugin_parameter_error_names_plugin_index_and_field() -> None:
    text = """
plugins:
  - type: approx-prefix-producer
  - type: health-filter
  - type: max-score-picker
    parameters:
      tie_break: sometimes
      tie_tolerence: 0.1
profile:
  plugins:
    - plugin_ref: approx-prefix-producer
    - plugin_ref: health-filter
  picker: max-score-picker
"""
    with pytest.raises(ConfigError) as excinfo:
        _build(text)
    paths = sorted(i.path for i in excinfo.value.issues)
    assert paths == ["plugins[2].parameters.tie_break", "plugins[2].parameters.tie_tolerence"]
    assert "plugins[2].parameters.tie_tolerence: unknown field" in _issues(excinfo)


def test_unknown_plugin_type_names_its_path() -> None:
    with pytest.raises(ConfigError) as excinfo:
        _build(
            "plugins:\n  - type: random-picker\n  - type: no-such-plugin\n"
            "profile:\n  plugins: []\n  picker: random-picker\n"
        )
    assert [i.path for i in excinfo.value.issues] == ["plugins[1].type"]
    assert "no-such-plugin" in excinfo.value.issues[0].message


def test_profile_references_are_checked() -> None:
    text = """
plugins:
  - type: health-filter
  - type: queue-scorer
  - type: random-picker
profile:
  plugins:
    - plugin_ref: health-filter
      weight: 2
    - plugin_ref: queue-scorer
    - plugin_ref: missing
    - plugin_ref: random-picker
  picker: health-filter
"""
    with pytest.raises(ConfigError) as excinfo:
        _build(text)
    paths = [i.path for i in excinfo.value.issues]
    assert paths == [
        "profile.plugins[0].weight",
        "profile.plugins[2].plugin_ref",
        "profile.plugins[3].plugin_ref",
        "profile.picker",
    ]
    assert "a picker goes in profile.picker" in excinfo.value.issues[2].message


def test_prefix_scorer_without_producer_is_refused() -> None:
    text = """
plugins:
  - type: prefix-cache-scorer
  - type: max-score-picker
profile:
  plugins:
    - plugin_ref: prefix-cache-scorer
      weight: 3
  picker: max-score-picker
"""
    with pytest.raises(ConfigError) as excinfo:
        _build(text)
    assert [i.path for i in excinfo.value.issues] == ["profile.plugins[0].plugin_ref"]
    assert "PrefixMatch" in excinfo.value.issues[0].message


def test_duplicate_names_are_refused() -> None:
    text = "endpoints:\n  - {url: 'http://127.0.0.1:1', name: a}\n  - {url: 'http://127.0.0.1:2', name: a}\n"
    with pytest.raises(ConfigError) as excinfo:
        parse_config_text(text)
    assert _issues(excinfo) == ["endpoints[1].name: duplicate endpoint name 'a'"]
    with pytest.raises(ConfigError) as excinfo:
        parse_config_text("plugins:\n  - type: queue-scorer\n  - type: queue-scorer\n")
    assert [i.path for i in excinfo.value.issues] == ["plugins[1].name"]


def test_yaml_syntax_and_shape_errors() -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_config_text("endpoints: [\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        parse_config_text("- 1\n")
    assert parse_config_text("") == RouterConfig()


def test_error_message_lists_every_issue() -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_config_text("pool: {scrape_interval_ms: -1}\nlimits: {max_body_bytes: 1}\n")
    text = str(excinfo.value)
    assert "pool.scrape_interval_ms:" in text and "limits.max_body_bytes:" in text


@pytest.mark.parametrize(
    "name", ["default.yaml", "prefix-aware.yaml", "random.yaml", "burst.yaml", "precise.yaml"]
)
def test_shipped_configs_load_and_build(name: str) -> None:
    config = load_config(REPO / "config" / name)
    assert config.endpoints == []
    scheduler = build_scheduler(config, PluginRegistry.discover(), PluginContext())
    assert scheduler.profile.picker is not None


def test_default_yaml_is_the_model_default() -> None:
    assert load_config(REPO / "config" / "default.yaml") == RouterConfig()


def test_command_line_endpoints_replace_the_configured_ones(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("endpoints:\n  - url: http://127.0.0.1:9\n")
    override = [parse_endpoint_arg("a=http://127.0.0.1:8001"), parse_endpoint_arg("http://127.0.0.1:8002/")]
    config = load_config(path, endpoints=override)
    assert [(e.endpoint_name, e.url) for e in config.endpoints] == [
        ("a", "http://127.0.0.1:8001"),
        ("127.0.0.1:8002", "http://127.0.0.1:8002"),
    ]
    assert load_config(path).endpoints == [EndpointConfig(url="http://127.0.0.1:9")]


def test_bad_endpoint_argument() -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_endpoint_arg("a=localhost:8000")
    assert excinfo.value.issues[0].path == "--endpoint.url"


def test_a_moved_admission_key_says_where_it_went() -> None:
    with pytest.raises(ConfigError) as excinfo:
        _build("admission:\n  bypass_max_waiting: 8\n")
    assert any("saturation.max_waiting" in issue for issue in _issues(excinfo))
