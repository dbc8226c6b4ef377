"""llm-d plugin types and their parameters, each translated to burstsched's plugin or config section.

=============================== ========================================================================
llm-d type                      burstsched
=============================== ========================================================================
approx-prefix-cache-producer    ``approx-prefix-producer`` (``lruCapacityPerServer`` → its
                                ``default_capacity_blocks``); ``blockSizeTokens`` and
                                ``maxPrefixTokensToMatch`` / ``maxPrefixBlocksToMatch`` → ``prefix_hashing``
precise-prefix-cache-producer   ``precise-prefix-producer``; ``kvEventsConfig`` → ``kv_events``
burst-prefix-cache-producer     burst admission (``admission``): ``windowDurationMs``, ``maxPerReplica``,
                                ``minColocateBlocks``
prefix-cache-scorer             ``prefix-cache-scorer``
queue-scorer                    ``queue-scorer``
kv-cache-utilization-scorer     ``kv-utilization-scorer``
max-score-picker                ``max-score-picker`` (round-robin among ties ≈ its ``least-recent``)
random-picker                   ``random-picker``
weighted-random-picker          ``weighted-random-picker``
utilization-detector            ``metricsStalenessThreshold`` → ``pool.staleness_threshold_ms``; listed in a
                                profile (as a filter): stale endpoints dropped (``health-filter`` with
                                ``drop_stale``) and ``saturation-filter`` at ``threshold × (1 + headroom)``;
                                with flow control on, ``flow_control.headroom`` at ``threshold``
single-profile-handler          nothing (burstsched runs one profile)
label-selector-filter           ``label-selector-filter`` (``matchLabels``, ``matchExpressions`` → its
                                ``match_labels``, ``match_expressions``); also its deprecated name
                                ``by-label-selector``
lora-affinity-scorer            ``lora-affinity-scorer`` (no parameters)
=============================== ========================================================================

Differences kept on purpose: burstsched hashes a prompt's bytes into pseudo-tokens of 4 bytes and uses
``blockSizeTokens`` as given (current llm-d raises block sizes under 64 to 64; the default here is 64);
burstsched always sizes each endpoint's index from the KV capacity the endpoint reports (llm-d's
``autoTune: true``), so ``autoTune: false`` is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from burstsched.config.admission import AdmissionConfig
from burstsched.config.kv_events import check_zmq_address
from burstsched.config.labels import check_label_key, check_label_value
from burstsched.config.llmd_params import Params
from burstsched.config.models import PluginSpec

Role = Literal[
    "producer",
    "burst",
    "filter",
    "scorer",
    "picker",
    "detector",
    "handler",
    "role-filter",
    "decider",
    "source",
    "extractor",
    "parser",
    "tokenizer",
    "policy",
    "nothing",
]
ROLE_LABEL = "llm-d.ai/role"

DEFAULT_BLOCK_TOKENS = 64  # llm-d's effective approximate block size (its floor)
_APPROX_MAX_TOKENS = 131072  # llm-d's default maxPrefixTokensToMatch
_APPROX_MAX_BLOCKS = 2048  # llm-d's default maxPrefixBlocksToMatch
_LRU_CAPACITY = 31250
_SPECULATIVE_TTL_MS = 2000.0
_SOCKET_PORT = 5557
_TOKEN_THRESHOLD = 4194304  # llm-d's token-load-scorer default (128 requests of 32K tokens)


@dataclass(frozen=True)
class FlowPart:
    """What a flow-control plugin means for burstsched's ``flow_control`` (:mod:`.llmd_flow` reads it)."""

    kind: Literal["fairness", "ordering", "detector", "usage-limit", "eviction", "admitter"]
    fairness: Literal["round-robin", "strict", "program-aware"] | None = None
    gate: Callable[[float], dict[str, Any]] | None = (
        None  # a detector: flow_control.headroom at a usage limit
    )
    threshold: float = 1.0  # a static usage limit: the share of the detector's capacity dispatch may use
    unsupported: str = ""  # why burstsched cannot honour it (refused where flow control uses it)
    settings: dict[str, Any] | None = None  # its flow_control sub-section (program_aware, ceilings, admitter)


