"""llm-d's flow control, read as llm-d's loader reads it and translated into burstsched's ``flow_control:``.

llm-d turns its queue on with the ``flowControl`` feature gate (off by default); the ``flowControl``
section tunes it, and without the gate llm-d ignores every setting there but ``saturationDetector``. So
here: the gate turns ``flow_control.enabled`` on; without it ``flow_control.enabled`` is false (burstsched's
queue is on by default, llm-d's is not), and the section is read, checked and noted, and changes nothing.

================================= ======================================================================
llm-d                             burstsched ``flow_control``
================================= ======================================================================
``maxRequests``, ``maxBytes``     ``max_requests``, ``max_bytes`` (Kubernetes quantities: ``1k``, ``10Gi``)
``priorityBands[]``               ``bands`` {priority: {max_requests, max_bytes}}, llm-d's per-band
                                  defaults (5000 requests, 1 GB) where a band leaves one out
``defaultRequestTTL``             ``ttl_ms`` (default 60 s, as llm-d's)
``noEndpointRequestTTL``          ``no_endpoint_wait_ms`` (else ``defaultRequestTTL``, else 60 s)
fairness policy of the bands      ``fairness``: ``round-robin-fairness-policy`` → ``round-robin``,
                                  ``global-strict-fairness-policy`` (llm-d's default) → ``strict``,
                                  ``program-aware-fairness`` → ``program-aware`` (``program_aware``)
ordering policy of the bands      ``fcfs-ordering-policy`` (the default), ``edf-ordering-policy`` (every
                                  request has the one default TTL, so its deadlines keep arrival order)
the saturation detector           ``headroom``: utilization-detector → ``max_waiting``, ``max_kv_usage``;
                                  concurrency-detector → ``max_in_flight``
``static-usage-limit-policy``     the detector's thresholds times its ``threshold``
``priority-holdback-policy``,     ``ceilings`` (per-priority dispatch ceilings)
``soft-reflective-ceiling-policy``
``probabilistic-admitter``        ``admitter`` (a plugin, not part of the section: on with or without the
                                  gate, as llm-d's admitters are)
================================= ======================================================================

Refused, one line each where flow control would use them: SLO-deadline ordering, in-flight eviction, bounds
for bands not listed, a TTL of 0 (no limit), a concurrency detector counting tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from burstsched.config.errors import ConfigIssue
from burstsched.config.llmd_params import Params
from burstsched.config.llmd_plugins import (
    FlowPart,
    Translated,
    Translator,
    concurrency_limit,
    utilization_limits,
)

FEATURE_GATE = "flowControl"
DEFAULT_DETECTOR = "utilization-detector"
DEFAULT_FAIRNESS = "global-strict-fairness-policy"
DEFAULT_ORDERING = "fcfs-ordering-policy"
DEFAULT_USAGE_LIMIT = "static-usage-limit-policy"
_TTL_MS = 60_000.0  # llm-d's defaultRequestTTL (and noEndpointRequestTTL when neither is set)
_BAND_MAX_REQUESTS = 5000  # llm-d's per-band defaults: every band it runs is bounded
_BAND_MAX_BYTES = 1_000_000_000
_SECTION = "llm-d flowControl"
_FAIRNESS = {"round-robin-fairness-policy": "round-robin", DEFAULT_FAIRNESS: "strict"}


def _fairness(kind: Literal["round-robin", "strict"], explain: str) -> Translator:
    def translate(name: str, p: Params) -> Translated:
        return Translated("policy", flow=FlowPart("fairness", fairness=kind), explain=explain)

    return translate


def _program_aware(name: str, p: Params) -> Translated:
    p.text("strategy", "las", choices=("las",))
    settings = {
        "weight_service": p.number("lasWeightService", 0.8, minimum=0.0),
        "weight_head_wait": p.number("lasWeightHeadWait", 0.2, minimum=0.0),
        "half_life_s": p.number("lasHalfLifeSeconds", 60.0, minimum=0.0),
        "forget_after_s": p.number("evictionTtlSeconds", 3600.0, minimum=0.0),
    }
    p.number("evictionSweepSeconds", 300.0, minimum=1e-9)  # burstsched forgets idle flows as it counts
    return Translated(
        "policy",
        flow=FlowPart("fairness", fairness="program-aware", settings=settings),
        explain="flow_control.fairness program-aware: the flow with the least attained service (prompt + 2 x "
        f"output tokens, half-life {settings['half_life_s']:g} s) goes first, weights "
        f"{settings['weight_service']:g} service / {settings['weight_head_wait']:g} head wait",
    )


def _priority_holdback(name: str, p: Params) -> Translated:
    p.text("shape", "linear", choices=("linear",))
    domain = p.text("domain", "rank", choices=("rank", "value"))
    if not p.has("minCeiling"):
        p.issue("minCeiling", "required: the lowest priority's ceiling, in [0, 1)")
    low = p.number("minCeiling", 0.0, minimum=0.0, maximum=0.999999)
    high = p.number("maxCeiling", 1.0, minimum=1e-9, maximum=1.0)
    if low >= high:
        p.issue("minCeiling", f"must be below maxCeiling ({high:g}), got {low:g}")
    settings = {"policy": "priority-holdback", "min_ceiling": low, "max_ceiling": high, "domain": domain}
    return Translated(
        "policy",
        flow=FlowPart("usage-limit", settings=settings),
        explain=f"flow_control.ceilings priority-holdback: waiting bands dispatch up to {high:g} (highest) "
        f"down to {low:g} (lowest) of the pool's room, by {domain}",
    )


def _soft_reflective(name: str, p: Params) -> Translated:
    return Translated(
        "policy",
        flow=FlowPart("usage-limit", settings={"policy": "soft-reflective"}),
        explain="flow_control.ceilings soft-reflective: band i of N waiting dispatches below 1 - i x "
        "saturation / (N - 1) of the pool's room, past it on one pass in round(saturation / "
        "(1 - saturation))",
    )


def _probabilistic_admitter(name: str, p: Params) -> Translated:
    settings = {
        "queue_depth_threshold": p.integer("queueDepthThreshold", 5, minimum=1),
        "kv_usage_threshold": p.number("kvCacheUtilThreshold", 0.8, minimum=1e-9),
        "power": p.number("power", 5.0, minimum=1e-9),
        "k": p.number("k", 300.0, minimum=1e-9),
    }
    return Translated(
        "policy",
        flow=FlowPart("admitter", settings=settings),
        explain="flow_control.admitter: a request of priority below 0 (flow_control.objectives) is refused "
        f"with 429 before admission with probability min(saturation^{settings['power']:g} x "
        f"{settings['k']:g}, 1), "
        f"saturation the mean of max(waiting / {settings['queue_depth_threshold']}, KV usage / "
        f"{settings['kv_usage_threshold']:g}) over the healthy endpoints",
    )


def _ordering(explain: str) -> Translator:
    def translate(name: str, p: Params) -> Translated:
        return Translated("policy", flow=FlowPart("ordering"), explain=explain)

    return translate


def _unsupported(kind: Literal["fairness", "ordering", "usage-limit"], why: str) -> Translator:
    def translate(name: str, p: Params) -> Translated:
        p.accept_all()  # refused as a whole where flow control uses it; its parameters add nothing
        return Translated("policy", flow=FlowPart(kind, unsupported=why), explain=f"not supported: {why}")

    return translate


def _static_usage_limit(name: str, p: Params) -> Translated:
    threshold = p.number("threshold", 1.0, minimum=1e-9, maximum=1.0)
    return Translated(
        "policy",
        flow=FlowPart("usage-limit", threshold=threshold),
        explain=f"the saturation detector's thresholds times {threshold:g} (flow_control.headroom)",
    )


def _concurrency_detector(name: str, p: Params) -> Translated:
    mode = p.text("concurrencyMode", "requests")
    if mode != "requests":
        p.issue(
            "concurrencyMode",
            f"not supported: {mode!r}: burstsched bounds the requests in flight on an endpoint, not their "
            "tokens (use requests)",
        )
    limit = p.integer("maxConcurrency", 100, minimum=1)
    p.integer("maxTokenConcurrency", 1_000_000, minimum=1)  # tokens and hybrid modes only
    p.number("headroom", 0.0, minimum=0.0)  # the filter's burst allowance: burstsched has no such filter
    p.text("inFlightLoadProducerName", "")  # tokens mode's estimate
    return Translated(
        "detector",
        flow=FlowPart("detector", gate=lambda share: concurrency_limit(limit, share)),
        explain=f"flow control's gate: at most {limit} requests in flight per endpoint "
        "(flow_control.headroom.max_in_flight, per endpoint where llm-d sums the pool)",
    )


def _eviction(name: str, p: Params) -> Translated:
    return Translated(
        "policy",
        flow=FlowPart("eviction"),
        explain="nothing: used by llm-d's in-flight eviction only (flowControl.enableEviction)",
    )


_SLO_DEADLINE = (
    "ordering by each request's TTFT objective (x-llm-d-slo-ttft-ms) is not built in burstsched; it releases "
    "in arrival order within priority and fairness, warm prefixes first (fcfs-ordering-policy)"
)

FLOW_TRANSLATORS: dict[str, Translator] = {
    "round-robin-fairness-policy": _fairness(
        "round-robin", "flow_control.fairness round-robin: the flows released least go first"
    ),
    DEFAULT_FAIRNESS: _fairness(
        "strict", "flow_control.fairness strict: one order for the band, flows ignored"
    ),
    "program-aware-fairness": _program_aware,
    DEFAULT_ORDERING: _ordering(
        "arrival order within priority and fairness, where burstsched puts warm prefix groups first (a "
        "request passed over at most flow_control.max_reorder_ms)"
    ),
    "edf-ordering-policy": _ordering(
        "arrival order, as fcfs-ordering-policy: llm-d gives every request the one defaultRequestTTL, so "
        "its deadlines (arrival + TTL) keep arrival order"
    ),
    "slo-deadline-ordering-policy": _unsupported("ordering", _SLO_DEADLINE),
    DEFAULT_USAGE_LIMIT: _static_usage_limit,
    "priority-holdback-policy": _priority_holdback,
    "soft-reflective-ceiling-policy": _soft_reflective,
    "probabilistic-admitter": _probabilistic_admitter,
    "concurrency-detector": _concurrency_detector,
    "sheddable-eviction-filter": _eviction,
    "priority-then-time-eviction-order-policy": _eviction,
}
"""llm-d's flow-control plugin types → their translation (:data:`TRANSLATORS` has the others)."""


