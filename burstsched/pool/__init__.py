"""The endpoint pool: scraping, health and in-flight counts of the replicas."""

from burstsched.pool.circuit import CircuitBreaker, CircuitSettings, CircuitState
from burstsched.pool.pool import (
    FAILURES_BEFORE_UNHEALTHY,
    EndpointPool,
    EndpointStatus,
    Fetch,
    UnknownEndpointError,
)
from burstsched.pool.scrape import MetricsFormatError, MetricsParser, ReplicaMetrics, parse_vllm_metrics

__all__ = [
    "CircuitBreaker",
    "CircuitSettings",
    "CircuitState",
    "FAILURES_BEFORE_UNHEALTHY",
    "EndpointPool",
    "EndpointStatus",
    "Fetch",
    "MetricsFormatError",
    "MetricsParser",
    "ReplicaMetrics",
    "UnknownEndpointError",
    "parse_vllm_metrics",
]
