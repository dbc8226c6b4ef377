"""Loading the configuration, stages two to four: build plugins → validate references → wire the scheduler.

Every problem is reported as a :class:`ConfigError` naming the field's path, e.g.
``plugins[2].parameters.tie_break: ...`` or ``profile.plugins[1].plugin_ref: unknown plugin 'x'``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from burstsched.config import ConfigError, ConfigIssue, PluginSpec, ProfileConfig, RouterConfig
from burstsched.config.errors import issues_from_validation
from burstsched.framework import (
    DispatchHook,
    Filter,
    Picker,
    Plugin,
    PluginContext,
    PluginFactory,
    PluginRegistry,
    Producer,
    Resettable,
    Saturation,
    SaturationDetector,
    Scorer,
)
from burstsched.scheduling.profile import SchedulerProfile, WeightedScorer
from burstsched.scheduling.scheduler import CycleObserver, PluginObserver, Scheduler

P = TypeVar("P")


@dataclass(frozen=True)
class PreviousPlugins:
    """The plugins a running router built from ``specs`` (by instance name), offered for re-use on reload.

    A plugin whose name, type and validated parameters are unchanged is kept as the same instance, with what
    it learned (e.g. the approximate prefix index); any other is built anew.
    """

    specs: Sequence[PluginSpec]
    plugins: Mapping[str, Plugin]
    reused: list[str] = field(default_factory=list)
    """Filled by :func:`build_plugins`: the names it re-used, in the order of the new specs."""


def build_plugins(
    specs: Sequence[PluginSpec],
    registry: PluginRegistry,
    context: PluginContext,
    *,
    previous: PreviousPlugins | None = None,
) -> dict[str, Plugin]:
    """Instantiate every configured plugin, its parameters validated by its type's model.

    ``previous``: re-use those of its plugins whose type and parameters are unchanged (see
    :class:`PreviousPlugins`)."""
    issues: list[ConfigIssue] = []
    plugins: dict[str, Plugin] = {}
    old_specs = {s.instance_name: s for s in previous.specs} if previous is not None else {}
    for i, spec in enumerate(specs):
        factory = registry.get(spec.type)
        if factory is None:
            known = ", ".join(registry) or "none"
            issues.append(
                ConfigIssue(f"plugins[{i}].type", f"unknown plugin type {spec.type!r} (known: {known})")
            )
            continue
        try:
            parameters = factory.Parameters.model_validate(spec.parameters)
        except ValidationError as exc:
            issues.extend(issues_from_validation(exc, prefix=f"plugins[{i}].parameters"))
            continue
        if spec.instance_name in plugins:
            issues.append(ConfigIssue(f"plugins[{i}].name", f"duplicate plugin name {spec.instance_name!r}"))
            continue
        kept = _unchanged(spec, parameters, old_specs.get(spec.instance_name), factory.Parameters, previous)
        if isinstance(kept, SaturationDetector) and _judges_anew(kept, factory, spec, parameters, context):
            kept = None  # built on the router's old saturation section
        if kept is not None and previous is not None:
            plugins[spec.instance_name] = kept
            previous.reused.append(spec.instance_name)
            continue
        plugin = factory(spec.instance_name, parameters, context)
        if not isinstance(plugin, Plugin) or plugin.name != spec.instance_name:
            issues.append(
                ConfigIssue(f"plugins[{i}].type", f"plugin type {spec.type!r} built no valid plugin")
            )
            continue
        plugins[spec.instance_name] = plugin
    if issues:
        raise ConfigError(issues)
    return plugins


def _unchanged(
    spec: PluginSpec,
    parameters: object,
    old: PluginSpec | None,
    model: type[BaseModel],
    previous: PreviousPlugins | None,
) -> Plugin | None:
    """The previous instance of ``spec``'s plugin when its type and validated parameters are the same."""
    if previous is None or old is None or old.type != spec.type:
        return None
    plugin = previous.plugins.get(spec.instance_name)
    if plugin is None:
        return None
    try:
        old_parameters = model.model_validate(old.parameters)
    except ValidationError:
        return None
    return plugin if old_parameters == parameters else None


def _judges_anew(
    kept: SaturationDetector,
    factory: PluginFactory,
    spec: PluginSpec,
    parameters: object,
    context: PluginContext,
) -> bool:
    """Whether a detector built now (the router's saturation may have changed) judges differently."""
    fresh = factory(spec.instance_name, parameters, context)
    return not isinstance(fresh, SaturationDetector) or fresh.saturation != kept.saturation