@dataclass(frozen=True)
class FlowPlugin:
    """A configured llm-d plugin, as the flowControl section sees it."""

    llmd_type: str
    translated: Translated


def gate_enabled(gates: object) -> bool:
    """Whether ``featureGates`` turns llm-d's flow control on (a bare name or ``=true``; off by default)."""
    if not isinstance(gates, list):
        return False
    on = False
    for gate in gates:
        if isinstance(gate, str):
            name, _, value = gate.partition("=")
            if name == FEATURE_GATE:
                on = value.lower() != "false"
    return on


_SETTINGS = (
    "maxBytes",
    "maxRequests",
    "defaultRequestTTL",
    "noEndpointRequestTTL",
    "defaultPriorityBand",
    "defaultNegativePriorityBand",
    "priorityBands",
    "usageLimitPolicyPluginRef",
    "enableEviction",
)


@dataclass(frozen=True)
class _Band:
    path: str
    priority: int | None
    max_requests: int | None
    max_bytes: int | None
    fairness: str
    ordering: str


def translate_flow_control(
    section: object,
    legacy_detector: object,
    gate: bool,
    plugins: Mapping[str, FlowPlugin],
    issues: list[ConfigIssue],
    notes: list[str],
    explain: list[str],
) -> dict[str, Any]:
    """``flowControl`` (and the deprecated top-level ``saturationDetector``) → ``flow_control``; with the gate
    off, ``{"enabled": False}``: llm-d holds no request in its queue then, so burstsched's queue (on by
    default) is turned off. Issues, notes and explain lines are appended."""
    p = Params(section, "flowControl", _SECTION, issues)
    max_bytes = p.quantity("maxBytes")
    max_requests = p.quantity("maxRequests")
    ttl_ms = p.duration_ms("defaultRequestTTL", _TTL_MS, positive=False)
    no_endpoint_ms = p.duration_ms("noEndpointRequestTTL", ttl_ms, positive=False)
    detector_ref = _detector_ref(p, legacy_detector, issues)
    templates = [
        _read_band(p.nested(key), f"flowControl.{key}", with_priority=False)
        for key in ("defaultPriorityBand", "defaultNegativePriorityBand")
        if p.has(key)
    ]
    bands = [
        _read_band(band, f"flowControl.priorityBands[{i}]", with_priority=True)
        for i, band in enumerate(p.entries("priorityBands"))
    ]
    usage_ref = p.text("usageLimitPolicyPluginRef", "") or DEFAULT_USAGE_LIMIT
    eviction = p.flag("enableEviction", False)
    settings = any(p.has(key) for key in _SETTINGS)
    p.finish()
    detector = _resolve(detector_ref, "detector", plugins, "flowControl.saturationDetector.pluginRef", issues)
    if not gate:
        if settings:
            notes.append(
                "flowControl: the flowControl feature gate is off, so llm-d ignores this section but its "
                "saturationDetector, and burstsched's flow_control is off"
            )
        explain.append("flow_control.enabled: false (the flowControl feature gate is off, as in llm-d)")
        return {"enabled": False}
    if eviction:
        issues.append(
            ConfigIssue(
                "flowControl.enableEviction",
                "not supported: in-flight eviction of sheddable requests is not built in burstsched",
            )
        )
    for key, value in (("defaultRequestTTL", ttl_ms), ("noEndpointRequestTTL", no_endpoint_ms)):
        if value == 0:
            issues.append(
                ConfigIssue(
                    f"flowControl.{key}",
                    "not supported: 0 (no limit on a request's wait): burstsched bounds every wait in its "
                    "queue (flow_control.ttl_ms, no_endpoint_wait_ms)",
                )
            )
            break
    out: dict[str, Any] = {"enabled": True, "ttl_ms": ttl_ms, "no_endpoint_wait_ms": no_endpoint_ms}
    if max_requests:
        out["max_requests"] = max_requests
    if max_bytes:
        out["max_bytes"] = max_bytes
    for template in templates:
        if template.max_requests or template.max_bytes:
            issues.append(
                ConfigIssue(
                    template.path,
                    "not supported: bounds for the priority bands not listed in priorityBands: burstsched "
                    "bounds each listed band and all bands together (flow_control.bands, max_requests)",
                )
            )
    out["bands"] = _bands(bands, issues, notes)
    fairness: dict[str, str] = {}  # policy → where it is first named (the path of a refusal)
    orderings: dict[str, str] = {}
    for band in [*templates, *bands]:
        if band.fairness or band.priority is not None:  # a listed band without one: llm-d's default
            fairness.setdefault(band.fairness or DEFAULT_FAIRNESS, f"{band.path}.fairnessPolicyRef")
        if band.ordering or band.priority is not None:
            orderings.setdefault(band.ordering or DEFAULT_ORDERING, f"{band.path}.orderingPolicyRef")
    unlisted_default = not any(t.fairness for t in templates)
    if not fairness:
        fairness[DEFAULT_FAIRNESS] = "flowControl"
    kinds, fairness_settings = _policies(fairness, "fairness", plugins, issues)
    _policies(orderings, "ordering", plugins, issues)
    if len(set(kinds.values())) > 1:
        used = ", ".join(f"{ref} ({where})" for ref, where in fairness.items())
        issues.append(
            ConfigIssue(
                "flowControl",
                f"not supported: priority bands with different fairness policies: {used}; burstsched has one "
                "fairness policy for every band",
            )
        )
    elif kinds:
        out["fairness"] = next(iter(kinds.values()))
        if out["fairness"] == "program-aware":
            out["program_aware"] = next(iter(fairness_settings.values()))
        if bands and unlisted_default and out["fairness"] != "strict":
            notes.append(
                f"flowControl: priorities not in priorityBands have llm-d's {DEFAULT_FAIRNESS}; burstsched's "
                f"one fairness policy ({out['fairness']}) applies to them too"
            )
    share = 1.0
    usage = _resolve(usage_ref, "usage-limit", plugins, "flowControl.usageLimitPolicyPluginRef", issues)
    if usage is not None and usage.flow is not None:
        share = usage.flow.threshold
        if usage.flow.settings is not None:
            out["ceilings"] = usage.flow.settings
    if detector is not None and detector.flow is not None and detector.flow.gate is not None:
        out["headroom"] = detector.flow.gate(share)
    explain += _explain(out, detector_ref, usage_ref, share)
    return out


