"""Reading a vLLM replica's ``/metrics`` page into the few figures the scheduler uses.

A page holds hundreds of lines; only the wanted families' sample lines reach the Prometheus parser, and
the ``vllm:cache_config_info`` line (long, and fixed for the replica's lifetime) is parsed again only when
it changes.

``vllm:lora_requests_info`` (a replica serving LoRA adapters) keeps one series per combination of its labels
``running_lora_adapters``, ``waiting_lora_adapters`` (comma-separated names) and ``max_lora`` that ever
occurred, each valued at the time it was last set: the series with the highest value is the current one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"
CACHE_CONFIG = "vllm:cache_config_info"
PREFILL_TOKENS_SUM = "vllm:request_prefill_kv_computed_tokens_sum"
PREFILL_TIME_SUM = "vllm:request_prefill_time_seconds_sum"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
LORA_INFO = "vllm:lora_requests_info"
_LOAD_FAMILIES = (
    WAITING,
    RUNNING,
    KV_USAGE,
    KV_USAGE_OLD,
    PREFILL_TOKENS_SUM,
    PREFILL_TIME_SUM,
    PROMPT_TOKENS,
    LORA_INFO,
)


@dataclass(frozen=True, slots=True)
class ReplicaMetrics:
    """A replica's load and cache geometry; counts summed over its engines, KV usage the highest one."""

    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    model_names: frozenset[str] = frozenset()
    prefill_tokens: float | None = None
    """Σ tokens the replica computed in prefill (cached ones excluded), since it started."""
    prefill_seconds: float | None = None
    """Σ seconds its requests spent in prefill (scheduled to first token), since it started."""
    prompt_tokens: float | None = None
    """Σ prompt tokens of its requests (cached ones included, counted at the first token) since it started."""
    running_adapters: frozenset[str] = frozenset()
    """The LoRA adapters of its running requests (the current ``vllm:lora_requests_info`` series)."""
    waiting_adapters: frozenset[str] = frozenset()
    """The LoRA adapters of its waiting requests."""
    max_adapters: int = 0
    """How many adapters it may run at once (``max_lora``); 0 when it reported none (no LoRA)."""


class MetricsFormatError(ValueError):
    """The page is not Prometheus text, or lacks the queue gauges."""


def _sample_lines(text: str, name: str) -> list[str]:
    """The sample lines of metric ``name`` (``name{...} value`` or ``name value``), found without a split."""
    lines = []
    start = text.find(name)
    while start >= 0:
        line_start = text.rfind("\n", 0, start) + 1
        end = text.find("\n", start)
        if end < 0:
            end = len(text)
        follower = text[start + len(name) : start + len(name) + 1]
        if line_start == start and follower in ("{", " "):
            lines.append(text[line_start:end])
        start = text.find(name, end)
    return lines


class MetricsParser:
    """Parses one replica's successive pages."""

    def __init__(self) -> None:
        self._cache_lines: list[str] = []
        self._geometry: tuple[int | None, int | None] = (None, None)

    def parse(self, text: str) -> ReplicaMetrics:
        load_lines = [line for name in _LOAD_FAMILIES for line in _sample_lines(text, name)]
        cache_lines = _sample_lines(text, CACHE_CONFIG)
        parse_cache = cache_lines != self._cache_lines
        to_parse = load_lines + cache_lines if parse_cache else load_lines
        waiting = running = 0.0
        prefill_tokens: float | None = None
        prefill_seconds: float | None = None
        prompt_tokens: float | None = None
        kv_usage: float | None = None
        kv_usage_old: float | None = None
        block_size, num_gpu_blocks = (None, None) if parse_cache else self._geometry
        models: set[str] = set()
        lora: dict[str, str] | None = None
        lora_time = -math.inf
        seen_queue = False
        try:
            families = list(text_string_to_metric_families("\n".join(to_parse) + "\n"))
        except ValueError as exc:
            raise MetricsFormatError(f"cannot parse metrics: {exc}") from exc
        for family in families:
            for sample in family.samples:
                model = sample.labels.get("model_name")
                if model:
                    models.add(model)
                if sample.name == WAITING:
                    waiting += sample.value
                    seen_queue = True
                elif sample.name == RUNNING:
                    running += sample.value
                    seen_queue = True
                elif sample.name == KV_USAGE:
                    kv_usage = max(kv_usage or 0.0, sample.value)
                elif sample.name == KV_USAGE_OLD:
                    kv_usage_old = max(kv_usage_old or 0.0, sample.value)
                elif sample.name == PREFILL_TOKENS_SUM:
                    prefill_tokens = (prefill_tokens or 0.0) + sample.value
                elif sample.name == PREFILL_TIME_SUM:
                    prefill_seconds = (prefill_seconds or 0.0) + sample.value
                elif sample.name == PROMPT_TOKENS:
                    prompt_tokens = (prompt_tokens or 0.0) + sample.value
                elif sample.name == LORA_INFO:
                    if sample.value > lora_time:
                        lora, lora_time = sample.labels, sample.value
                elif sample.name == CACHE_CONFIG:
                    block_size = _int_label(sample.labels, "block_size", block_size)
                    num_gpu_blocks = _int_label(sample.labels, "num_gpu_blocks", num_gpu_blocks)
        if not seen_queue:
            raise MetricsFormatError(f"metrics lack {WAITING} and {RUNNING}")
        if parse_cache:
            self._cache_lines = cache_lines
            self._geometry = (block_size, num_gpu_blocks)
        usage = kv_usage if kv_usage is not None else kv_usage_old if kv_usage_old is not None else 0.0
        lora = lora or {}
        return ReplicaMetrics(
            waiting=int(waiting),
            running=int(running),
            kv_usage=min(1.0, max(0.0, usage)),
            block_size=block_size,
            num_gpu_blocks=num_gpu_blocks,
            model_names=frozenset(models),
            prefill_tokens=prefill_tokens,
            prefill_seconds=prefill_seconds,
            prompt_tokens=prompt_tokens,
            running_adapters=_adapters(lora.get("running_lora_adapters", "")),
            waiting_adapters=_adapters(lora.get("waiting_lora_adapters", "")),
            max_adapters=_int_label(lora, "max_lora", None) or 0,
        )


def parse_vllm_metrics(text: str) -> ReplicaMetrics:
    """Parse one ``/metrics`` page."""
    return MetricsParser().parse(text)


def _adapters(names: str) -> frozenset[str]:
    """The adapter names of a comma-separated label value (blanks dropped)."""
    return frozenset(name.strip() for name in names.split(",") if name.strip())


def _int_label(labels: dict[str, str], key: str, current: int | None) -> int | None:
    try:
        value = int(labels[key])
    except (KeyError, ValueError):
        return current
    return value if value > 0 else current
