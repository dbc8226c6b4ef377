"""``burstsched demo --policies``: names from --config-dir, or any YAML file given by its path."""

from __future__ import annotations

from pathlib import Path

from burstsched.workloads.demo import policy_config, policy_label


def test_a_name_is_a_file_in_the_config_dir_and_a_yaml_path_is_taken_as_given() -> None:
    assert policy_config(Path("config"), "random") == Path("config/random.yaml")
    chart = "tests/config/llmd_corpus/router-chart-default-plugins.yaml"
    assert policy_config(Path("config"), chart) == Path(chart)
    assert policy_label(chart) == "router-chart-default-plugins"
    assert policy_label("prefix-aware") == "prefix-aware"
