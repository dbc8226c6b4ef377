"""A third-party plugin comes in through the ``burstsched.plugins`` entry-point group, like the built-ins."""

from __future__ import annotations

import random
import textwrap
from pathlib import Path

import pytest

from burstsched.config import RouterConfig, parse_config_text
from burstsched.framework import EndpointSnapshot, PluginContext, PluginRegistry, PluginTypeError
from burstsched.scheduling import build_scheduler

from .helpers import sched_request

PLUGIN_SOURCE = '''
from burstsched.framework import PluginParameters


class FavouriteParameters(PluginParameters):
    favourite: str


class FavouriteScorer:
    """Scores one named endpoint 1, the others 0."""

    Parameters = FavouriteParameters

    def __init__(self, name, parameters, context):
        self.name = name
        self.favourite = parameters.favourite

    def score(self, request, endpoints, state):
        return {e.name: 1.0 if e.name == self.favourite else 0.0 for e in endpoints}
'''


def _install_fake_distribution(root: Path) -> None:
    (root / "thirdparty_favourite.py").write_text(textwrap.dedent(PLUGIN_SOURCE))
    dist = root / "thirdparty_favourite-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-favourite\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[burstsched.plugins]\nfavourite-scorer = thirdparty_favourite:FavouriteScorer\n"
    )


def test_builtin_plugins_are_found_through_entry_points() -> None:
    registry = PluginRegistry.discover()
    assert {"approx-prefix-producer", "prefix-cache-scorer", "queue-scorer", "kv-utilization-scorer"} <= set(
        registry
    )
    assert {"health-filter", "max-score-picker", "random-picker", "weighted-random-picker"} <= set(registry)


def test_third_party_plugin_is_discovered_and_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install_fake_distribution(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = PluginRegistry.discover()
    assert "favourite-scorer" in registry
    config = parse_config_text(
        """
plugins:
  - type: favourite-scorer
    name: fav
    parameters: {favourite: b}
  - type: max-score-picker
profile:
  plugins:
    - plugin_ref: fav
      weight: 5
  picker: max-score-picker
"""
    )
    scheduler = build_scheduler(config, registry, PluginContext(rng=random.Random(0)))
    decision = scheduler.schedule(sched_request(), [EndpointSnapshot("a", "u"), EndpointSnapshot("b", "u")])
    assert decision.endpoint.name == "b"
    assert decision.chosen.scores == {"fav": 1.0} and decision.chosen.total == 5.0
    bad = config.model_copy(
        update={"plugins": [config.plugins[0].model_copy(update={"parameters": {}}), config.plugins[1]]}
    )
    with pytest.raises(Exception, match=r"plugins\[0\]\.parameters\.favourite"):
        build_scheduler(bad, registry, PluginContext())
    assert RouterConfig().plugins  # the default config needs no third-party plugin


def test_registry_refuses_non_plugins() -> None:
    registry = PluginRegistry()
    with pytest.raises(PluginTypeError):
        registry.register("nothing", object())
    registry.register("ok", PluginRegistry.discover().get("queue-scorer"))
    with pytest.raises(PluginTypeError):
        registry.register("ok", PluginRegistry.discover().get("queue-scorer"))