def _detector_ref(p: Params, legacy: object, issues: list[ConfigIssue]) -> str:
    """``flowControl.saturationDetector.pluginRef``, else the deprecated top-level one, else the default."""
    section = p.nested("saturationDetector")
    ref = section.text("pluginRef", "")
    section.finish()
    if not ref and legacy is not None:
        if not isinstance(legacy, Mapping) or any(key != "pluginRef" for key in legacy):
            issues.append(ConfigIssue("saturationDetector", "expected {pluginRef: NAME}"))
        elif isinstance(legacy.get("pluginRef"), str):
            ref = legacy["pluginRef"]
    return ref or DEFAULT_DETECTOR


def _read_band(band: Params, path: str, *, with_priority: bool) -> _Band:
    priority = band.integer("priority", 0) if with_priority else None
    if with_priority and not band.has("priority"):
        band.issue("priority", "required: the band's priority")
    requests, size = band.quantity("maxRequests"), band.quantity("maxBytes")
    fairness = band.text("fairnessPolicyRef", "")
    ordering = band.text("orderingPolicyRef", "")
    band.finish()
    return _Band(path, priority, requests, size, fairness, ordering)


def _bands(bands: list[_Band], issues: list[ConfigIssue], notes: list[str]) -> dict[int, dict[str, int]]:
    """``priorityBands`` → ``flow_control.bands``, with llm-d's per-band defaults (every band is bounded)."""
    out: dict[int, dict[str, int]] = {}
    for band in bands:
        if band.priority is None:
            continue
        if band.priority in out:
            issues.append(ConfigIssue(f"{band.path}.priority", f"priority {band.priority} is listed twice"))
            continue
        out[band.priority] = {
            "max_requests": band.max_requests or _BAND_MAX_REQUESTS,
            "max_bytes": band.max_bytes or _BAND_MAX_BYTES,
        }
        if band.priority < 0:
            notes.append(
                f"{band.path}: priority {band.priority} is sheddable: while its endpoint has no room "
                "burstsched answers such a request 429 at once, where llm-d's queue holds it within the "
                "band's bounds"
            )
    return out