@dataclass
class Translated:
    """What one llm-d plugin becomes."""

    role: Role
    spec: PluginSpec | None = None
    prefix_hashing: dict[str, int] = field(default_factory=dict)
    admission: dict[str, Any] | None = None
    kv_events: dict[str, Any] | None = None
    staleness_ms: float | None = None
    saturation: dict[str, Any] | None = None
    producer_ref: str | None = None
    explain: str = ""  # what it became, when it became no burstsched plugin
    tokenizer: dict[str, Any] | None = None
    stage: str | None = None  # role filters: the llm-d.ai/role stage they keep (decode, prefill, encode)
    handler: dict[str, str] | None = None  # profile handlers: profile names and decider plugin names
    scorer_spec: PluginSpec | None = None  # a producer that is also a scorer (precise-prefix-cache-scorer)
    flow: FlowPart | None = None  # flow-control plugins: policies and saturation detectors


Translator = Callable[[str, Params], Translated]


def _prefix_cap(p: Params, block_tokens: int, default_tokens: int, default_blocks: int) -> int | None:
    """``maxPrefixTokensToMatch`` (tokens, wins when > 0) or ``maxPrefixBlocksToMatch``, in blocks."""
    tokens = p.integer("maxPrefixTokensToMatch", default_tokens, minimum=0)
    blocks = p.integer("maxPrefixBlocksToMatch", default_blocks, minimum=0)
    if tokens > 0:
        if tokens < block_tokens:
            p.issue("maxPrefixTokensToMatch", f"must be at least one block ({block_tokens} tokens)")
            return None
        return tokens // block_tokens
    if blocks == 0:
        p.issue(
            "maxPrefixBlocksToMatch",
            "not supported: 0 turns prefix matching off; burstsched matches at least one block (leave the "
            "producer out instead)",
        )
        return None
    return blocks


def _approx_producer(name: str, p: Params) -> Translated:
    auto_tune = p.flag("autoTune", True)
    p.refuse("blockSize", "the character-based block size is deprecated in llm-d; use blockSizeTokens")
    block_tokens = p.integer("blockSizeTokens", DEFAULT_BLOCK_TOKENS, minimum=1, maximum=4096)
    max_blocks = _prefix_cap(p, block_tokens, _APPROX_MAX_TOKENS, _APPROX_MAX_BLOCKS)
    capacity = p.integer("lruCapacityPerServer", _LRU_CAPACITY, minimum=1)
    hashing = {"block_tokens": block_tokens}
    if max_blocks is not None:
        hashing["max_blocks"] = max_blocks
    parameters: dict[str, Any] = {"default_capacity_blocks": capacity}
    if not auto_tune:  # lruCapacityPerServer always, as llm-d does
        parameters["capacity_from_endpoint"] = False
    spec = PluginSpec(type="approx-prefix-producer", name=name, parameters=parameters)
    return Translated("producer", spec, prefix_hashing=hashing)


