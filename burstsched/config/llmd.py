"""llm-d's ``EndpointPickerConfig``, read as it is and translated into a :class:`RouterConfig`.

A team moving from llm-d brings the file its endpoint picker (EPP) runs::

    apiVersion: llm-d.ai/v1alpha1        # also llm-d.ai/v1 and inference.networking.x-k8s.io/v1alpha1
    kind: EndpointPickerConfig
    plugins:                             # instances: type, optional name (default: the type), parameters
      - type: approx-prefix-cache-producer
        parameters: {blockSizeTokens: 64}
      - type: prefix-cache-scorer
      - type: max-score-picker
    schedulingProfiles:                  # burstsched runs exactly one
      - name: default
        plugins:
          - pluginRef: prefix-cache-scorer
            weight: 3
          - pluginRef: max-score-picker

Each plugin type maps to burstsched's own (:mod:`burstsched.config.llmd_plugins` has the table); an unknown
type, a parameter with no equivalent, or a feature burstsched does not have (the latency predictor,
multi-cluster routing, ...) is refused with a :class:`ConfigError` naming the plugin and the parameter.
Producers come first in the profile as in llm-d, where they are not listed in profiles; a ``health-filter``
comes next (llm-d's pool holds only ready pods; burstsched keeps unhealthy endpoints out with this filter);
a prefix-cache scorer with no producer gets llm-d's default, an approximate one; a profile with no picker
gets ``max-score-picker``, as in llm-d. ``featureGates: [flowControl]`` and the ``flowControl`` section
become ``flow_control`` (:mod:`burstsched.config.llmd_flow`). Everything else (timeouts, limits, ...) takes
burstsched's defaults, and burst admission is off unless a ``burst-prefix-cache-producer`` asks for it.

An llm-d pool is usually found by label selector: the same file may carry the ``InferencePool`` as a second
YAML document (``spec.selector.matchLabels``, ``spec.targetPorts``). Its selector is kept in
``pool.selector`` for discovery, which burstsched does not do yet: the endpoints still come from
``--endpoint``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from burstsched.config.errors import ConfigError, ConfigIssue, issues_from_validation
from burstsched.config.llmd_flow import (
    FEATURE_GATE,
    FLOW_TRANSLATORS,
    FlowPlugin,
    gate_enabled,
    translate_admitter,
    translate_flow_control,
)
from burstsched.config.llmd_params import Params
from burstsched.config.llmd_plugins import BURSTSCHED_TYPES, ROLE_LABEL, TRANSLATORS, Translated
from burstsched.config.models import PluginSpec, RouterConfig

PICKER_CONFIG_KIND = "EndpointPickerConfig"
API_VERSIONS = ("llm-d.ai/v1alpha1", "llm-d.ai/v1", "inference.networking.x-k8s.io/v1alpha1")
POOL_KIND = "InferencePool"
POOL_API_VERSIONS = ("inference.networking.k8s.io/v1", "inference.networking.x-k8s.io/v1alpha2")

_TOP_LEVEL = (
    "apiVersion",
    "kind",
    "plugins",
    "schedulingProfiles",
    "featureGates",
    "saturationDetector",
    "dataLayer",
    "requestHandler",
    "flowControl",
)
# llm-d features burstsched has not built, by the plugin types that need them: one line each
UNBUILT_FEATURES = {
    **dict.fromkeys(
        ("predicted-latency-producer", "latency-scorer", "latency-slo-admitter"), "llm-d's latency predictor"
    ),
    **dict.fromkeys(
        (
            "multicluster-file-discovery",
            "multicluster-metrics-data-source",
            "multicluster-metrics-extractor",
            "multicluster-kv-cache-utilization-scorer",
            "multicluster-queue-scorer",
        ),
        "multi-cluster routing",
    ),
    **dict.fromkeys(
        ("topology-extractor", "topology-affinity-filter", "topology-affinity-scorer"),
        "topology-aware placement (pod topology labels)",
    ),
    **dict.fromkeys(
        ("dcgm-data-source", "dcgm-extractor", "endpoint-attribute-filter", "endpoint-attribute-scorer"),
        "GPU telemetry from DCGM and routing on endpoint attributes",
    ),
    **dict.fromkeys(
        ("mm-embeddings-cache-producer", "mm-embeddings-cache-scorer"), "the multimodal embeddings cache"
    ),
}
_NOT_SUPPORTED = {
    "parser": "not supported: the deprecated parser section; list parsers under requestHandler.parsers",
}
# Gates of features burstsched always has: its producers run before scheduling, its pool scrapes metrics.
_HARMLESS_GATES = ("prepareDataPlugins", "dataLayer")
# Plugin roles llm-d lists in a scheduling profile's default (filters, scorers, pickers).
_PROFILE_ROLES = ("filter", "role-filter", "scorer", "picker", "detector")
_HEALTH_FILTER = "health-filter"
_AUTO_PRODUCER = "approx-prefix-producer"
LLMD_SCRAPE_INTERVAL_MS = 50.0  # llm-d's metrics refresh period


def is_kubernetes_document(data: object) -> bool:
    """Whether a decoded YAML document is a Kubernetes-style object (``apiVersion``/``kind``), not ours."""
    return isinstance(data, Mapping) and ("apiVersion" in data or "kind" in data)


@dataclass(frozen=True)
class LlmdTranslation:
    """The router configuration an llm-d file becomes, and what the reader should know about it."""

    config: RouterConfig
    api_version: str
    notes: tuple[str, ...] = ()
    explain: tuple[str, ...] = ()


@dataclass
class _Plugin:
    index: int
    llmd_type: str
    llmd_name: str
    translated: Translated


@dataclass
class _Profile:
    scorers: list[tuple[str, float | None]] = field(default_factory=list)
    filters: list[str] = field(default_factory=list)
    picker: str | None = None
    listed: set[str] = field(default_factory=set)
    stages: set[str] = field(default_factory=set)


def translate_llmd(documents: Sequence[object], *, source: str | None = None) -> LlmdTranslation:
    """Translate an ``EndpointPickerConfig`` (and optionally its ``InferencePool``) into a RouterConfig."""
    issues: list[ConfigIssue] = []
    picker_config: Mapping[str, Any] | None = None
    selector: dict[str, Any] | None = None
    for i, doc in enumerate(documents):
        where = f"document {i + 1}" if len(documents) > 1 else ""
        if not is_kubernetes_document(doc) or not isinstance(doc, Mapping):
            issues.append(ConfigIssue(where, "expected a document with apiVersion and kind"))
        elif doc.get("kind") == PICKER_CONFIG_KIND and picker_config is None:
            picker_config = doc
        elif doc.get("kind") == POOL_KIND and selector is None:
            selector = _pool_selector(doc, issues)
        else:
            issues.append(
                ConfigIssue(
                    _where(where, "kind"),
                    f"expected one {PICKER_CONFIG_KIND} and at most one {POOL_KIND}, got {doc.get('kind')!r}",
                )
            )
    if picker_config is None:
        issues.append(ConfigIssue("kind", f"no {PICKER_CONFIG_KIND} document"))
        raise ConfigError(issues, source)
    api_version = picker_config.get("apiVersion")
    if api_version not in API_VERSIONS:
        issues.append(
            ConfigIssue("apiVersion", f"expected one of {', '.join(API_VERSIONS)}; got {api_version!r}")
        )
    notes: list[str] = []
    explain: list[str] = []
    data = _translate_picker_config(picker_config, issues, notes, explain)
    if selector is not None:
        data.setdefault("pool", {})["selector"] = selector
    if issues:
        raise ConfigError(issues, source)
    try:
        config = RouterConfig.model_validate(data)
    except ValidationError as exc:  # a translation that does not fit: name burstsched's field
        raise ConfigError(issues_from_validation(exc, prefix="(translated)"), source) from None
    return LlmdTranslation(config, str(api_version), tuple(notes), tuple(explain))


def _where(where: str, key: str) -> str:
    return f"{where}: {key}" if where else key


def _translate_picker_config(
    doc: Mapping[str, Any], issues: list[ConfigIssue], notes: list[str], explain: list[str]
) -> dict[str, Any]:
    for key in doc:
        if key in _NOT_SUPPORTED:
            issues.append(ConfigIssue(str(key), _NOT_SUPPORTED[key]))
        elif key not in _TOP_LEVEL:
            issues.append(ConfigIssue(str(key), "unknown field"))
    _check_gates(doc.get("featureGates"), issues)
    refused: set[str] = set()
    plugins = _translate_plugins(doc.get("plugins"), issues, refused)
    profile = _read_profiles(doc.get("schedulingProfiles"), plugins, refused, issues, notes)
    _check_data_layer(doc.get("dataLayer"), plugins, refused, issues)
    _check_request_handler(doc.get("requestHandler"), plugins, refused, issues)
    flow_plugins = {n: FlowPlugin(p.llmd_type, p.translated) for n, p in plugins.items()}
    flow_explain: list[str] = []
    flow_control = translate_flow_control(
        doc.get("flowControl"),
        doc.get("saturationDetector"),
        gate_enabled(doc.get("featureGates")),
        flow_plugins,
        issues,
        notes,
        flow_explain,
    )
    data = _assemble(plugins, profile, issues, notes)
    data["flow_control"] = flow_control
    admitter = translate_admitter(flow_plugins, issues)
    if admitter is not None:
        flow_control["admitter"] = admitter
    explain += [_explain(plugin, profile) for plugin in plugins.values()]
    explain += flow_explain
    return data


def _explain(plugin: _Plugin, profile: _Profile) -> str:
    """What one llm-d plugin became, for ``burstsched check --explain``."""
    translated = plugin.translated
    head = f"{plugin.llmd_type} {plugin.llmd_name!r}"
    spec = translated.spec
    if translated.role == "burst" and translated.admission is not None:
        return f"{head}: burst admission (window {translated.admission['window_ms']:g} ms)"
    if translated.role == "handler":
        return f"{head}: {translated.explain or 'nothing: burstsched runs the one profile it routes by'}"
    if translated.role == "role-filter":
        if translated.stage == "decode":
            return (
                f"{head}: nothing: burstsched endpoints carry no {ROLE_LABEL} label, and llm-d's "
                "decode-filter keeps pods without one"
            )
        return (
            f"{head}: keeps only {ROLE_LABEL} {translated.stage} endpoints: none (burstsched's carry no role)"
        )
    if spec is None:
        return f"{head}: {translated.explain or 'nothing'}"
    listed = plugin.llmd_name in profile.listed or translated.role == "producer"
    where = "" if listed else " (in no scheduling profile that routes: not used)"
    if not listed and translated.role == "detector":
        where = " (in no scheduling profile that routes: filters no endpoint; see flowControl for its gate)"
    text = f"{head}: {spec.type}"
    if spec.name not in (None, spec.type):
        text += f" {spec.name!r}"
    if spec.parameters:
        text += " {" + ", ".join(f"{k}: {v}" for k, v in spec.parameters.items()) + "}"
    scorer = translated.scorer_spec
    if scorer is not None:
        listed = plugin.llmd_name in profile.listed
        text += f" and {scorer.type}" + (
            f" {scorer.name!r}" if scorer.name not in (None, scorer.type) else ""
        )
        where = "" if listed else " (the scorer is in no scheduling profile that routes: not used)"
    if translated.explain:
        where += f"; {translated.explain}"
    return text + where


def _check_gates(gates: object, issues: list[ConfigIssue]) -> None:
    if gates is None:
        return
    if not isinstance(gates, list):
        issues.append(ConfigIssue("featureGates", "must be a list of gate names"))
        return
    for i, gate in enumerate(gates):
        if not isinstance(gate, str):
            issues.append(ConfigIssue(f"featureGates[{i}]", f"must be a gate name, got {gate!r}"))
            continue
        name, _, value = gate.partition("=")
        if value.lower() == "false" or name in _HARMLESS_GATES or name == FEATURE_GATE:
            continue
        issues.append(ConfigIssue(f"featureGates[{i}]", f"not supported: burstsched has no feature {name!r}"))


def _translate_plugins(raw: object, issues: list[ConfigIssue], refused: set[str]) -> dict[str, _Plugin]:
    plugins: dict[str, _Plugin] = {}
    unbuilt: dict[str, list[tuple[str, str]]] = {}
    if not isinstance(raw, list) or not raw:
        issues.append(ConfigIssue("plugins", "must be a non-empty list of plugins"))
        return plugins
    for i, entry in enumerate(raw):
        path = f"plugins[{i}]"
        if not isinstance(entry, Mapping):
            issues.append(ConfigIssue(path, "must be a mapping with type, name and parameters"))
            continue
        for key in entry:
            if key not in ("type", "name", "parameters"):
                issues.append(ConfigIssue(f"{path}.{key}", "unknown field"))
        llmd_type, name = entry.get("type"), entry.get("name")
        if not isinstance(llmd_type, str) or not llmd_type:
            issues.append(ConfigIssue(f"{path}.type", "required: the llm-d plugin type"))
            continue
        if name is not None and (not isinstance(name, str) or not name):
            issues.append(ConfigIssue(f"{path}.name", "must be a non-empty string"))
            continue
        llmd_name = name if name is not None else llmd_type
        translator = TRANSLATORS.get(llmd_type) or FLOW_TRANSLATORS.get(llmd_type)
        if translator is None and llmd_type in UNBUILT_FEATURES:
            refused.add(llmd_name)
            unbuilt.setdefault(UNBUILT_FEATURES[llmd_type], []).append((path, llmd_type))
            continue
        if translator is None:
            refused.add(llmd_name)  # references to it say nothing more
            issues.append(
                ConfigIssue(
                    f"{path}.type",
                    f"llm-d plugin type {llmd_type!r} is not supported by burstsched (README: llm-d configs)",
                )
            )
            continue
        if llmd_name in plugins:
            issues.append(ConfigIssue(f"{path}.name", f"duplicate plugin name {llmd_name!r}"))
            continue
        instance = name if name is not None else BURSTSCHED_TYPES.get(llmd_type, llmd_type)
        params = Params(entry.get("parameters"), f"{path}.parameters", f"{llmd_type} {llmd_name!r}", issues)
        translated = translator(instance, params)
        params.finish()
        spec = translated.spec
        if name is None and spec is not None and spec.name == spec.type:  # as burstsched writes it
            translated.spec = spec.model_copy(update={"name": None})
        plugins[llmd_name] = _Plugin(i, llmd_type, llmd_name, translated)
    for feature, found in unbuilt.items():
        types = ", ".join(dict.fromkeys(t for _, t in found))
        message = f"not supported yet: {feature} is not built in burstsched (plugins: {types})"
        issues[:] = [i for i in issues if feature not in i.message]  # a parameter asking for it adds nothing
        issues.append(ConfigIssue(f"{found[0][0]}.type", message))
    return plugins


def _read_profiles(
    raw: object, plugins: dict[str, _Plugin], refused: set[str], issues: list[ConfigIssue], notes: list[str]
) -> _Profile:
    """The profile burstsched routes by: the only one, or the decode profile of a disagg handler."""
    if raw is None or raw == []:
        names = [n for n, p in plugins.items() if p.translated.role in _PROFILE_ROLES]
        notes.append(
            "schedulingProfiles: missing; llm-d's default applies: one profile 'default' with every filter, "
            f"scorer and picker configured ({', '.join(names) or 'none'}), each scorer weighing 1"
        )
        raw = [{"name": "default", "plugins": [{"pluginRef": n} for n in names]}]
    if not isinstance(raw, list):
        issues.append(ConfigIssue("schedulingProfiles", "must be a list of scheduling profiles"))
        return _Profile()
    names_at: dict[str, int] = {}
    for i, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            issues.append(ConfigIssue(f"schedulingProfiles[{i}]", "must be a mapping with name and plugins"))
            return _Profile()
        name = entry.get("name")
        if isinstance(name, str):
            names_at.setdefault(name, i)
    primary = 0
    handler: dict[str, str] | None = None
    if len(raw) > 1:
        handlers = [p for p in plugins.values() if p.translated.role == "handler"]
        handler = handlers[0].translated.handler if handlers else None
        if not handler:
            issues.append(
                ConfigIssue(
                    "schedulingProfiles",
                    "several scheduling profiles need a disagg-profile-handler (with a "
                    "single-profile-handler or none, llm-d runs one)",
                )
            )
        elif handler["decode"] not in names_at:
            issues.append(
                ConfigIssue(
                    "schedulingProfiles",
                    f"no profile named {handler['decode']!r}: the disagg-profile-handler's decode profile",
                )
            )
            return _Profile()
        else:
            primary = names_at[handler["decode"]]
    profile = _Profile()
    _read_entry(primary, raw[primary], plugins, refused, profile, issues)
    for stage in sorted(profile.stages - {"decode"}):
        issues.append(
            ConfigIssue(
                f"schedulingProfiles[{primary}].plugins",
                f"not supported: {stage}-filter in the profile that routes keeps no endpoint: burstsched "
                f"endpoints carry no {ROLE_LABEL} label (disaggregated serving is not built)",
            )
        )
    if handler:
        _read_stages(raw, primary, handler, names_at, plugins, refused, issues, notes)
    return profile


def _read_stages(
    raw: list[Any],
    primary: int,
    handler: dict[str, str],
    names_at: dict[str, int],
    plugins: dict[str, _Plugin],
    refused: set[str],
    issues: list[ConfigIssue],
    notes: list[str],
) -> None:
    """The disagg handler's other profiles: checked, and run only on endpoints of their role (none here)."""
    for i, entry in enumerate(raw):
        if i == primary:
            continue
        stage_profile = _Profile()
        _read_entry(i, entry, plugins, refused, stage_profile, issues)
        name = entry.get("name")
        stage = next((s for s in ("prefill", "encode") if handler.get(s) == name), None)
        if stage is None or f"{stage}_decider" not in handler:
            notes.append(
                f"scheduling profile {name!r} is never run (llm-d's disagg-profile-handler skips it too)"
            )
        elif stage not in stage_profile.stages:
            issues.append(
                ConfigIssue(
                    f"schedulingProfiles[{i}]",
                    f"not supported: disaggregated serving: profile {name!r} would run the {stage} stage on "
                    f"endpoints of any role (it has no {stage}-filter)",
                )
            )
        else:
            notes.append(
                f"disagg-profile-handler: routes by profile {handler['decode']!r}; profile {name!r} keeps "
                f"only endpoints with {ROLE_LABEL} {stage} and burstsched endpoints carry no role, so the "
                f"{stage} "
                "stage never runs, as in llm-d with such a pool (disaggregated serving is not built)"
            )


