"""A replica's ``/metrics``: vLLM's metric names, types, labels and buckets, in its own registry.

Labels are ``model_name`` and ``engine`` ("0"), except ``vllm:cache_config_info`` whose labels are
the cache settings plus ``engine``, and ``vllm:lora_requests_info`` (with LoRA adapters only) whose
labels are ``max_lora``, ``waiting_lora_adapters`` and ``running_lora_adapters`` (as in vLLM). Counters
appear with ``_total`` on the wire.
Durations are wall-clock seconds as the replica lived them (already multiplied by ``time_scale``),
so they agree with what clients measure.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from burstsched.sim.config import SimConfig
from burstsched.sim.engine import EngineRequest

MetricT = TypeVar("MetricT", bound=MetricWrapperBase)

ENGINE_INDEX = "0"
FINISH_REASONS = ("stop", "length", "abort", "error")
_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)  # fmt: skip
_ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def build_1_2_5_buckets(max_value: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, … up to ``max_value`` (vLLM's token-count buckets)."""
    buckets: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(float(value))
        exponent += 1


_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
_ON_LOOKUP = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits")
_ON_PREEMPTION = ("vllm:num_preemptions",)
_ON_FIRST_TOKEN = ("vllm:prompt_tokens", "vllm:prompt_tokens_cached", "vllm:time_to_first_token_seconds")
_ON_TOKEN = ("vllm:generation_tokens", "vllm:inter_token_latency_seconds")
_ON_FINISHED = (
    "vllm:request_success",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:request_prefill_kv_computed_tokens",
    "vllm:request_params_max_tokens",
)
_ON_STEP = ("vllm:iteration_tokens_total",)
LORA_INFO = "vllm:lora_requests_info"
"""Which families each engine callback changes: a scrape re-renders only those (rendering every family
costs ~2-3 ms, and a replay on virtual time scrapes tens of thousands of times)."""


class _OneFamily:
    """A registry-shaped view of one family, for ``generate_latest``."""

    def __init__(self, family: Collector) -> None:
        self._family = family

    def collect(self) -> Iterable[Metric]:
        return self._family.collect()