def _precise_producer(name: str, p: Params) -> Translated:
    p.refuse("sessionManager", "burstsched has no session-manager lookup")
    p.refuse("redisConfig", "burstsched keeps its index in memory")
    tokens = p.nested("tokenProcessorConfig")
    block_size: int | None = None
    for key in ("blockSizeTokens", "blockSize"):
        if tokens.has(key):
            block_size = tokens.integer(key, 0, minimum=1)
    tokens.accept("hashSeed")  # burstsched rehashes token ids with its own chain: the seed changes nothing
    tokens.finish()
    speculative = p.flag("speculativeIndexing", False)
    ttl_ms = p.duration_ms("speculativeTTL", _SPECULATIVE_TTL_MS)
    indexer = p.nested("indexerConfig")
    block_index = indexer.nested("kvBlockIndexConfig")
    block_index.accept("enableMetrics", "metricsLoggingInterval")  # burstsched's index metrics are always on
    block_index.finish()
    # llm-d's own tokenization pool (a UDS sidecar or local files): burstsched tokenizes through its tokenizer
    tokenizers = indexer.has("tokenizersPoolConfig")
    indexer.accept("tokenizersPoolConfig")
    indexer.finish()
    events = p.nested("kvEventsConfig")
    events.text("engineType", "vllm", choices=("vllm",))
    topic = events.text("topicFilter", "")
    central = events.text("zmqEndpoint", "")
    if central:
        check = _zmq_address_issue(central)
        if check:
            events.issue("zmqEndpoint", check)
    discover = events.flag("discoverPods", True)  # llm-d's default
    if not discover and not central:
        events.issue(
            "discoverPods",
            "must be true unless zmqEndpoint is set: with neither, llm-d follows no replica's events",
        )
    discovery = events.nested("podDiscoveryConfig")
    port = discovery.integer("socketPort", _SOCKET_PORT, minimum=1, maximum=65535)
    discovery.finish()
    events.accept("concurrency")  # a worker count: burstsched reads events on its own loop
    events.finish()
    explain = ""
    kv_events: dict[str, Any]
    if central:
        kv_events = {"bind": central, "topic": topic}
        explain = (
            f"central mode: binds {central} for the replicas' publishers (vLLM's kv-events endpoint "
            "tcp://<router>:<port>, topic kv@<pod-ip>:<port>@<model>)"
        )
        if discover:
            explain += (
                "; llm-d also dials each pod's socketPort (discoverPods), where a replica publishing to a "
                "central socket binds nothing: burstsched does not"
            )
    else:
        kv_events = {"endpoint_template": f"tcp://{{host}}:{port}", "topic": topic}
    parameters: dict[str, Any] = {"speculative_ttl_ms": ttl_ms if speculative else 0.0}
    if block_size is not None:
        parameters["block_size"] = block_size
    spec = PluginSpec(type="precise-prefix-producer", name=name, parameters=parameters)
    tokenizer = {"source": "remote"} if tokenizers else None
    return Translated("producer", spec, kv_events=kv_events, tokenizer=tokenizer, explain=explain)


def _zmq_address_issue(address: str) -> str:
    try:
        check_zmq_address(address)
    except ValueError as exc:
        return str(exc)
    return ""


def _precise_scorer(name: str, p: Params) -> Translated:
    """The deprecated combined type: a precise producer and a prefix-cache scorer reading it."""
    producer = _precise_producer(
        "precise-prefix-producer" if name == "prefix-cache-scorer" else f"{name}-producer", p
    )
    producer.scorer_spec = PluginSpec(type="prefix-cache-scorer", name=name)
    return producer


def _burst_producer(name: str, p: Params) -> Translated:
    defaults = AdmissionConfig()
    window_ms = p.number("windowDurationMs", 100.0, minimum=1e-3, maximum=1000.0)
    per_replica = p.integer("maxPerReplica", -1, minimum=-1)
    if per_replica == 0:
        p.issue("maxPerReplica", "must be -1 (unlimited) or at least 1, got 0")
    block_tokens = p.integer("blockSizeTokens", DEFAULT_BLOCK_TOKENS, minimum=1, maximum=4096)
    max_tokens = p.integer("maxPrefixTokensToMatch", 0, minimum=0)
    # 0 (llm-d's default) groups only the samples of one prompt; burstsched's groups need at least one
    # shared leading block, which every sample of one prompt has.
    shared = p.integer("minColocateBlocks", 0, minimum=0)
    hashing = {"block_tokens": block_tokens}
    if max_tokens > 0:
        if max_tokens < block_tokens:
            p.issue("maxPrefixTokensToMatch", f"must be 0 or at least one block ({block_tokens} tokens)")
        else:
            hashing["max_blocks"] = max_tokens // block_tokens
    admission = {
        "enabled": True,
        "window_ms": window_ms,
        "max_per_endpoint": defaults.max_batch if per_replica < 1 else per_replica,
        "min_shared_blocks": max(1, shared),
    }
    return Translated("burst", prefix_hashing=hashing, admission=admission)