def _policies(
    refs: Mapping[str, str],
    kind: Literal["fairness", "ordering"],
    plugins: Mapping[str, FlowPlugin],
    issues: list[ConfigIssue],
) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """Each referenced policy's burstsched meaning (fairness: round-robin, strict or program-aware) and its
    settings where it has some; refusals, once each."""
    kinds: dict[str, str] = {}
    settings: dict[str, dict[str, Any]] = {}
    for ref, path in refs.items():
        translated = _resolve(ref, kind, plugins, path, issues)
        if translated is not None and translated.flow is not None and translated.flow.fairness is not None:
            kinds[ref] = translated.flow.fairness
            if translated.flow.settings is not None:
                settings[ref] = translated.flow.settings
    return kinds, settings


def translate_admitter(plugins: Mapping[str, FlowPlugin], issues: list[ConfigIssue]) -> dict[str, Any] | None:
    """The probabilistic admitter among the configured plugins → ``flow_control.admitter`` (llm-d runs its
    admitters whether or not the flowControl gate is on); None without one."""
    found = [(n, p) for n, p in plugins.items() if p.translated.flow and p.translated.flow.kind == "admitter"]
    if len(found) > 1:
        names = ", ".join(repr(n) for n, _ in found)
        issues.append(
            ConfigIssue(
                "plugins",
                f"not supported: more than one probabilistic admitter ({names}): burstsched has one",
            )
        )
    if not found:
        return None
    flow = found[0][1].translated.flow
    assert flow is not None
    return flow.settings


