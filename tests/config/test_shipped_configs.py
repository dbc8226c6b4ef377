"""The shipped configs (``config/*.yaml``) each say only what makes them what they are, and say it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from burstsched.config import RouterConfig, read_config
from burstsched.framework import PluginContext, PluginRegistry
from burstsched.scheduling import build_scheduler
from burstsched.server.config_show import origins

CONFIG = Path(__file__).resolve().parents[2] / "config"
REGISTRY = PluginRegistry.discover()
FILES = sorted(p.name for p in CONFIG.glob("*.yaml"))


def _weights(config: RouterConfig) -> dict[str, float | None]:
    return {ref.plugin_ref: ref.weight for ref in config.profile.plugins}


def _params(config: RouterConfig, plugin_type: str) -> dict[str, object]:
    return next(p.parameters for p in config.plugins if p.type == plugin_type)


def _default(c: RouterConfig) -> None:
    assert c.admission.enabled and c.admission.window_ms == 10
    assert _weights(c) == _weights(RouterConfig())  # the recommended profile is burstsched's default one


def _burst(c: RouterConfig) -> None:
    assert c.admission.enabled and c.admission.late_members_ms == 2000


def _random(c: RouterConfig) -> None:
    assert c.profile.picker == "random-picker" and not c.admission.enabled


def _prefix_aware(c: RouterConfig) -> None:
    assert _weights(c) == {
        "approx-prefix-producer": None,
        "health-filter": None,
        "prefix-cache-scorer": 3,
        "queue-scorer": 2,
        "kv-utilization-scorer": 2,
    }
    assert not c.admission.enabled and c.pool.scrape_interval_ms == 50


def _precise(c: RouterConfig) -> None:
    assert "precise-prefix-producer" in _weights(c)
    assert c.kv_events.endpoint_template == "tcp://{host}:5557"
    assert c.tokenizer.source == "local"


def _cost(c: RouterConfig) -> None:
    assert _weights(c).get("cost-scorer") == 1 and _params(c, "cost-scorer")["stay_margin"] == 1.0


def _rendezvous(c: RouterConfig) -> None:
    assert "rendezvous-scorer" in _weights(c)


def _llmd(c: RouterConfig) -> None:
    assert c.pool.selector is not None and _weights(c)["prefix-cache-scorer"] == 3


CHOICES = {
    "burst.yaml": [_burst],
    "cost.yaml": [_cost, lambda c: c.prewarm.enabled],
    "default.yaml": [_default],
    "llmd-prefix-aware.yaml": [_llmd],
    "precise-cost.yaml": [_precise, _cost],
    "precise-rendezvous.yaml": [_precise, _rendezvous],
    "precise.yaml": [_precise],
    "prefix-aware.yaml": [_prefix_aware],
    "random.yaml": [_random],
    "rendezvous-cost.yaml": [_cost, _rendezvous],
    "rendezvous.yaml": [_rendezvous],
}


def test_every_shipped_config_has_its_choices_listed() -> None:
    assert set(FILES) == set(CHOICES)


@pytest.mark.parametrize("name", FILES)
def test_each_config_loads_builds_and_makes_its_choices(name: str) -> None:
    loaded = read_config(CONFIG / name)
    build_scheduler(loaded.config, REGISTRY, PluginContext(rng=random.Random(0)))
    for check in CHOICES[name]:
        assert check(loaded.config) is not False


@pytest.mark.parametrize("name", [f for f in FILES if f != "burst.yaml"])
def test_each_config_is_short(name: str) -> None:
    """A user copying one sees the lines that make it what it is: no section repeats burstsched's defaults."""
    text = (CONFIG / name).read_text(encoding="utf-8")
    settings = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(settings) <= 45, f"{name}: {len(settings)} lines of settings"
    marks = origins(read_config(CONFIG / name), REGISTRY)
    for section in ("dispatch", "limits", "auth", "shutdown", "tracing", "metrics", "recording", "discovery"):
        written = [
            path for path, mark in marks.items() if path.startswith(f"{section}.") and mark != "default"
        ]
        assert not written, f"{name} repeats defaults of {section}: {written}"


def test_burst_yaml_writes_out_every_admission_knob() -> None:
    marks = origins(read_config(CONFIG / "burst.yaml"), REGISTRY)
    admission = {path: mark for path, mark in marks.items() if path.startswith("admission.")}
    assert admission and set(admission.values()) == {"file"}, admission