def _read_entry(
    i: int,
    entry: Mapping[str, Any],
    plugins: dict[str, _Plugin],
    refused: set[str],
    profile: _Profile,
    issues: list[ConfigIssue],
) -> None:
    for key in entry:
        if key not in ("name", "plugins"):
            issues.append(ConfigIssue(f"schedulingProfiles[{i}].{key}", "unknown field"))
    refs = entry.get("plugins")
    if not isinstance(refs, list):
        issues.append(ConfigIssue(f"schedulingProfiles[{i}].plugins", "must be a list of plugin references"))
        return
    for j, ref in enumerate(refs):
        _read_ref(f"schedulingProfiles[{i}].plugins[{j}]", ref, plugins, refused, profile, issues)


def _read_ref(
    path: str,
    ref: object,
    plugins: dict[str, _Plugin],
    refused: set[str],
    profile: _Profile,
    issues: list[ConfigIssue],
) -> None:
    if not isinstance(ref, Mapping):
        issues.append(ConfigIssue(path, "must be a mapping with pluginRef and an optional weight"))
        return
    for key in ref:
        if key not in ("pluginRef", "weight"):
            issues.append(ConfigIssue(f"{path}.{key}", "unknown field"))
    name, weight = ref.get("pluginRef"), ref.get("weight")
    if isinstance(name, str) and name in refused:
        return  # its own line says why
    plugin = plugins.get(name) if isinstance(name, str) else None
    if plugin is None:
        configured = ", ".join(sorted(plugins)) or "none"
        issues.append(ConfigIssue(f"{path}.pluginRef", f"unknown plugin {name!r} (configured: {configured})"))
        return
    if plugin.llmd_name in profile.listed:
        issues.append(ConfigIssue(f"{path}.pluginRef", f"plugin {plugin.llmd_name!r} is listed twice"))
        return
    profile.listed.add(plugin.llmd_name)
    role = plugin.translated.role
    if weight is not None and (isinstance(weight, bool) or not isinstance(weight, int | float) or weight < 0):
        issues.append(ConfigIssue(f"{path}.weight", f"must be a number at least 0, got {weight!r}"))
        return
    spec = plugin.translated.spec
    also_scorer = plugin.translated.scorer_spec
    if also_scorer is not None:  # a producer that is also a scorer: listed, it scores
        role, spec = "scorer", also_scorer
    if weight is not None and role != "scorer":
        issues.append(
            ConfigIssue(f"{path}.weight", f"{plugin.llmd_type} {plugin.llmd_name!r} is not a scorer")
        )
        return
    if role == "role-filter" and plugin.translated.stage is not None:
        profile.stages.add(plugin.translated.stage)
    elif role == "scorer" and spec is not None:
        profile.scorers.append((spec.instance_name, None if weight is None else float(weight)))
    elif role in ("detector", "filter") and spec is not None:
        profile.filters.append(spec.instance_name)
    elif role == "detector":
        issues.append(
            ConfigIssue(
                f"{path}.pluginRef",
                f"{plugin.llmd_type} {plugin.llmd_name!r}: not supported as a scheduling filter: burstsched "
                "drops endpoints by their waiting queue and KV usage (utilization-detector), not by requests "
                "in flight",
            )
        )
    elif role == "policy":
        issues.append(
            ConfigIssue(
                f"{path}.pluginRef",
                f"{plugin.llmd_type} {plugin.llmd_name!r} is a flow-control policy, not a filter, scorer or "
                "picker",
            )
        )
    elif role == "picker" and spec is not None:
        if profile.picker is not None:
            issues.append(ConfigIssue(f"{path}.pluginRef", "a scheduling profile has one picker"))
        profile.picker = spec.instance_name