class SimMetrics:
    """The metrics of one replica; implements the engine's stats interface."""

    def __init__(self, config: SimConfig) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model_name", "engine"]
        values = (config.served_model_name, ENGINE_INDEX)
        reg = self.registry
        token_buckets = build_1_2_5_buckets(config.effective_max_model_len)

        self._families: dict[str, Collector] = {}
        """Every metric family by name, in registration order (the exposition's order)."""
        self._text: dict[str, bytes] = {}
        """Each family's last rendering; re-rendered only when its samples changed since."""

        def family(parent: MetricT) -> MetricT:
            self._families[parent._name] = parent
            return parent

        def gauge(name: str, doc: str) -> Gauge:
            return family(Gauge(name, doc, labels, registry=reg)).labels(*values)

        def counter(name: str, doc: str) -> Counter:
            return family(Counter(name, doc, labels, registry=reg)).labels(*values)

        def histogram(name: str, doc: str, buckets: tuple[float, ...] | list[float]) -> Histogram:
            return family(Histogram(name, doc, labels, registry=reg, buckets=buckets)).labels(*values)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.prompt_tokens_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local prefix cache hits)."
        )
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        success = family(
            Counter(
                "vllm:request_success",
                "Count of successfully processed requests.",
                [*labels, "finished_reason"],
                registry=reg,
            )
        )
        self.success = {reason: success.labels(*values, reason) for reason in FINISH_REASONS}
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", _TTFT_BUCKETS
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", _ITL_BUCKETS
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            _LATENCY_BUCKETS,
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            _LATENCY_BUCKETS,
        )
        self.inference_time = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            _LATENCY_BUCKETS,
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            _LATENCY_BUCKETS,
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            _LATENCY_BUCKETS,
        )
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", token_buckets
        )
        self.prefill_kv_computed = histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            token_buckets,
        )
        self.max_tokens_param = histogram(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", token_buckets
        )
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            _ITERATION_BUCKETS,
        )
        cache_info = {
            "block_size": str(config.block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": str(config.enable_prefix_caching),
            "gpu_memory_utilization": "0.9",
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(config.num_gpu_blocks),
            "num_gpu_blocks_override": str(config.num_gpu_blocks),
            "prefix_caching_hash_algo": "xxhash",
            "engine": ENGINE_INDEX,
        }
        info_doc = "Information of the LLMEngine CacheConfig"
        family(Gauge("vllm:cache_config_info", info_doc, list(cache_info), registry=reg)).labels(
            **cache_info
        ).set(1)
        self.lora_info: Gauge | None = None
        self._lora_time = 0.0
        if config.lora_modules:  # as vLLM: only with LoRA on, and without the model and engine labels
            self.lora_info = family(
                Gauge(
                    LORA_INFO,
                    "Running stats on lora requests.",
                    ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
                    registry=reg,
                )
            )
        self._dirty: set[str] = set(self._families)

    def render(self, *, num_running: int, num_waiting: int, kv_cache_usage: float) -> bytes:
        """The Prometheus text exposition, gauges set from the engine's state now."""
        self.running.set(num_running)
        self.waiting.set(num_waiting)
        self.kv_usage.set(kv_cache_usage)
        self._changed(_GAUGES)
        for name in self._dirty:
            self._text[name] = generate_latest(_OneFamily(self._families[name]))
        self._dirty.clear()
        return b"".join(self._text[name] for name in self._families)

    def _changed(self, names: tuple[str, ...]) -> None:
        self._dirty.update(names)

    # -- EngineStats ----------------------------------------------------------------------------------
    def prefix_cache_lookup(self, queries: int, hits: int) -> None:
        self._changed(_ON_LOOKUP)
        self.queries.inc(queries)
        self.hits.inc(hits)

    def preemption(self) -> None:
        self._changed(_ON_PREEMPTION)
        self.preemptions.inc()

    def first_token(self, req: EngineRequest) -> None:
        self._changed(_ON_FIRST_TOKEN)
        self.prompt_tokens.inc(req.num_prompt_tokens)
        self.prompt_tokens_cached.inc(max(0, req.num_cached_tokens))
        if req.first_token_time is not None:
            self.ttft.observe(max(0.0, req.first_token_time - req.arrival_time))

    def token(self, req: EngineRequest, interval: float | None) -> None:
        self._changed(_ON_TOKEN)
        self.generation_tokens.inc()
        if interval is not None:
            self.itl.observe(max(0.0, interval))

    def finished(self, req: EngineRequest) -> None:
        self._changed(_ON_FINISHED)
        reason = req.finish_reason or "stop"
        self.success[reason].inc()
        end = req.finished_time or req.arrival_time
        scheduled = req.scheduled_time if req.scheduled_time is not None else req.queued_time
        first = req.first_token_time if req.first_token_time is not None else end
        last = req.last_token_time if req.last_token_time is not None else end
        self.e2e.observe(max(0.0, end - req.arrival_time))
        self.queue_time.observe(max(0.0, scheduled - req.queued_time))
        self.prefill_time.observe(max(0.0, first - scheduled))
        self.decode_time.observe(max(0.0, last - first))
        self.inference_time.observe(max(0.0, last - scheduled))
        self.request_prompt_tokens.observe(req.num_prompt_tokens)
        self.request_generation_tokens.observe(len(req.output_token_ids))
        self.prefill_kv_computed.observe(req.prefill_computed_tokens)
        self.max_tokens_param.observe(req.max_tokens)

    def step(self, num_tokens: int) -> None:
        if num_tokens:
            self._changed(_ON_STEP)
            self.iteration_tokens.observe(num_tokens)

    def adapters(self, running: list[str], waiting: list[str], max_loras: int) -> None:
        """vLLM's ``vllm:lora_requests_info``: the series of these labels set to the current (wall-clock)
        time; the series of earlier combinations stay, each at the time it was last set. Steps closer than
        the clock's resolution still order: the time never repeats, so the latest series is the highest."""
        if self.lora_info is None:
            return
        self._changed((LORA_INFO,))
        self._lora_time = max(time.time(), math.nextafter(self._lora_time, math.inf))
        self.lora_info.labels(
            max_lora=str(max_loras),
            waiting_lora_adapters=",".join(waiting),
            running_lora_adapters=",".join(running),
        ).set(self._lora_time)
