"""The router's own Prometheus metrics (named ``burstsched_*``, and the process's ``process_*`` once
:meth:`RouterMetrics.watch_runtime` is called), in a registry owned by the app.

Outcomes of ``burstsched_requests_total``: ``ok`` (2xx), ``client_error`` (the replica's 4xx passed through),
``upstream_error`` (every attempt failed: 502), ``stream_error`` (failed after the first byte: error event),
``cancelled`` (the client went away), ``rejected`` (refused by the router: 400, 404, 413), ``throttled``
(the admission queue is full: 429), ``unavailable`` (no healthy endpoint: 503).

Latencies are measured on the response the client gets (:meth:`RouterMetrics.timed` wraps the ASGI ``send``):
the end-to-end histogram from the request's arrival to its last byte, time to first token from the arrival to
the first body bytes of a streaming (SSE) 200 response. Both are labelled by the endpoint that served the
response (its ``x-burstsched-endpoint`` header) and skip responses the router answered itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import Message, Send

from burstsched.framework import Decision, EndpointSnapshot, Plugin, PrefixMatch, Scorer
from burstsched.telemetry.runtime import RuntimeMetrics

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
NO_ENDPOINT = "none"
ENDPOINT_HEADER = b"x-burstsched-endpoint"

Clock = Callable[[], float]

_SCHEDULING_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
_PLUGIN_BUCKETS = (
    0.000001,
    0.000005,
    0.00001,
    0.000025,
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.005,
    0.025,
)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_WAIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 1.0)
_GROUP_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128)
_FLOW_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
_LAG_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
_RATIO_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


@runtime_checkable
class SizedIndex(Protocol):
    """A prefix index that can say how many blocks it holds for an endpoint."""

    def size(self, endpoint: str) -> int: ...


DISCOVERY_STATES = ("joining", "healthy", "unhealthy", "draining")


class _DiscoveryCollector(Collector):
    """Endpoints per discovery state (joining, healthy, unhealthy, draining), read at scrape time."""

    def __init__(self, states: Callable[[], Iterable[str]]) -> None:
        self._states = states

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "burstsched_discovery_endpoints",
            "Endpoints in the pool by state: joining (not yet checked and scraped), healthy, unhealthy, "
            "draining (left discovery; in-flight requests finishing).",
            labels=["state"],
        )
        counts = dict.fromkeys(DISCOVERY_STATES, 0)
        for state in self._states():
            counts[state] = counts.get(state, 0) + 1
        for state, count in counts.items():
            family.add_metric([state], float(count))
        yield family


class _TraceExportCollector(Collector):
    """The span exporter's counts, read at scrape time: exported, dropped, waiting."""

    def __init__(self, counts: Callable[[], tuple[int, int, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterable[Metric]:
        exported, dropped, queued = self._counts()
        spans = CounterMetricFamily(
            "burstsched_trace_spans",
            "Spans the trace exporter handled: exported (the collector accepted them) or dropped (the queue "
            "was full, or their batch failed after its retries).",
            labels=["outcome"],
        )
        spans.add_metric(["exported"], float(exported))
        spans.add_metric(["dropped"], float(dropped))
        yield spans
        yield GaugeMetricFamily(
            "burstsched_trace_spans_queued", "Finished spans waiting for their export batch.", value=queued
        )


class _EndpointCollector(Collector):
    """Endpoint health, staleness, metrics age and in-flight counts, read from the pool at scrape time."""

    def __init__(
        self,
        snapshots: Callable[[], Sequence[EndpointSnapshot]],
        demands: Callable[[], Mapping[str, float]],
    ) -> None:
        self._snapshots = snapshots
        self._demands = demands

    def collect(self) -> Iterable[Metric]:
        healthy = GaugeMetricFamily(
            "burstsched_endpoint_healthy",
            "1 when the endpoint passed its last health check.",
            labels=["endpoint"],
        )
        stale = GaugeMetricFamily(
            "burstsched_endpoint_stale",
            "1 when the endpoint's metrics are older than the threshold.",
            labels=["endpoint"],
        )
        in_flight = GaugeMetricFamily(
            "burstsched_endpoint_in_flight",
            "Requests the router has in flight to the endpoint.",
            labels=["endpoint"],
        )
        queued = GaugeMetricFamily(
            "burstsched_endpoint_queued_prefill_tokens",
            "Prompt tokens the router expects the endpoint to compute for requests it sent there that have "
            "no first token yet (the cost scorer's queue).",
            labels=["endpoint"],
        )
        demand = GaugeMetricFamily(
            "burstsched_endpoint_prefill_demand_tokens_per_second",
            "Prompt tokens per second the router has recently sent the endpoint to compute (exponentially "
            "weighted, 10 s time constant); over the prefill speed, how busy the router keeps its prefill.",
            labels=["endpoint"],
        )
        speed = GaugeMetricFamily(
            "burstsched_endpoint_prefill_tokens_per_second",
            "The endpoint's prefill speed learned from its metrics (absent until known).",
            labels=["endpoint"],
        )
        fitted = GaugeMetricFamily(
            "burstsched_endpoint_ttft_model",
            "The endpoint's time to first token as fitted on the streams the router sent there (absent until "
            "fitted): TTFT = base_seconds + tokens * (seconds_per_token + seconds_per_token_per_request * "
            "other requests in flight), by coefficient; samples: streams it was fitted on.",
            labels=["endpoint", "coefficient"],
        )
        age = GaugeMetricFamily(
            "burstsched_endpoint_metrics_age_seconds",
            "Seconds since the endpoint's last successful metrics scrape (absent before the first).",
            labels=["endpoint"],
        )
        demands = self._demands()
        for snap in self._snapshots():
            healthy.add_metric([snap.name], 1.0 if snap.healthy else 0.0)
            stale.add_metric([snap.name], 1.0 if snap.stale else 0.0)
            in_flight.add_metric([snap.name], float(snap.in_flight))
            queued.add_metric([snap.name], float(snap.queued_prefill_tokens))
            demand.add_metric([snap.name], demands.get(snap.name, 0.0))
            if snap.prefill_tokens_per_s is not None:
                speed.add_metric([snap.name], snap.prefill_tokens_per_s)
            if snap.ttft is not None:
                fitted.add_metric([snap.name, "base_seconds"], snap.ttft.base_s)
                fitted.add_metric([snap.name, "seconds_per_token"], snap.ttft.per_token_s)
                fitted.add_metric([snap.name, "seconds_per_token_per_request"], snap.ttft.per_token_per_seq_s)
                fitted.add_metric([snap.name, "samples"], float(snap.ttft.samples))
            if snap.metrics_age != float("inf"):
                age.add_metric([snap.name], snap.metrics_age)
        return [healthy, stale, in_flight, queued, demand, speed, fitted, age]


class _IndexCollector(Collector):
    """Blocks held per endpoint by each prefix index, read at scrape time."""

    def __init__(
        self, indexes: Sequence[tuple[str, SizedIndex]], endpoint_names: Callable[[], Iterable[str]]
    ) -> None:
        self.indexes = indexes
        self._endpoint_names = endpoint_names

    def collect(self) -> Iterable[Metric]:
        blocks = GaugeMetricFamily(
            "burstsched_prefix_index_blocks",
            "Prefix blocks a plugin's index records for the endpoint (bounded by its KV capacity).",
            labels=["plugin", "endpoint"],
        )
        names = list(self._endpoint_names())
        for plugin, index in self.indexes:
            for name in names:
                blocks.add_metric([plugin, name], float(index.size(name)))
        return [blocks]


class _TimedSend:
    """Wraps one request's ASGI ``send``: observes time to first token and end-to-end latency."""

    __slots__ = ("_send", "_metrics", "_started", "_endpoint", "_streaming", "_first")

    def __init__(self, send: Send, metrics: RouterMetrics) -> None:
        self._send = send
        self._metrics = metrics
        self._started = metrics.clock()
        self._endpoint: str | None = None
        self._streaming = False
        self._first = True

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self._response_start(message)
        elif kind == "http.response.body" and self._endpoint is not None:
            if self._first and message.get("body"):
                self._first = False
                if self._streaming:
                    self._metrics.observe_ttft(self._endpoint, self._metrics.clock() - self._started)
            if not message.get("more_body", False):
                self._metrics.observe_e2e(self._endpoint, self._metrics.clock() - self._started)
                self._endpoint = None
        await self._send(message)

    def _response_start(self, message: Message) -> None:
        content_type = b""
        for name, value in message.get("headers", ()):
            if name == ENDPOINT_HEADER:
                self._endpoint = value.decode("latin-1")
            elif name == b"content-type":
                content_type = value
        self._streaming = message["status"] == 200 and content_type.startswith(b"text/event-stream")


class RouterMetrics:
    """The router's counters and histograms, and the registry that renders them.

    ``clock`` (seconds) times the client-facing latencies of :meth:`timed`.
    """

    def __init__(self, *, clock: Clock = time.perf_counter) -> None:
        self.clock = clock
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "burstsched_requests",
            "Client requests by the endpoint that served them last (or none) and outcome.",
            ["endpoint", "outcome"],
            registry=self.registry,
        )
        self.upstream_attempts = Counter(
            "burstsched_upstream_attempts",
            "Upstream attempts by endpoint and result (ok, connect_error, timeout, status_5xx, read_error).",
            ["endpoint", "result"],
            registry=self.registry,
        )
        self.scheduling_duration = Histogram(
            "burstsched_scheduling_duration_seconds",
            "Time spent choosing an endpoint for one request.",
            buckets=_SCHEDULING_BUCKETS,
            registry=self.registry,
        )
        self.plugin_duration = Histogram(
            "burstsched_plugin_duration_seconds",
            "Time of one plugin call, by extension point (producer, filter, scorer, picker) and plugin name.",
            ["extension_point", "plugin"],
            buckets=_PLUGIN_BUCKETS,
            registry=self.registry,
        )
        self.ttft = Histogram(
            "burstsched_time_to_first_token_seconds",
            "Streaming requests: arrival at the router to the first body bytes sent to the client.",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "burstsched_e2e_request_latency_seconds",
            "Requests served by an endpoint: arrival at the router to the last byte sent to the client.",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.admission_wait = Histogram(
            "burstsched_admission_wait_seconds",
            "Time from admission to the scheduling decision (window wait and placement), by group role "
            "(leader, member, spill, joined, bypass).",
            ["role"],
            buckets=_WAIT_BUCKETS,
            registry=self.registry,
        )
        self.group_size = Histogram(
            "burstsched_admission_group_size",
            "Requests per prefix group placed by an admission window, observed once per group.",
            buckets=_GROUP_BUCKETS,
            registry=self.registry,
        )
        self._flow_depths: dict[tuple[str, str], int] = {}
        self.flow_queued = Gauge(
            "burstsched_flow_queue_requests",
            "Requests held in the router's flow-control queue, by priority band and flow.",
            ["priority", "flow"],
            registry=self.registry,
        )
        self.flow_wait = Histogram(
            "burstsched_flow_queue_wait_seconds",
            "Time requests spent in the flow-control queue, by priority band and outcome (released, "
            "cancelled, shed, full, expired, no_endpoint, shutdown).",
            ["priority", "outcome"],
            buckets=_FLOW_WAIT_BUCKETS,
            registry=self.registry,
        )
        self.flow_overtook = Histogram(
            "burstsched_flow_queue_overtaken",
            "Per request released from the flow-control queue: how many requests queued before it were still "
            "waiting (how far the prefix-aware order passed them over).",
            buckets=_GROUP_BUCKETS,
            registry=self.registry,
        )
        self.estimated_hit_ratio = Histogram(
            "burstsched_prefix_estimated_hit_ratio",
            "Per scheduled request: share of its prefix blocks the chosen endpoint held by the prefix "
            "producer's match at scheduling time.",
            buckets=_RATIO_BUCKETS,
            registry=self.registry,
        )
        self.prefix_decisions = Counter(
            "burstsched_prefix_decisions",
            "Scheduled requests by the prefix index that knew the chosen endpoint's match: precise (the "
            "replica's KV events) or approximate (past routing).",
            ["index"],
            registry=self.registry,
        )
        self.prewarms = Counter(
            "burstsched_prewarms",
            "Prewarm copies (a hot shared prefix computed once more on an idle endpoint), by endpoint and "
            "outcome: ok, or failed.",
            ["endpoint", "outcome"],
            registry=self.registry,
        )
        self.tokenizations = Counter(
            "burstsched_tokenizations",
            "Requests the router tokenized for the precise index, by outcome: ok, or fallback (no exact "
            "token ids: the approximate index decides).",
            ["outcome"],
            registry=self.registry,
        )
        self.kv_events_counter = Counter(
            "burstsched_kv_events",
            "KV-cache events received from each endpoint, by type (BlockStored, BlockRemoved, "
            "AllBlocksCleared).",
            ["endpoint", "type"],
            registry=self.registry,
        )
        self.kv_event_lag_histogram = Histogram(
            "burstsched_kv_event_lag_seconds",
            "Per event batch: the replica's timestamp of the batch to its arrival at the router.",
            ["endpoint"],
            buckets=_LAG_BUCKETS,
            registry=self.registry,
        )
        self.kv_event_gaps = Counter(
            "burstsched_kv_event_gaps",
            "Gaps in an endpoint's event sequence (batches lost between two received ones).",
            ["endpoint"],
            registry=self.registry,
        )
        self.kv_event_replays = Counter(
            "burstsched_kv_event_replays",
            "Replays asked of an endpoint's replay socket, by outcome (ok, partial, failed, unavailable).",
            ["endpoint", "outcome"],
            registry=self.registry,
        )
        self.kv_stream_resets = Counter(
            "burstsched_kv_stream_resets",
            "Times an endpoint's precise entries were dropped, by reason (restart, gap).",
            ["endpoint", "reason"],
            registry=self.registry,
        )
        self.kv_event_decode_errors = Counter(
            "burstsched_kv_event_decode_errors",
            "Messages from an endpoint's event stream that were not KV-event batches.",
            ["endpoint"],
            registry=self.registry,
        )
        self.discovery_changes = Counter(
            "burstsched_discovery_changes",
            "Changes to the endpoint set by discovery: added, removed (draining began), drained (gone), "
            "restored (back before it drained).",
            ["change"],
            registry=self.registry,
        )
        self.config_reloads = Counter(
            "burstsched_config_reloads",
            "Live config reloads (SIGHUP, a changed file, POST /admin/reload): applied, unchanged, or "
            "refused (the new config was invalid; the old one stays).",
            ["outcome"],
            registry=self.registry,
        )
        self._index_collector: _IndexCollector | None = None
        self._prefix_scorers: tuple[str, ...] = ()
        self._decision_children: dict[str, Counter] = {}
        self._lag_children: dict[str, Histogram] = {}
        self._plugin_children: dict[tuple[str, str], Histogram] = {}
        self._ttft_children: dict[str, Histogram] = {}
        self._request_children: dict[tuple[str, str], Counter] = {}
        self._attempt_children: dict[tuple[str, str], Counter] = {}
        self._e2e_children: dict[str, Histogram] = {}
        self._wait_children: dict[str, Histogram] = {}

    def watch_endpoints(
        self,
        snapshots: Callable[[], Sequence[EndpointSnapshot]],
        demands: Callable[[], Mapping[str, float]] = dict,
    ) -> None:
        """Export the pool's per-endpoint gauges, read at each scrape (``demands``: each endpoint's prefill
        demand in tokens/s, 0 where absent)."""
        self.registry.register(_EndpointCollector(snapshots, demands))

    def watch_discovery(self, states: Callable[[], Iterable[str]]) -> None:
        """Export how many endpoints are in each discovery state, read from the pool at each scrape."""
        self.registry.register(_DiscoveryCollector(states))

    def watch_trace_export(self, counts: Callable[[], tuple[int, int, int]]) -> None:
        """Export the span exporter's (exported, dropped, queued) counts, read at each scrape."""
        self.registry.register(_TraceExportCollector(counts))

    def config_reload(self, outcome: str) -> None:
        self.config_reloads.labels(outcome).inc()

    def discovery_change(self, change: str) -> None:
        self.discovery_changes.labels(change).inc()

    def watch_runtime(self, count_tasks: Callable[[], int]) -> RuntimeMetrics:
        """Export the process's runtime health (event-loop lag, asyncio tasks, ``process_*``); the caller
        runs the returned :attr:`RuntimeMetrics.sampler` on the loop it watches."""
        return RuntimeMetrics(self.registry, count_tasks=count_tasks)

    def watch_worker(self, worker: str, pid: int) -> None:
        """Export ``burstsched_worker_info{worker, pid} 1``: which process of ``burstsched serve --workers``
        answered the scrape (each worker has its own metrics; see burstsched.server.workers)."""
        info = Gauge(
            "burstsched_worker_info",
            "Constant 1, labelled with this router process's worker index and PID (--workers).",
            ["worker", "pid"],
            registry=self.registry,
        )
        info.labels(worker, str(pid)).set(1.0)

    def watch_plugins(self, plugins: Iterable[Plugin], endpoint_names: Callable[[], Iterable[str]]) -> None:
        """Export the size of every plugin's prefix index (an ``index`` with ``size(endpoint)``) and take
        the estimated hit ratio from the scorers that read the producers' :class:`PrefixMatch`; called again
        (a config reload), the new plugins replace the old."""
        plugins = list(plugins)
        indexes: list[tuple[str, SizedIndex]] = []
        for plugin in plugins:
            index = getattr(plugin, "index", None)
            if isinstance(index, SizedIndex):
                indexes.append((plugin.name, index))
        if self._index_collector is not None:
            self._index_collector.indexes = indexes
        elif indexes:
            self._index_collector = _IndexCollector(indexes, endpoint_names)
            self.registry.register(self._index_collector)
        self._prefix_scorers = tuple(
            p.name for p in plugins if isinstance(p, Scorer) and PrefixMatch in getattr(p, "consumes", ())
        )

    def timed(self, send: Send) -> Send:
        """``send`` for one request, observing its latencies; call it when the request arrives."""
        return _TimedSend(send, self)

    def request_done(self, endpoint: str | None, outcome: str) -> None:
        key = (endpoint or NO_ENDPOINT, outcome)
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = self.requests.labels(*key)
        child.inc()

    def attempt(self, endpoint: str, result: str) -> None:
        key = (endpoint, result)
        child = self._attempt_children.get(key)
        if child is None:
            child = self._attempt_children[key] = self.upstream_attempts.labels(*key)
        child.inc()

    def observe_ttft(self, endpoint: str, seconds: float) -> None:
        _child(self._ttft_children, self.ttft, endpoint).observe(seconds)

    def observe_e2e(self, endpoint: str, seconds: float) -> None:
        _child(self._e2e_children, self.e2e, endpoint).observe(seconds)

    def observe_plugin(self, extension_point: str, plugin: str, seconds: float) -> None:
        """The scheduler's plugin observer: one plugin call took ``seconds``."""
        key = (extension_point, plugin)
        child = self._plugin_children.get(key)
        if child is None:
            child = self._plugin_children[key] = self.plugin_duration.labels(extension_point, plugin)
        child.observe(seconds)

    def observe_decision(self, decision: Decision) -> None:
        """A request's decision: its chosen endpoint's prefix score is the estimated hit ratio.

        The prefix scorer's score is the producer's ``matched_blocks / total_blocks`` for the chain the
        decision was made on (for a group placed by a window, the group's shared prefix).
        """
        prefix = decision.prefix
        if prefix is not None:
            child = self._decision_children.get(prefix.source)
            if child is None:
                child = self._decision_children[prefix.source] = self.prefix_decisions.labels(prefix.source)
            child.inc()
        scores = decision.ranked[0].scores
        for name in self._prefix_scorers:
            ratio = scores.get(name)
            if ratio is not None:
                self.estimated_hit_ratio.observe(ratio)
                return

    def observe_admission(self, role: str, waited_s: float, group_size: int) -> None:
        """One admitted request; a group's leader also counts its group's size."""
        _child(self._wait_children, self.admission_wait, role).observe(waited_s)
        if role == "leader":
            self.group_size.observe(group_size)

    def flow_depth(self, priority: int, flow: str, delta: int) -> None:
        """A request entered (+1) or left (-1) the flow-control queue (a flow's series goes once empty)."""
        labels = (str(priority), flow)
        depth = self._flow_depths.get(labels, 0) + delta
        if depth > 0:
            self._flow_depths[labels] = depth
            self.flow_queued.labels(*labels).set(depth)
        elif labels in self._flow_depths:
            del self._flow_depths[labels]
            self.flow_queued.remove(*labels)

    def flow_done(self, priority: int, outcome: str, waited_s: float, overtook: int) -> None:
        """A request left the flow-control queue (or was refused at its door) after ``waited_s``."""
        self.flow_wait.labels(str(priority), outcome).observe(waited_s)
        if outcome == "released":
            self.flow_overtook.observe(overtook)

    def tokenized(self, outcome: str) -> None:
        self.tokenizations.labels(outcome).inc()

    # --- the KV-event hub's observer ------------------------------------------------------------------

    def kv_events(self, endpoint: str, kind: str, count: int) -> None:
        self.kv_events_counter.labels(endpoint, kind).inc(count)

    def kv_event_lag(self, endpoint: str, seconds: float) -> None:
        _child(self._lag_children, self.kv_event_lag_histogram, endpoint).observe(seconds)

    def kv_event_gap(self, endpoint: str, missing: int) -> None:
        self.kv_event_gaps.labels(endpoint).inc()

    def kv_event_replay(self, endpoint: str, outcome: str) -> None:
        self.kv_event_replays.labels(endpoint, outcome).inc()

    def kv_stream_reset(self, endpoint: str, reason: str) -> None:
        self.kv_stream_resets.labels(endpoint, reason).inc()

    def kv_event_decode_error(self, endpoint: str) -> None:
        self.kv_event_decode_errors.labels(endpoint).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _child(cache: dict[str, Histogram], histogram: Histogram, label: str) -> Histogram:
    """``histogram.labels(label)``, remembered: ``labels`` takes a lock and builds a key on every call."""
    child = cache.get(label)
    if child is None:
        child = cache[label] = histogram.labels(label)
    return child