def _check_data_layer(
    raw: object, plugins: dict[str, _Plugin], refused: set[str], issues: list[ConfigIssue]
) -> None:
    """``dataLayer.sources[].extractors[]``: burstsched does what they ask by itself; each must exist."""
    if raw is None:
        return
    if not isinstance(raw, Mapping):
        issues.append(ConfigIssue("dataLayer", "must be a mapping with sources"))
        return
    for key in raw:
        refs = list(_plugin_refs(raw[key]))
        if refs and all(ref in refused for ref in refs):
            continue  # e.g. discovery by a refused multi-cluster plugin: its own line says it all
        if key != "sources":
            issues.append(
                ConfigIssue(
                    f"dataLayer.{key}", "not supported: burstsched's endpoints come from its discovery"
                )
            )
    sources = raw.get("sources", [])
    if not isinstance(sources, list):
        issues.append(ConfigIssue("dataLayer.sources", "must be a list of {pluginRef, extractors}"))
        return
    for i, source in enumerate(sources):
        path = f"dataLayer.sources[{i}]"
        if not isinstance(source, Mapping) or any(k not in ("pluginRef", "extractors") for k in source):
            issues.append(ConfigIssue(path, "must be a mapping with pluginRef and extractors"))
            continue
        _check_layer_ref(f"{path}.pluginRef", source.get("pluginRef"), ("source",), plugins, refused, issues)
        extractors = source.get("extractors", [])
        if not isinstance(extractors, list):
            issues.append(ConfigIssue(f"{path}.extractors", "must be a list of {pluginRef}"))
            continue
        for j, extractor in enumerate(extractors):
            ref = extractor.get("pluginRef") if isinstance(extractor, Mapping) else None
            roles = ("extractor", "producer")  # the precise producer reads endpoint notifications
            _check_layer_ref(f"{path}.extractors[{j}].pluginRef", ref, roles, plugins, refused, issues)