def _resolve(
    ref: str,
    kind: Literal["fairness", "ordering", "detector", "usage-limit"],
    plugins: Mapping[str, FlowPlugin],
    path: str,
    issues: list[ConfigIssue],
) -> Translated | None:
    """The plugin ``ref`` names (llm-d's default instance when none is configured under its type's name)."""
    plugin = plugins.get(ref)
    if plugin is None:
        default = _DEFAULTS.get(ref)
        if default is None or default[0] != kind:
            issues.append(ConfigIssue(path, f"unknown {_KIND_NAMES[kind]} {ref!r}"))
            return None
        return default[1]
    flow = plugin.translated.flow
    if flow is None or flow.kind != kind:
        issues.append(ConfigIssue(path, f"{plugin.llmd_type} {ref!r} is not a {_KIND_NAMES[kind]}"))
        return None
    if flow.unsupported:
        issues.append(ConfigIssue(path, f"{plugin.llmd_type} {ref!r}: not supported: {flow.unsupported}"))
        return None
    return plugin.translated


_KIND_NAMES = {
    "fairness": "fairness policy",
    "ordering": "ordering policy",
    "detector": "saturation detector",
    "usage-limit": "usage limit policy",
}
# The instances llm-d registers by itself when a config names none of their type.
_DEFAULTS: dict[str, tuple[str, Translated]] = {
    DEFAULT_DETECTOR: (
        "detector",
        Translated(
            "detector",
            flow=FlowPart("detector", gate=lambda share: utilization_limits(5, 0.8, 0.0, share)[1]),
        ),
    ),
    DEFAULT_FAIRNESS: ("fairness", Translated("policy", flow=FlowPart("fairness", fairness="strict"))),
    DEFAULT_ORDERING: ("ordering", Translated("policy", flow=FlowPart("ordering"))),
    DEFAULT_USAGE_LIMIT: ("usage-limit", Translated("policy", flow=FlowPart("usage-limit"))),
}