def _prefix_scorer(name: str, p: Params) -> Translated:
    for legacy in ("hashBlockSize", "maxPrefixBlocksToMatch", "lruCapacityPerServer"):
        p.refuse(legacy, "a prefix-cache producer's parameter: set it on approx-prefix-cache-producer")
    if p.number("prefixLengthWeight", 0.0, minimum=0.0, maximum=1.0) != 0.0:
        p.issue(
            "prefixLengthWeight", "not supported: burstsched scores the matched share of the prompt only (0)"
        )
    p.integer("maxModelLen", 8192, minimum=1)  # used by llm-d only with a prefixLengthWeight above 0
    ref = p.text("prefixMatchInfoProducerName", "") or None
    spec = PluginSpec(type="prefix-cache-scorer", name=name)
    return Translated("scorer", spec, producer_ref=ref)


def _plain(role: Role, burstsched_type: str) -> Translator:
    def translate(name: str, p: Params) -> Translated:
        return Translated(role, PluginSpec(type=burstsched_type, name=name))

    return translate


def _picker(burstsched_type: str) -> Translator:
    def translate(name: str, p: Params) -> Translated:
        if p.integer("maxNumOfEndpoints", 1) > 1:
            p.issue(
                "maxNumOfEndpoints",
                "not supported above 1: burstsched sends a request to one endpoint and fails over in the "
                "picker's order (dispatch.max_attempts)",
            )
        return Translated("picker", PluginSpec(type=burstsched_type, name=name))

    return translate


def _utilization_detector(name: str, p: Params) -> Translated:
    queue = p.integer("queueDepthThreshold", 5, minimum=1)
    kv = p.number("kvCacheUtilThreshold", 0.8, minimum=1e-9, maximum=1.0)
    headroom = p.number("headroom", 0.0, minimum=0.0)
    staleness_ms = p.duration_ms("metricsStalenessThreshold", 200.0)
    p.text("stalenessPolicy", "saturated", choices=("saturated",))
    p.refuse("inFlightLoadProducerName", "burstsched has no in-flight load producer")
    saturation, _ = utilization_limits(queue, kv, headroom)
    spec = PluginSpec(type="saturation-filter", name=name, parameters=saturation)
    flow = FlowPart("detector", gate=lambda share: utilization_limits(queue, kv, headroom, share)[1])
    return Translated("detector", spec, staleness_ms=staleness_ms, saturation=saturation, flow=flow)