def _plugin_refs(value: object) -> Iterator[str]:
    """Every ``pluginRef`` named anywhere in ``value``."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key == "pluginRef" and isinstance(item, str):
                yield item
            else:
                yield from _plugin_refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from _plugin_refs(item)


def _check_request_handler(
    raw: object, plugins: dict[str, _Plugin], refused: set[str], issues: list[ConfigIssue]
) -> None:
    if raw is None:
        return
    parsers = raw.get("parsers") if isinstance(raw, Mapping) else None
    if not isinstance(raw, Mapping) or any(k != "parsers" for k in raw) or not isinstance(parsers, list):
        issues.append(ConfigIssue("requestHandler", "expected {parsers: [{pluginRef: NAME}, ...]}"))
        return
    for i, parser in enumerate(parsers):
        ref = parser.get("pluginRef") if isinstance(parser, Mapping) else None
        _check_layer_ref(f"requestHandler.parsers[{i}].pluginRef", ref, ("parser",), plugins, refused, issues)


def _check_layer_ref(
    path: str,
    ref: object,
    roles: tuple[str, ...],
    plugins: dict[str, _Plugin],
    refused: set[str],
    issues: list[ConfigIssue],
) -> None:
    if isinstance(ref, str) and ref in refused:
        return
    plugin = plugins.get(ref) if isinstance(ref, str) else None
    if plugin is None:
        issues.append(ConfigIssue(path, f"unknown plugin {ref!r}"))
    elif plugin.translated.role not in roles:
        issues.append(ConfigIssue(path, f"{plugin.llmd_type} {plugin.llmd_name!r} is not a {roles[0]}"))


def _assemble(
    plugins: dict[str, _Plugin], profile: _Profile, issues: list[ConfigIssue], notes: list[str]
) -> dict[str, Any]:
    by_role: dict[str, list[_Plugin]] = {}
    for plugin in plugins.values():
        by_role.setdefault(plugin.translated.role, []).append(plugin)
    producers = by_role.get("producer", [])
    bursts = by_role.get("burst", [])
    detectors = by_role.get("detector", [])
    for extra in producers[1:]:
        issues.append(
            ConfigIssue(
                f"plugins[{extra.index}].type",
                f"{extra.llmd_type} {extra.llmd_name!r}: not supported: a second prefix-cache producer "
                "(burstsched keeps one prefix match per endpoint)",
            )
        )
    for extra in bursts[1:]:
        issues.append(
            ConfigIssue(f"plugins[{extra.index}].type", "not supported: a second burst-prefix-cache-producer")
        )
    data: dict[str, Any] = {}
    hashing = _merge_hashing([*producers[:1], *bursts[:1]], issues)
    specs: dict[str, PluginSpec] = {}
    producer_names: list[str] = []
    for plugin in producers[:1]:
        spec = plugin.translated.spec
        if spec is not None:
            specs[spec.instance_name] = spec
            producer_names.append(spec.instance_name)
        if plugin.translated.kv_events is not None:
            data["kv_events"] = plugin.translated.kv_events
    _check_producer_refs(plugins, issues)
    prefix_types = ("prefix-cache-scorer", "precise-prefix-cache-scorer")
    prefix_scorers = [n for n, _ in profile.scorers if _type_of(plugins, n) in prefix_types]
    if len(prefix_scorers) > 1:
        issues.append(
            ConfigIssue(
                "schedulingProfiles[0].plugins",
                "not supported: a second prefix-cache-scorer (burstsched keeps one prefix match per "
                "endpoint)",
            )
        )
    if prefix_scorers and not producer_names:
        specs[_AUTO_PRODUCER] = PluginSpec(type=_AUTO_PRODUCER)
        producer_names.append(_AUTO_PRODUCER)
        hashing.setdefault("max_blocks", 2048)
        notes.append(
            "prefix-cache-scorer without a prefix-cache producer: added llm-d's default, an approximate one "
            f"({_AUTO_PRODUCER})"
        )
    if hashing:
        data["prefix_hashing"] = hashing
    in_profile = [p for p in detectors if p.translated.spec is not None and p.llmd_name in profile.listed]
    specs[_HEALTH_FILTER] = PluginSpec(
        type=_HEALTH_FILTER, parameters={"drop_stale": True} if in_profile else {}
    )
    _pool_timing(detectors, data, issues, notes)
    for plugin in detectors:
        if plugin not in in_profile and plugin.translated.spec is not None:
            notes.append(
                f"utilization-detector {plugin.llmd_name!r} is in no scheduling profile: it filters no "
                "endpoint; its metricsStalenessThreshold applies, and its thresholds gate the router's queue "
                "when flow control is on"
            )
    for plugin in plugins.values():
        spec = plugin.translated.spec
        if spec is not None and plugin.llmd_name in profile.listed and plugin.translated.role != "producer":
            specs[spec.instance_name] = spec
        scorer = plugin.translated.scorer_spec
        if scorer is not None and plugin.llmd_name in profile.listed:
            specs[scorer.instance_name] = scorer
    picker = profile.picker
    if picker is None:
        picker = "max-score-picker"
        specs.setdefault(picker, PluginSpec(type="max-score-picker"))
        notes.append("the profile has no picker: added max-score-picker, llm-d's default")
    refs: list[dict[str, Any]] = [{"plugin_ref": name} for name in producer_names]
    refs.append({"plugin_ref": _HEALTH_FILTER})
    refs += [{"plugin_ref": name} for name in profile.filters]
    refs += [{"plugin_ref": name, "weight": weight} for name, weight in profile.scorers]
    data["plugins"] = [spec.model_dump(exclude_none=True) for spec in specs.values()]
    data["profile"] = {"plugins": refs, "picker": picker}
    tokenizers = by_role.get("tokenizer", [])
    if tokenizers and tokenizers[0].translated.tokenizer is not None:
        data["tokenizer"] = tokenizers[0].translated.tokenizer
    elif producers and producers[0].translated.tokenizer is not None:  # its own tokenizersPoolConfig
        data["tokenizer"] = producers[0].translated.tokenizer
        notes.append(
            f"{producers[0].llmd_type} {producers[0].llmd_name!r}: indexerConfig.tokenizersPoolConfig became "
            "burstsched's tokenizer (tokenizer.source remote: each replica's /tokenize)"
        )
    if bursts:
        data["admission"] = bursts[0].translated.admission
        notes.append(
            "burst-prefix-cache-producer became burst admission: cold requests wait up to "
            f"{data['admission']['window_ms']:g} ms and are placed by shared-prefix group"
        )
    else:
        data["admission"] = {"enabled": False}
    return data


def _type_of(plugins: dict[str, _Plugin], instance: str) -> str | None:
    for plugin in plugins.values():
        for spec in (plugin.translated.spec, plugin.translated.scorer_spec):
            if spec is not None and spec.instance_name == instance:
                return plugin.llmd_type
    return None


def _merge_hashing(sources: list[_Plugin], issues: list[ConfigIssue]) -> dict[str, int]:
    merged: dict[str, int] = {}
    for plugin in sources:
        for key, value in plugin.translated.prefix_hashing.items():
            if key in merged and merged[key] != value:
                what = "blockSizeTokens" if key == "block_tokens" else "maxPrefixTokensToMatch"
                issues.append(
                    ConfigIssue(
                        f"plugins[{plugin.index}].parameters.{what}",
                        f"{plugin.llmd_type} {plugin.llmd_name!r}: must agree with the other prefix "
                        f"producer's ({merged[key]} {key.replace('_', ' ')}): burstsched hashes a "
                        "prompt once",
                    )
                )
            merged.setdefault(key, value)
    return merged


def _check_producer_refs(plugins: dict[str, _Plugin], issues: list[ConfigIssue]) -> None:
    for plugin in plugins.values():
        ref = plugin.translated.producer_ref
        if ref is None:
            continue
        target = plugins.get(ref)
        if target is None or target.translated.role not in ("producer", "burst"):
            issues.append(
                ConfigIssue(
                    f"plugins[{plugin.index}].parameters.prefixMatchInfoProducerName",
                    f"{plugin.llmd_type} {plugin.llmd_name!r}: {ref!r} is not a configured prefix-cache "
                    "producer",
                )
            )


def _pool_timing(
    detectors: list[_Plugin], data: dict[str, Any], issues: list[ConfigIssue], notes: list[str]
) -> None:
    """llm-d's metrics refresh period and the detectors' staleness threshold."""
    pool = data.setdefault("pool", {})
    pool["scrape_interval_ms"] = LLMD_SCRAPE_INTERVAL_MS
    notes.append(
        f"pool.scrape_interval_ms: {LLMD_SCRAPE_INTERVAL_MS:g} as llm-d refreshes metrics "
        "(burstsched's own default is 1000: each vLLM /metrics page costs its API server about 10 ms)"
    )
    values = {p.translated.staleness_ms for p in detectors if p.translated.staleness_ms is not None}
    if len(values) > 1:
        issues.append(
            ConfigIssue(
                "plugins",
                "utilization-detectors disagree on metricsStalenessThreshold: burstsched has one staleness "
                "threshold for the pool",
            )
        )
    elif values:
        pool["staleness_threshold_ms"] = values.pop()


def _pool_selector(doc: Mapping[str, Any], issues: list[ConfigIssue]) -> dict[str, Any] | None:
    """An InferencePool's label selector and target port (v1 and v1alpha2 shapes)."""
    version = doc.get("apiVersion")
    if version not in POOL_API_VERSIONS:
        issues.append(
            ConfigIssue(
                f"{POOL_KIND}.apiVersion", f"expected one of {', '.join(POOL_API_VERSIONS)}; got {version!r}"
            )
        )
        return None
    spec = doc.get("spec")
    metadata = doc.get("metadata")
    if not isinstance(spec, Mapping):
        issues.append(ConfigIssue(f"{POOL_KIND}.spec", "required: a mapping with selector and target port"))
        return None
    raw_selector = spec.get("selector")
    if version == "inference.networking.k8s.io/v1":
        if isinstance(raw_selector, Mapping) and "matchExpressions" in raw_selector:
            issues.append(
                ConfigIssue(f"{POOL_KIND}.spec.selector.matchExpressions", "not supported: matchLabels only")
            )
        labels = raw_selector.get("matchLabels") if isinstance(raw_selector, Mapping) else None
        ports = spec.get("targetPorts")
        port = (
            ports[0].get("number")
            if isinstance(ports, list) and ports and isinstance(ports[0], Mapping)
            else None
        )
        if isinstance(ports, list) and len(ports) > 1:
            issues.append(ConfigIssue(f"{POOL_KIND}.spec.targetPorts", "not supported: one target port"))
    else:
        labels, port = raw_selector, spec.get("targetPortNumber")
    if (
        not isinstance(labels, Mapping)
        or not labels
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
    ):
        issues.append(ConfigIssue(f"{POOL_KIND}.spec.selector", "required: labels as a map of strings"))
        return None
    selector: dict[str, Any] = {"match_labels": dict(labels)}
    if port is not None:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            issues.append(ConfigIssue(f"{POOL_KIND}.spec", f"target port must be 1..65535, got {port!r}"))
            return None
        selector["target_port"] = port
    namespace = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    if isinstance(namespace, str) and namespace:
        selector["namespace"] = namespace
    return selector