def _explain(out: Mapping[str, Any], detector: str, usage: str, share: float) -> list[str]:
    """What llm-d's flow control became, for ``burstsched check --explain``: one line per part."""
    gate = ", ".join(f"{k} {v:g}" for k, v in out.get("headroom", {}).items())
    scaled = f" x {share:g} ({usage})" if share != 1.0 else ""
    kept = "max_prefill_ms" + ("" if "max_kv_usage" in out.get("headroom", {}) else " and max_kv_usage")
    bands = ", ".join(
        f"{p}: {b['max_requests']} requests, {b['max_bytes']} bytes" for p, b in sorted(out["bands"].items())
    )
    return [
        "flowControl (featureGates: [flowControl]): flow_control.enabled: the router holds a request while "
        "its endpoint has no room",
        f"flowControl.saturationDetector {detector!r}{scaled}: flow_control.headroom {gate}, per endpoint "
        f"(llm-d gates on the saturation of the whole pool), with burstsched's own {kept} on top",
        f"flowControl fairness: flow_control.fairness {out.get('fairness', 'strict')}; ordering: arrival "
        "order within priority and fairness, except that warm prefix groups go first (a request is passed "
        "over at most flow_control.max_reorder_ms)",
        f"flowControl usage limit {usage!r}: "
        + (
            f"flow_control.ceilings {out['ceilings']['policy']}: a waiting band dispatches only while the "
            "share of the pool's room in use (burstsched's headroom, averaged over healthy endpoints) is "
            "below its ceiling, and holds every lower band"
            if "ceilings" in out
            else "one ceiling for every band (no per-priority ceilings)"
        ),
        f"flowControl TTLs: flow_control.ttl_ms {out['ttl_ms']:g}, no_endpoint_wait_ms "
        f"{out['no_endpoint_wait_ms']:g}; bands: {bands or 'none listed'}",
        "flowControl priorities: x-llm-d-inference-objective through flow_control.objectives (llm-d reads "
        "InferenceObjective resources, which an EndpointPickerConfig does not carry)",
    ]