def utilization_limits(
    queue: int, kv: float, headroom: float = 0.0, share: float = 1.0
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A utilization-detector's two tiers, as llm-d defines them, in burstsched's terms (the one place).

    As a scheduling filter llm-d keeps an endpoint while waiting < queue x (1 + headroom) and KV usage <
    kv x (1 + headroom): the ``saturation-filter`` (``saturation:``) drops one at waiting >= max_waiting or
    KV usage >= max_kv_usage. As flow control's gate an endpoint is full at max(waiting / queue,
    KV / kv) >= ``share`` (the usage limit, 1 by default), without the headroom: ``flow_control.headroom``
    closes an endpoint while waiting > max_waiting or KV usage >= max_kv_usage.
    """
    saturation = {
        "max_waiting": max(1, math.ceil(queue * (1.0 + headroom) - 1e-9)),
        "max_kv_usage": min(1.0, kv * (1.0 + headroom)),
    }
    gate = {"max_waiting": max(0, math.ceil(queue * share - 1e-9) - 1), "max_kv_usage": kv * share}
    return saturation, gate


def concurrency_limit(max_concurrency: int, share: float = 1.0) -> dict[str, Any]:
    """A concurrency-detector's gate (requests mode): full at in-flight / maxConcurrency >= ``share``, i.e.
    ``flow_control.headroom.max_in_flight`` (room while fewer are in flight)."""
    return {"max_in_flight": max(1, math.ceil(max_concurrency * share - 1e-9))}


def _role_filter(stage: str) -> Translator:
    def translate(name: str, p: Params) -> Translated:
        return Translated("role-filter", stage=stage)

    return translate


def _disagg_handler(name: str, p: Params) -> Translated:
    profiles = p.nested("profiles")
    handler = {stage: profiles.text(stage, stage, choices=None) for stage in ("decode", "prefill", "encode")}
    profiles.finish()
    deciders = p.nested("deciders")
    for stage in ("prefill", "encode"):
        decider = deciders.text(stage, "")
        if decider:
            handler[f"{stage}_decider"] = decider
    deciders.finish()
    legacy = p.text("deciderPluginName", "")  # the deprecated pd-profile-handler's spelling
    if legacy:
        handler.setdefault("prefill_decider", legacy)
    p.text("stageOrder", "decode-first", choices=("decode-first", "prefill-first"))
    return Translated("handler", handler=handler)


def _single_handler(name: str, p: Params) -> Translated:
    return Translated("handler", handler={})


def _decider(name: str, p: Params) -> Translated:
    p.integer("nonCachedTokens", 0, minimum=0)
    return Translated(
        "decider", explain="a disaggregation decider: never asked, no endpoint has a prefill role"
    )


def _metrics_source(name: str, p: Params) -> Translated:
    p.text("scheme", "http", choices=("http", "https"))
    p.text("path", "/metrics", choices=("/metrics",))
    p.flag("insecureSkipVerify", True)
    return Translated(
        "source",
        explain="nothing: burstsched scrapes each replica's /metrics itself (pool.scrape_interval_ms)",
    )


def _metrics_extractor(name: str, p: Params) -> Translated:
    p.text("defaultEngine", "vllm", choices=("vllm",))
    return Translated(
        "extractor", explain="nothing: burstsched reads vLLM's queue and KV-cache metrics from each scrape"
    )


def _notification_source(name: str, p: Params) -> Translated:
    return Translated(
        "source",
        explain="nothing: burstsched tells its precise index of each endpoint joining and leaving itself",
    )


def _parser(name: str, p: Params) -> Translated:
    return Translated(
        "parser", explain="nothing: burstsched parses OpenAI chat and completions requests itself"
    )


def _passthrough_parser(name: str, p: Params) -> Translated:
    return Translated(
        "parser",
        explain="nothing: burstsched parses OpenAI chat and completions requests itself and refuses another "
        "body (400), where llm-d's passthrough routes any body by its load-based scorers",
    )


def _token_producer(name: str, p: Params) -> Translated:
    p.text("modelName", "")
    vllm = p.nested("vllm")
    vllm.text("url", "http://localhost:8000")
    timeout_ms = vllm.duration_ms("timeout", 5000.0)
    vllm.duration_ms("mmTimeout", 30000.0)
    vllm.finish()
    uds = p.nested("udsTokenizerConfig")
    uds.text("socketFile", "")
    uds.finish()
    p.refuse("estimate", "burstsched routes text prompts; multimodal token estimates have no equivalent")
    where = "the UDS tokenizer sidecar" if p.has("udsTokenizerConfig") else "vllm.url"
    return Translated(
        "tokenizer",
        tokenizer={"source": "remote", "timeout_ms": timeout_ms},
        explain=f"burstsched's tokenizer (tokenizer.source remote: each replica's /tokenize, not {where})",
    )


def _no_hit_lru(name: str, p: Params) -> Translated:
    p.text("prefixPluginType", "prefix-cache-scorer")
    p.text("prefixPluginName", "prefix-cache-scorer")
    p.text("prefixMatchInfoProducerName", "")
    size = p.integer("lruSize", 1024, minimum=1)
    return Translated(
        "scorer", PluginSpec(type="no-hit-lru-scorer", name=name, parameters={"lru_size": size})
    )


def _active_request(name: str, p: Params) -> Translated:
    idle = p.integer("idleThreshold", 0, minimum=0)
    busy = p.number("maxBusyScore", 1.0, minimum=0.0, maximum=1.0)
    p.accept("requestTimeout")  # deprecated and ignored by llm-d too
    parameters = {"idle_threshold": idle, "max_busy_score": busy}
    return Translated("scorer", PluginSpec(type="active-request-scorer", name=name, parameters=parameters))


def _load_aware(name: str, p: Params) -> Translated:
    threshold = p.integer("threshold", 128)
    if threshold <= 0:  # llm-d replaces a non-positive threshold with its default
        threshold = 128
    spec = PluginSpec(type="load-aware-scorer", name=name, parameters={"threshold": threshold})
    return Translated("scorer", spec)


def _inflight_load(name: str, p: Params) -> Translated:
    if p.flag("addEstimatedOutputTokens", False):
        p.issue(
            "addEstimatedOutputTokens",
            "not supported: true; burstsched's in-flight load is the prompt tokens still to compute (its "
            "prefill ledger), with no estimate of the output",
        )
    p.number("outputRatio", 1.5, minimum=0.0)
    p.integer("maxEstimatedOutputTokens", 0, minimum=0)
    return Translated(
        "nothing",
        explain="nothing: burstsched counts each endpoint's in-flight prompt tokens itself (the uncached "
        "prefill of the requests it sent there, until their first token)",
    )


def _token_load(name: str, p: Params) -> Translated:
    threshold = p.integer("queueThresholdTokens", _TOKEN_THRESHOLD)
    if threshold <= 0:  # llm-d replaces a non-positive threshold with its default
        threshold = _TOKEN_THRESHOLD
    p.text("inFlightLoadProducerName", "")
    spec = PluginSpec(type="token-load-scorer", name=name, parameters={"queue_threshold_tokens": threshold})
    return Translated("scorer", spec)


def _prefix_affinity(name: str, p: Params) -> Translated:
    threshold = p.number("affinityThreshold", 0.8, maximum=1.0)
    explore = p.number("explorationProbability", 0.0, minimum=0.0, maximum=1.0)
    penalty = p.number("maxTTFTPenaltyMs", 18000.0, minimum=0.0)
    if p.text("ttftSource", "prefillThroughput") != "prefillThroughput":
        p.issue("ttftSource", "not supported yet: llm-d's latency predictor is not built in burstsched")
    throughput = p.number("peakPrefillThroughput", 15928.0, minimum=0.0)
    if throughput == 0.0:
        if penalty > 0:
            p.issue("peakPrefillThroughput", "must be above 0 when maxTTFTPenaltyMs is above 0")
        throughput = 15928.0  # unused: the load gate is off
    ref = p.text("prefixMatchInfoProducerName", "") or None
    p.text("inFlightLoadProducerName", "")
    p.refuse("latencyPredictionInfoProducerName", "burstsched has no latency predictor")
    token_penalty = p.integer("maxTokensInFlightPenalty", 0, minimum=0)  # an earlier llm-d's load gate
    parameters = {
        "max_tokens_in_flight_penalty": token_penalty,
        "affinity_threshold": threshold,
        "exploration_probability": explore,
        "max_ttft_penalty_ms": penalty,
        "peak_prefill_throughput": throughput,
    }
    spec = PluginSpec(type="prefix-cache-affinity-filter", name=name, parameters=parameters)
    return Translated("filter", spec, producer_ref=ref)


def _session_affinity(burstsched_type: str) -> Translator:
    def translate(name: str, p: Params) -> Translated:
        strategy = p.text(
            "strategy", "encoded_endpoint_header", choices=("encoded_endpoint_header", "session_id")
        )
        if p.text("profileName", ""):
            p.issue(
                "profileName", "not supported: burstsched pins the endpoint of the one profile it routes by"
            )
        encoded = p.nested("encodedEndpointHeaderConfig")
        header = encoded.text("header", "") or "x-session-token"
        encoded.finish()
        ids = p.nested("sessionIdConfig")
        sources: list[str] = []
        for source in ids.entries("sources"):
            sources.append(source.text("header", ""))
            source.refuse("attribute", "burstsched reads the session id from request headers only")
            source.refuse("producer", "burstsched reads the session id from request headers only")
            source.finish()
        ttl = ids.number("evictionTtlSeconds", 300.0, minimum=0.0) or 300.0
        ids.number("evictionSweepSeconds", 10.0, minimum=0.0)  # burstsched drops an expired binding when read
        ids.finish()
        parameters: dict[str, Any] = {"strategy": strategy}
        if strategy == "encoded_endpoint_header":
            parameters["header"] = header.strip().lower()
        else:
            parameters["session_headers"] = [h.strip().lower() for h in sources if h.strip()] or [
                "x-session-id"
            ]
            parameters["eviction_ttl_s"] = ttl
        role: Role = "scorer" if burstsched_type.endswith("scorer") else "filter"
        return Translated(role, PluginSpec(type=burstsched_type, name=name, parameters=parameters))

    return translate


_LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def _label_selector(name: str, p: Params) -> Translated:
    """A Kubernetes ``LabelSelector`` (``matchLabels``, ``matchExpressions``), as llm-d decodes it."""
    labels = p.string_map("matchLabels")
    for label, value in labels.items():
        problem = _label_issue(label, value)
        if problem:
            p.issue(f"matchLabels.{label}", problem)
    parameters: dict[str, Any] = {"match_labels": labels}
    expressions: list[dict[str, Any]] = []
    for entry in p.entries("matchExpressions"):
        key = entry.text("key", "")
        if not key:
            entry.issue("key", "required: the label key")
        elif problem := _label_issue(key, ""):
            entry.issue("key", problem)
        operator = entry.text("operator", "", choices=_LABEL_OPERATORS)
        if not operator and not entry.has("operator"):
            entry.issue("operator", f"required: one of {', '.join(_LABEL_OPERATORS)}")
        values = entry.strings("values")
        for i, value in enumerate(values):
            if problem := _label_issue("", value):
                entry.issue(f"values[{i}]", problem)
        if operator in ("In", "NotIn") and not values:
            entry.issue("values", f"must list at least one value for {operator}")
        elif operator in ("Exists", "DoesNotExist") and values:
            entry.issue("values", f"must be empty for {operator}")
        entry.finish()
        expressions.append({"key": key, "operator": operator or "Exists", "values": values})
    parameters["match_expressions"] = expressions
    return Translated(
        "filter",
        PluginSpec(type="label-selector-filter", name=name, parameters=parameters),
        explain="when no endpoint matches, burstsched keeps them all (its filters fail open), where llm-d "
        "has no endpoint for the request; endpoints found through EndpointSlices carry no labels",
    )


def _label_issue(key: str, value: str) -> str:
    """Why ``key`` (when given) or ``value`` is no Kubernetes label key or value; empty when both are."""
    try:
        if key:
            check_label_key(key)
        check_label_value(value)
    except ValueError as exc:
        return str(exc)
    return ""


def _lora_affinity(name: str, p: Params) -> Translated:
    return Translated(
        "scorer",
        PluginSpec(type="lora-affinity-scorer", name=name),
        explain="reads each replica's vllm:lora_requests_info from burstsched's own scrape",
    )


def _data_parallel_handler(name: str, p: Params) -> Translated:
    p.integer("primaryPort", 8000, minimum=1, maximum=65535)
    return Translated(
        "handler",
        handler={},
        explain="nothing: llm-d's deprecated data-parallel handler is its single-profile-handler plus a port "
        "rewrite; burstsched sends each request to the picked endpoint's own URL (list each data-parallel "
        "rank's address as an endpoint), without the X-Data-Parallel-Endpoint header",
    )


def _nothing_because(role: Role, why: str) -> Translator:
    def translate(name: str, p: Params) -> Translated:
        return Translated(role, explain=why)

    return translate


TRANSLATORS: dict[str, Translator] = {
    "approx-prefix-cache-producer": _approx_producer,
    "precise-prefix-cache-producer": _precise_producer,
    "burst-prefix-cache-producer": _burst_producer,
    "prefix-cache-scorer": _prefix_scorer,
    "queue-scorer": _plain("scorer", "queue-scorer"),
    "kv-cache-utilization-scorer": _plain("scorer", "kv-utilization-scorer"),
    "max-score-picker": _picker("max-score-picker"),
    "random-picker": _picker("random-picker"),
    "weighted-random-picker": _picker("weighted-random-picker"),
    "utilization-detector": _utilization_detector,
    "single-profile-handler": _single_handler,
    "disagg-profile-handler": _disagg_handler,
    "decode-filter": _role_filter("decode"),
    "prefill-filter": _role_filter("prefill"),
    "encode-filter": _role_filter("encode"),
    "prefix-based-pd-decider": _decider,
    "always-disagg-pd-decider": _decider,
    "always-disagg-multimodal-decider": _decider,
    "disagg-headers-handler": _nothing_because(
        "nothing", "nothing: it sets the prefill header of a disaggregated request; none is disaggregated"
    ),
    "metrics-data-source": _metrics_source,
    "core-metrics-extractor": _metrics_extractor,
    "endpoint-notification-source": _notification_source,
    "openai-parser": _parser,
    "vllmhttp-parser": _parser,
    "token-producer": _token_producer,
    "tokenizer": _token_producer,
    "no-hit-lru-scorer": _no_hit_lru,
    "active-request-scorer": _active_request,
    "load-aware-scorer": _load_aware,
    "inflight-load-producer": _inflight_load,
    "token-load-scorer": _token_load,
    "prefix-cache-affinity-filter": _prefix_affinity,
    "session-affinity-scorer": _session_affinity("session-affinity-scorer"),
    "session-affinity-filter": _session_affinity("session-affinity-filter"),
    "passthrough-parser": _passthrough_parser,
    "precise-prefix-cache-scorer": _precise_scorer,
    "data-parallel-profile-handler": _data_parallel_handler,
    "label-selector-filter": _label_selector,
    "by-label-selector": _label_selector,  # llm-d's deprecated name for it
    "lora-affinity-scorer": _lora_affinity,
    "header-based-testing-filter": _plain("filter", "header-based-testing-filter"),  # GIE's conformance
}
"""llm-d plugin type → its translation."""

BURSTSCHED_TYPES: dict[str, str] = {
    "approx-prefix-cache-producer": "approx-prefix-producer",
    "precise-prefix-cache-producer": "precise-prefix-producer",
    "prefix-cache-scorer": "prefix-cache-scorer",
    "queue-scorer": "queue-scorer",
    "kv-cache-utilization-scorer": "kv-utilization-scorer",
    "max-score-picker": "max-score-picker",
    "random-picker": "random-picker",
    "weighted-random-picker": "weighted-random-picker",
    "utilization-detector": "saturation-filter",
    "no-hit-lru-scorer": "no-hit-lru-scorer",
    "active-request-scorer": "active-request-scorer",
    "load-aware-scorer": "load-aware-scorer",
    "token-load-scorer": "token-load-scorer",
    "prefix-cache-affinity-filter": "prefix-cache-affinity-filter",
    "session-affinity-scorer": "session-affinity-scorer",
    "session-affinity-filter": "session-affinity-filter",
    "precise-prefix-cache-scorer": "prefix-cache-scorer",
    "label-selector-filter": "label-selector-filter",
    "by-label-selector": "label-selector-filter",
    "lora-affinity-scorer": "lora-affinity-scorer",
    "header-based-testing-filter": "header-based-testing-filter",
}
"""llm-d plugin type → the burstsched plugin type it becomes (types that become a plugin only)."""