def build_profile(
    profile: ProfileConfig, plugins: dict[str, Plugin], saturation: Saturation | None = None
) -> SchedulerProfile:
    """Check the profile's references and kinds; wire the plugins into a :class:`SchedulerProfile`.

    The profile's :attr:`~SchedulerProfile.saturation` is its saturation filter's, else ``saturation`` (the
    config's section); two filters that disagree are refused."""
    issues: list[ConfigIssue] = []
    producers: list[Producer] = []
    filters: list[Filter] = []
    scorers: list[WeightedScorer] = []
    used: list[Plugin] = []
    seen: set[str] = set()
    for i, ref in enumerate(profile.plugins):
        path = f"profile.plugins[{i}]"
        plugin = plugins.get(ref.plugin_ref)
        if plugin is None:
            issues.append(ConfigIssue(f"{path}.plugin_ref", _unknown(ref.plugin_ref, plugins)))
            continue
        if ref.plugin_ref in seen:
            issues.append(ConfigIssue(f"{path}.plugin_ref", f"plugin {ref.plugin_ref!r} is listed twice"))
            continue
        seen.add(ref.plugin_ref)
        is_scorer = isinstance(plugin, Scorer)
        if ref.weight is not None and not is_scorer:
            issues.append(ConfigIssue(f"{path}.weight", f"plugin {ref.plugin_ref!r} is not a scorer"))
        roles = 0
        if isinstance(plugin, Producer):
            producers.append(plugin)
            roles += 1
        if isinstance(plugin, Filter):
            filters.append(plugin)
            roles += 1
        if isinstance(plugin, Scorer):
            scorers.append(WeightedScorer(plugin, 1.0 if ref.weight is None else ref.weight))
            roles += 1
        if roles == 0:
            hint = " (a picker goes in profile.picker)" if isinstance(plugin, Picker) else ""
            issues.append(
                ConfigIssue(
                    f"{path}.plugin_ref", f"plugin {ref.plugin_ref!r} is no producer, filter or scorer{hint}"
                )
            )
        used.append(plugin)

    picker = plugins.get(profile.picker)
    if picker is None:
        issues.append(ConfigIssue("profile.picker", _unknown(profile.picker, plugins)))
    elif not isinstance(picker, Picker):
        issues.append(ConfigIssue("profile.picker", f"plugin {profile.picker!r} is not a picker"))
    else:
        used.append(picker)

    produced = {kind for p in producers for kind in getattr(p, "produces", ())}
    for i, ref in enumerate(profile.plugins):
        plugin = plugins.get(ref.plugin_ref)
        for kind in getattr(plugin, "consumes", ()):
            if kind not in produced:
                issues.append(
                    ConfigIssue(
                        f"profile.plugins[{i}].plugin_ref",
                        f"plugin {ref.plugin_ref!r} needs {kind.__name__}, which no producer in the profile "
                        "makes",
                    )
                )
    detectors = [f.saturation for f in filters if isinstance(f, SaturationDetector)]
    for other in detectors[1:]:
        if other != detectors[0]:
            issues.append(
                ConfigIssue(
                    "profile.plugins",
                    "two saturation filters with different thresholds: saturation has one definition",
                )
            )
    if detectors:
        saturation = detectors[0]
    if issues or not isinstance(picker, Picker):
        raise ConfigError(issues)
    return SchedulerProfile(
        producers=tuple(producers),
        filters=tuple(filters),
        scorers=tuple(scorers),
        picker=picker,
        dispatch_hooks=tuple(_unique(p for p in used if isinstance(p, DispatchHook))),
        resettables=tuple(_unique(p for p in used if isinstance(p, Resettable))),
        saturation=saturation if saturation is not None else Saturation(),
    )


def build_scheduler(
    config: RouterConfig,
    registry: PluginRegistry,
    context: PluginContext,
    *,
    observer: PluginObserver | None = None,
    cycle_observer: CycleObserver | None = None,
    previous: PreviousPlugins | None = None,
) -> Scheduler:
    """Build the configured plugins and wire them into a :class:`Scheduler` (``previous``: a running
    router's plugins to re-use where unchanged, see :class:`PreviousPlugins`).

    The plugins see the config's ``saturation:`` section as ``context.saturation``."""
    saturation = Saturation(**config.saturation.model_dump())
    context = dataclasses.replace(context, saturation=saturation)
    plugins = build_plugins(config.plugins, registry, context, previous=previous)
    return Scheduler(
        build_profile(config.profile, plugins, saturation),
        observer=observer,
        cycle_observer=cycle_observer,
        timing_every=config.metrics.timing_every,
    )


def _unknown(name: str, plugins: dict[str, Plugin]) -> str:
    known = ", ".join(sorted(plugins)) or "none"
    return f"unknown plugin {name!r} (configured: {known})"


def _unique(items: Iterable[P]) -> list[P]:
    out: dict[int, P] = {}
    for item in items:
        out.setdefault(id(item), item)
    return list(out.values())
