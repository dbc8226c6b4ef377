"""The router's configuration, as strict pydantic models (unknown fields are errors).

``RouterConfig()`` with no arguments is the recommended configuration (``config/default.yaml``) minus the
endpoints, which a config file or the command line supplies.
"""

from __future__ import annotations

from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from burstsched.config.admission import AdmissionConfig
from burstsched.config.flow_control import FlowControlConfig
from burstsched.config.kv_events import KVEventsConfig, check_zmq_address
from burstsched.config.labels import check_label_key, check_label_value
from burstsched.config.prewarm import PrewarmConfig
from burstsched.config.saturation import SaturationConfig
from burstsched.config.tokenizer import TokenizerConfig


class StrictModel(BaseModel):
    """Base of the config models: unknown fields refused, no type coercion, immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class EndpointConfig(StrictModel):
    """One replica: its base URL (``http://host:port``) and an optional name (default ``host:port``)."""

    url: str = Field(description="Base URL of a vLLM-compatible replica, e.g. http://127.0.0.1:8001.")
    name: str | None = Field(
        default=None,
        min_length=1,
        description="Name used in metrics and in the x-burstsched-endpoint header (default host:port).",
    )

    kv_events: str | None = Field(
        default=None,
        description="Where this replica publishes its KV-cache events (ZMQ, e.g. tcp://10.0.0.5:5557); "
        "overrides kv_events.endpoint_template.",
    )
    kv_events_replay: str | None = Field(
        default=None,
        description="This replica's KV-event replay address (ZMQ ROUTER, e.g. tcp://10.0.0.5:5558); "
        "overrides kv_events.replay_template.",
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="The replica's labels, as a pod's Kubernetes labels (read by label-selector-filter); "
        "Kubernetes discovery of pods fills them in from each pod.",
    )

    @field_validator("labels")
    @classmethod
    def _check_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            check_label_key(key)
            check_label_value(value)
        return labels

    @field_validator("kv_events", "kv_events_replay")
    @classmethod
    def _check_events_address(cls, value: str | None) -> str | None:
        return check_zmq_address(value)

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        try:
            url = httpx.URL(value)
        except httpx.InvalidURL as exc:
            raise ValueError(f"not a URL: {exc}") from exc
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError("must be an http:// or https:// URL with a host")
        if url.query or url.fragment:
            raise ValueError("must not carry a query or fragment")
        return value.rstrip("/")

    @property
    def endpoint_name(self) -> str:
        if self.name is not None:
            return self.name
        url = httpx.URL(self.url)
        return f"{url.host}:{url.port}" if url.port is not None else url.host


class PoolSelectorConfig(StrictModel):
    """The replicas as a Kubernetes label selector (an InferencePool's), for discovery.

    Recorded only: discovery by selector is not implemented yet, so the endpoints must still be listed
    (``endpoints`` or ``--endpoint``).
    """

    match_labels: dict[str, str] = Field(
        min_length=1, description="Labels every replica pod carries, e.g. {app: vllm-llama3}."
    )
    target_port: int = Field(default=8000, ge=1, le=65535, description="The replicas' HTTP port.")
    namespace: str | None = Field(default=None, min_length=1, description="Namespace of the pods.")


class PoolConfig(StrictModel):
    """How the endpoint pool watches the replicas."""

    selector: PoolSelectorConfig | None = Field(
        default=None,
        description="Label selector of the replicas (an llm-d InferencePool's): with no endpoints listed, "
        "the router discovers the pods with these labels through the Kubernetes API.",
    )

    scrape_interval_ms: float = Field(
        default=1000.0,
        gt=0,
        description="Period of each replica's /metrics scrape. Between scrapes the router's own counts "
        "(in-flight requests, queued prefill, the window's placements) carry the load. vLLM renders its "
        "whole page (about 50 KB) on the API server's event loop for every scrape, 6-12 ms of its CPU "
        "each: llm-d's 50 ms period costs a replica about an eighth of a core and slows its requests.",
    )
    staleness_threshold_ms: float = Field(
        default=2500.0,
        gt=0,
        description="An endpoint with no successful scrape for this long is stale: its queue and KV figures "
        "are ignored and scoring falls back to the router's own in-flight counts. Keep it above "
        "scrape_interval_ms, or the figures are ignored between scrapes.",
    )
    scrape_timeout_ms: float = Field(default=1000.0, gt=0, description="Timeout of one /metrics scrape.")
    health_check_interval_ms: float = Field(
        default=1000.0, gt=0, description="Period of each replica's /health and /v1/models check."
    )
    health_check_timeout_ms: float = Field(default=1000.0, gt=0, description="Timeout of one health check.")
    failed_checks_before_down: int = Field(
        default=2,
        ge=1,
        description="Consecutive failed health checks (timeouts, non-200 answers) that mark an endpoint "
        "unhealthy; a refused connection marks it unhealthy at once. An unhealthy endpoint leaves scheduling "
        "and its prefix-index entries are dropped.",
    )


class DiscoveryConfig(StrictModel):
    """Where the endpoints come from: the static list (``endpoints``), a DNS name re-resolved on an interval
    (a headless Service), or the Kubernetes API (a Service's EndpointSlices, or Pods by label selector).

    Discovered endpoints join unhealthy and take traffic after their first successful health check and
    scrape; leaving ones drain (no new requests, in-flight ones finish) before they go.
    """

    kind: Literal["static", "dns", "kubernetes"] = Field(
        default="static",
        description="static: the endpoints list; dns: resolve host; kubernetes: watch the API.",
    )
    interval_ms: float = Field(default=5000.0, gt=0, description="dns: period of the re-resolution of host.")
    host: str | None = Field(
        default=None, min_length=1, description="dns: the name to resolve (A/AAAA), e.g. a headless Service."
    )
    port: int = Field(default=8000, ge=1, le=65535, description="The replicas' HTTP port (dns, kubernetes).")
    scheme: Literal["http", "https"] = Field(default="http", description="The replicas' URL scheme.")
    namespace: str | None = Field(
        default=None,
        min_length=1,
        description="kubernetes: the namespace to watch (default: the pod's own, else 'default').",
    )
    service: str | None = Field(
        default=None,
        min_length=1,
        description="kubernetes: watch this Service's EndpointSlices (label kubernetes.io/service-name).",
    )
    selector: dict[str, str] | None = Field(
        default=None, description="kubernetes: watch the Pods with these labels (instead of a service)."
    )
    api_url: str | None = Field(
        default=None,
        description="kubernetes: the API server's URL; default: in-cluster config in a pod, else kubeconfig.",
    )
    kubeconfig: str | None = Field(
        default=None, description="kubernetes: a kubeconfig file (default: KUBECONFIG or ~/.kube/config)."
    )
    watch_timeout_s: int = Field(
        default=300, ge=1, description="kubernetes: server-side timeout of one watch request."
    )

    @model_validator(mode="after")
    def _check_source(self) -> DiscoveryConfig:
        if self.kind == "dns" and self.host is None:
            raise ValueError("discovery.kind dns needs host")
        if self.kind == "kubernetes" and (self.service is None) == (self.selector is None):
            raise ValueError("discovery.kind kubernetes needs exactly one of service or selector")
        return self


class TimeoutsConfig(StrictModel):
    """Upstream timeouts of the dispatcher, in milliseconds."""

    connect_ms: float = Field(default=2000.0, gt=0, description="Connecting to a replica.")
    read_ms: float = Field(
        default=300_000.0, gt=0, description="Longest wait for the next bytes of a replica's response."
    )
    write_ms: float = Field(
        default=30_000.0,
        gt=0,
        description="Sending the request body, through an httpx transport; the router's own upstream client "
        "sends it while read_ms runs for the response head, which bounds a replica that stops reading.",
    )
    pool_ms: float = Field(default=10_000.0, gt=0, description="Waiting for a free upstream connection.")
    first_byte_ms: float | None = Field(
        default=30_000.0,
        gt=0,
        description="Longest wait for a replica's response head to a streaming request before the request "
        "moves to the next endpoint (a non-streaming answer's head comes with the whole answer: read_ms "
        "applies); null: no limit beyond read_ms.",
    )


class CircuitConfig(StrictModel):
    """The per-endpoint circuit breaker fed by failed dispatches (connect errors, timeouts, 5xx)."""

    failure_threshold: int = Field(
        default=3, ge=1, description="Consecutive failed dispatches that open an endpoint's circuit."
    )
    open_ms: float = Field(
        default=1000.0,
        gt=0,
        description="How long an open circuit keeps the endpoint out of scheduling before one probe request "
        "may go; each failed probe doubles the wait.",
    )
    max_open_ms: float = Field(default=30_000.0, gt=0, description="Longest wait of an open circuit.")


class UpstreamTLSConfig(StrictModel):
    """How the router checks the certificates of https:// replicas."""

    ca_file: str | None = Field(
        default=None,
        min_length=1,
        description="PEM file of the CA certificates to trust instead of the system's (e.g. a private CA).",
    )
    verify: bool = Field(
        default=True, description="false: accept any certificate, self-signed ones included (testing only)."
    )


class DispatchConfig(StrictModel):
    """Upstream proxying."""

    max_attempts: int = Field(
        default=2,
        ge=1,
        le=16,
        description="Endpoints tried per request before its first byte reaches the client (connect error, "
        "timeout or 5xx moves it to the next best).",
    )
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    circuit: CircuitConfig = Field(default_factory=CircuitConfig)
    max_connections: int = Field(
        default=1024,
        ge=1,
        description="Upstream requests in flight at once, in all (each holds a connection; more wait, up to "
        "timeouts.pool_ms).",
    )
    max_keepalive_connections: int = Field(
        default=256,
        ge=0,
        description="0 closes every upstream connection after its response; any other value keeps idle "
        "connections for reuse, each for up to 3 s (below the replicas' own keep-alive limit), however many.",
    )
    tls: UpstreamTLSConfig = Field(default_factory=UpstreamTLSConfig)


class LimitsConfig(StrictModel):
    """Limits on client requests and connections (slow clients included)."""

    max_body_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1024, description="Largest request body accepted; larger ones get 413."
    )
    header_timeout_ms: float = Field(
        default=10_000.0,
        gt=0,
        description="Longest time from a request's first byte to the end of its headers; a slower client is "
        "disconnected (slow-loris). Applies to `burstsched serve`.",
    )
    max_header_bytes: int = Field(
        default=65_536,
        ge=1024,
        description="Largest request head (request line and headers); a larger one gets 431 and is "
        "disconnected. Applies to `burstsched serve`.",
    )
    body_timeout_ms: float = Field(
        default=30_000.0,
        gt=0,
        description="Longest time to receive a whole request body; a slower client gets 408 and is "
        "disconnected.",
    )
    keep_alive_timeout_ms: float = Field(
        default=5000.0, gt=0, description="An idle keep-alive connection is closed after this long."
    )
    request_timeout_ms: float | None = Field(
        default=600_000.0,
        gt=0,
        description="Longest time a request may take from its arrival to its last byte: past it, a request "
        "without an answer yet gets 504, a stream ends with an error event; null: no limit.",
    )


