"""Whether and how to trace: the ``tracing:`` config section merged with the standard ``OTEL_*`` variables.

Precedence, highest first: ``OTEL_SDK_DISABLED=true`` and ``OTEL_TRACES_EXPORTER=none`` turn tracing off;
``tracing.enabled: false`` keeps it off; then the environment's endpoint, service name and sampler replace the
config's. With ``enabled`` unset, tracing is on exactly when an endpoint is set somewhere. The exporter itself
still reads the other ``OTEL_EXPORTER_OTLP_*`` variables (headers, timeout, compression, certificates) and the
batch processor reads ``OTEL_BSP_*``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from burstsched.config import ConfigError, ConfigIssue, TracingConfig

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "http://localhost:4318"
TRACES_PATH = "/v1/traces"
SUPPORTED_PROTOCOL = "http/protobuf"


@dataclass(frozen=True, slots=True)
class TracingSettings:
    """Resolved tracing settings: the full traces URL, the service name and the sampling ratio.

    ``sample_ratio`` is None when ``OTEL_TRACES_SAMPLER`` chooses the sampler instead.
    """

    endpoint: str
    service_name: str
    sample_ratio: float | None
    full_detail: bool = False
    """``tracing.detail: full``: admission and scheduling as child spans of every request."""


def resolve_tracing(config: TracingConfig, environ: Mapping[str, str]) -> TracingSettings | None:
    """The settings to trace with, or None when tracing is off; :class:`ConfigError` for unusable values."""
    if _true(environ.get("OTEL_SDK_DISABLED")) or config.enabled is False:
        return None
    exporters = [e.strip() for e in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if e.strip()]
    if exporters == ["none"]:
        return None
    if any(e not in ("otlp", "none") for e in exporters):
        log.warning("OTEL_TRACES_EXPORTER=%s: burstsched exports traces over OTLP only", ",".join(exporters))
    endpoint = _endpoint(config, environ)
    if endpoint is None:
        if not config.enabled:
            return None
        endpoint = DEFAULT_ENDPOINT + TRACES_PATH
    _check_protocol(environ)
    service_name = environ.get("OTEL_SERVICE_NAME", "").strip() or config.service_name
    sample_ratio = None if environ.get("OTEL_TRACES_SAMPLER", "").strip() else config.sample_ratio
    return TracingSettings(
        endpoint=endpoint,
        service_name=service_name,
        sample_ratio=sample_ratio,
        full_detail=config.detail == "full",
    )


def _endpoint(config: TracingConfig, environ: Mapping[str, str]) -> str | None:
    signal = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if signal:
        return _checked_url(signal, "env OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")  # used as given, per the spec
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if base:
        return _checked_url(base, "env OTEL_EXPORTER_OTLP_ENDPOINT").rstrip("/") + TRACES_PATH
    if config.endpoint:
        url = _checked_url(config.endpoint, "tracing.endpoint")
        return url.rstrip("/") + TRACES_PATH if urlsplit(url).path in ("", "/") else url
    return None


def _checked_url(url: str, where: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError([ConfigIssue(where, f"not an http(s) URL: {url!r}")])
    return url


def _check_protocol(environ: Mapping[str, str]) -> None:
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = environ.get(name, "").strip()
        if value:
            if value != SUPPORTED_PROTOCOL:
                raise ConfigError(
                    [ConfigIssue(f"env {name}", f"{value!r}: burstsched exports {SUPPORTED_PROTOCOL} only")]
                )
            return


def _true(value: str | None) -> bool:
    return value is not None and value.strip().lower() == "true"