class AuthConfig(StrictModel):
    """Client API keys (Bearer) and the protection of ``/metrics`` and ``/admin/*``.

    Keys also come from the environment: ``BURSTSCHED_API_KEYS`` and ``BURSTSCHED_ADMIN_KEYS``
    (comma-separated) add to the lists below.
    """

    api_keys: list[str] = Field(
        default_factory=list,
        description="Accepted client API keys; with none here or in BURSTSCHED_API_KEYS the API is open.",
    )
    admin_keys: list[str] = Field(
        default_factory=list,
        description="Keys for /metrics and /admin/* (also from BURSTSCHED_ADMIN_KEYS). Without admin keys "
        "those paths are open when no API key is set, else they take an API key.",
    )
    admin_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Serve /metrics and /admin/* only on this port (same host), not on the API port; "
        "admin keys, when set, still apply there.",
    )

    @field_validator("api_keys", "admin_keys")
    @classmethod
    def _check_keys(cls, keys: list[str]) -> list[str]:
        if any(not key or key != key.strip() or "," in key for key in keys):
            raise ValueError("keys must be non-empty, without surrounding blanks or commas")
        return keys


class ShutdownConfig(StrictModel):
    """Graceful shutdown (SIGTERM or SIGINT to `burstsched serve`)."""

    drain_timeout_ms: float = Field(
        default=20_000.0,
        ge=0,
        description="On shutdown the router stops accepting connections and lets in-flight requests finish "
        "for up to this long; then it ends them (a stream with an error event, others with 503).",
    )


class PrefixHashingConfig(StrictModel):
    """How a request's prompt becomes a chain of block hashes (approximate mode: no tokenizer)."""

    block_tokens: int = Field(default=64, ge=1, le=4096, description="Pseudo-tokens per block.")
    bytes_per_token: int = Field(default=4, ge=1, le=64, description="Prompt bytes per pseudo-token.")
    max_blocks: int = Field(
        default=256, ge=1, description="Most blocks hashed per request (the rest ignored)."
    )


class PluginSpec(StrictModel):
    """A plugin instance: its registered ``type``, a unique ``name`` (default: the type) and parameters."""

    type: str = Field(min_length=1, description="Registered plugin type name.")
    name: str | None = Field(default=None, min_length=1, description="Instance name (default: the type).")
    parameters: dict[str, Any] = Field(
        default_factory=dict, description="Parameters, validated by the plugin type's own model."
    )

    @property
    def instance_name(self) -> str:
        return self.name if self.name is not None else self.type


class ProfilePluginRef(StrictModel):
    """A plugin used by the scheduling profile; ``weight`` applies to scorers only (default 1)."""

    plugin_ref: str = Field(min_length=1, description="Name of a plugin instance from `plugins`.")
    weight: float | None = Field(default=None, ge=0, description="Scorer weight (scorers only; default 1).")


class ProfileConfig(StrictModel):
    """The scheduling profile: producers, filters and weighted scorers, in order, and one picker."""

    plugins: list[ProfilePluginRef] = Field(
        default_factory=lambda: [
            ProfilePluginRef(plugin_ref="approx-prefix-producer"),
            ProfilePluginRef(plugin_ref="health-filter"),
            ProfilePluginRef(plugin_ref="saturation-filter"),
            ProfilePluginRef(plugin_ref="prefix-cache-scorer", weight=3.0),
            ProfilePluginRef(plugin_ref="queue-scorer", weight=2.0),
            ProfilePluginRef(plugin_ref="kv-utilization-scorer", weight=2.0),
        ]
    )
    picker: str = Field(default="max-score-picker", min_length=1, description="Name of the picker instance.")


def _default_plugins() -> list[PluginSpec]:
    return [
        PluginSpec(type="approx-prefix-producer"),
        PluginSpec(type="health-filter"),
        PluginSpec(type="saturation-filter"),  # its thresholds: the saturation section
        PluginSpec(type="prefix-cache-scorer"),
        PluginSpec(type="queue-scorer"),
        PluginSpec(type="kv-utilization-scorer"),
        PluginSpec(type="max-score-picker", parameters={"tie_break": "least-recent"}),
    ]


class TracingConfig(StrictModel):
    """OpenTelemetry tracing, exported over OTLP/HTTP (protobuf).

    The standard ``OTEL_*`` environment variables take precedence over this section: an
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` turns tracing on (unless
    ``enabled`` is false) and replaces ``endpoint``; ``OTEL_SERVICE_NAME`` replaces ``service_name``;
    ``OTEL_TRACES_SAMPLER`` replaces ``sample_ratio``; ``OTEL_SDK_DISABLED=true`` or
    ``OTEL_TRACES_EXPORTER=none`` turns it off.
    """

    enabled: bool | None = Field(
        default=None,
        description="true: trace; false: never trace; null (default): trace when an OTLP endpoint is set, "
        "here or in OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT.",
    )
    service_name: str = Field(default="burstsched", min_length=1, description="The service.name resource.")
    endpoint: str | None = Field(
        default=None,
        description="OTLP/HTTP endpoint, e.g. http://127.0.0.1:4318; a URL without a path gets /v1/traces. "
        "Default (when enabled): http://localhost:4318/v1/traces.",
    )
    sample_ratio: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="Share of new traces recorded; a client's traceparent decides for the traces it starts.",
    )
    detail: Literal["lean", "full"] = Field(
        default="lean",
        description="lean: a request's admission and scheduling are attributes and one event on its SERVER "
        "span (a window's wait keeps a span of its own), so a warm request costs two spans; full: "
        "admission and scheduling spans for every request, with one score event per candidate.",
    )


class MetricsConfig(StrictModel):
    """The router's own Prometheus metrics."""

    timing_every: int = Field(
        default=8,
        ge=1,
        description="Time the scheduler and each plugin on one scheduling cycle in this many "
        "(burstsched_scheduling_duration_seconds and burstsched_plugin_duration_seconds are a sample of the "
        "cycles); 1 times every cycle. Timing is a cost on every request's path.",
    )


class RecordingConfig(StrictModel):
    """Traffic recording: one JSONL line per dispatched request (its shape, never its text unless asked),
    for ``burstsched replay``. The line format is documented in burstsched/recording/README.md."""

    enabled: bool = Field(default=False, description="Append one line per dispatched request to `path`.")
    path: str = Field(
        default="burstsched-trace.jsonl", min_length=1, description="The JSONL file (rotated by size)."
    )
    max_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=4096,
        description="Rotate the file once it is at least this large: path becomes path.1, path.1 path.2...",
    )
    backups: int = Field(
        default=3, ge=0, description="Rotated files kept (0: the file is truncated instead)."
    )
    include_text: bool = Field(
        default=False, description="Also record each prompt's messages or prompt text (off: hashes only)."
    )
    decisions: bool = Field(
        default=False,
        description="Also record each request's decision: every candidate endpoint in the scheduler's order "
        "with its scores, prefix match and the load it was judged by (to see why a request went where it "
        "went, and where a replay's router parts from the live one).",
    )
    flush_interval_ms: float = Field(
        default=200.0,
        gt=0,
        description="How often the requests recorded since the last flush are formatted and written to the "
        "file (one write, from the event loop).",
    )


SATURATION_FILTER = "saturation-filter"
"""The plugin type whose thresholds, when a config sets them, are the ``saturation:`` section's."""


class RouterConfig(StrictModel):
    """The whole configuration of one router process."""

    endpoints: list[EndpointConfig] = Field(
        default_factory=list, description="The replicas; may be empty when given on the command line."
    )
    models: list[str] = Field(
        default_factory=list,
        description="Model names served through the router; empty: the names the replicas report.",
    )
    pool: PoolConfig = Field(default_factory=PoolConfig)
    discovery: DiscoveryConfig = Field(
        default_factory=DiscoveryConfig,
        description="Where the endpoints come from (static list, DNS or Kubernetes); pool.selector, when set "
        "(and no endpoints), means kubernetes discovery of the pods with those labels.",
    )
    dispatch: DispatchConfig = Field(default_factory=DispatchConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    shutdown: ShutdownConfig = Field(default_factory=ShutdownConfig)
    prefix_hashing: PrefixHashingConfig = Field(default_factory=PrefixHashingConfig)
    plugins: list[PluginSpec] = Field(default_factory=_default_plugins)
    profile: ProfileConfig = Field(default_factory=ProfileConfig)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    prewarm: PrewarmConfig = Field(default_factory=PrewarmConfig)
    flow_control: FlowControlConfig = Field(
        default_factory=FlowControlConfig,
        description="The router's own queue while the endpoints a request could go to have no room: "
        "priorities, fairness between flows, and release by prefix as endpoints get room.",
    )
    saturation: SaturationConfig = Field(
        default_factory=SaturationConfig,
        description="When an endpoint counts as saturated: the saturation-filter drops such endpoints and "
        "admission's warm bypass skips them (one definition for both).",
    )
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    kv_events: KVEventsConfig = Field(default_factory=KVEventsConfig)
    tokenizer: TokenizerConfig = Field(
        default_factory=TokenizerConfig,
        description="Tokenizing prompts exactly as vLLM does, for precise prefix matching on KV events.",
    )
    recording: RecordingConfig = Field(
        default_factory=RecordingConfig, description="Recording traffic's shape for `burstsched replay`."
    )

    @model_validator(mode="after")
    def _one_saturation(self) -> RouterConfig:
        """The ``saturation:`` section and a ``saturation-filter``'s own thresholds must not disagree."""
        if "saturation" not in self.model_fields_set:
            return self
        section = self.saturation.model_dump()
        for i, spec in enumerate(self.plugins):
            if spec.type != SATURATION_FILTER:
                continue
            for key, value in spec.parameters.items():
                if key in section and value != section[key]:
                    raise ValueError(
                        f"plugins[{i}].parameters.{key} is {value!r} but saturation.{key} is "
                        f"{section[key]!r}: saturation has one definition, set it in one place"
                    )
        return self

    def with_endpoints(self, endpoints: list[EndpointConfig]) -> RouterConfig:
        """A copy with ``endpoints`` replacing the configured ones."""
        return self.model_copy(update={"endpoints": list(endpoints)})
