"""Whether and how to trace: the ``tracing:`` config section merged with the standard ``OTEL_*`` variables.

Precedence, highest first: ``OTEL_SDK_DISABLED=true`` and ``OTEL_TRACES_EXPORTER=none`` turn tracing off;
``tracing.enabled: false`` keeps it off; then the environment's endpoint, service name and sampler replace the
config's. With ``enabled`` unset, tracing is on exactly when an endpoint is set somewhere. How spans are
sent (:class:`ExportSettings`) comes from the other standard variables, read as OpenTelemetry's Python
exporter reads them: ``OTEL_EXPORTER_OTLP_[TRACES_]`` + ``HEADERS``, ``TIMEOUT``, ``COMPRESSION``,
``CERTIFICATE``, ``CLIENT_KEY``, ``CLIENT_CERTIFICATE`` (the signal's own variable first; the timeout in
seconds) and ``OTEL_BSP_*`` (milliseconds and counts).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from opentelemetry.util.re import parse_env_headers

from burstsched.config import ConfigError, ConfigIssue, TracingConfig

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "http://localhost:4318"
TRACES_PATH = "/v1/traces"
SUPPORTED_PROTOCOL = "http/protobuf"


@dataclass(frozen=True, slots=True)
class ExportSettings:
    """How finished spans are batched and posted: OpenTelemetry's defaults unless the environment says."""

    headers: tuple[tuple[str, str], ...] = ()
    """Sent with every export (lower-cased names), e.g. a collector's API key."""
    timeout_s: float = 10.0
    """One export's deadline, retries included."""
    compression: Literal["none", "gzip", "deflate"] = "none"
    certificate: str | None = None
    """A CA bundle to verify the collector with (default: the system's)."""
    client_certificate: str | None = None
    client_key: str | None = None
    schedule_delay_ms: float = 5000.0
    """The longest a finished span waits before its batch is sent."""
    max_queue_size: int = 2048
    """Spans waiting beyond this are dropped (and counted)."""
    max_export_batch_size: int = 512
    """Spans per export; a full batch is sent at once."""


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
    export: ExportSettings = field(default_factory=ExportSettings)


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
        export=resolve_export(environ),
    )


def resolve_export(environ: Mapping[str, str]) -> ExportSettings:
    """:class:`ExportSettings` from the ``OTEL_EXPORTER_OTLP_*`` and ``OTEL_BSP_*`` variables; a malformed
    value is logged and replaced by the default, as OpenTelemetry's exporter does."""
    defaults = ExportSettings()

    def otlp(name: str) -> str:
        return (
            environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}")
            or environ.get(f"OTEL_EXPORTER_OTLP_{name}")
            or ""
        ).strip()

    def number(name: str, raw: str, default: float, *, least: float) -> float:
        if not raw:
            return default
        try:
            value = float(raw)
        except ValueError:
            value = least - 1
        if value < least:
            log.warning("%s=%r is not a number ≥ %g: using %g", name, raw, least, default)
            return default
        return value

    compression = otlp("COMPRESSION").lower() or "none"
    if compression not in ("none", "gzip", "deflate"):
        log.warning("OTLP compression %r is not none, gzip or deflate: sending uncompressed", compression)
        compression = "none"
    bsp = {
        name: environ.get(f"OTEL_BSP_{name}", "").strip()
        for name in ("SCHEDULE_DELAY", "MAX_QUEUE_SIZE", "MAX_EXPORT_BATCH_SIZE")
    }
    queue = int(number("OTEL_BSP_MAX_QUEUE_SIZE", bsp["MAX_QUEUE_SIZE"], defaults.max_queue_size, least=1))
    batch = int(
        number(
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
            bsp["MAX_EXPORT_BATCH_SIZE"],
            defaults.max_export_batch_size,
            least=1,
        )
    )
    return ExportSettings(
        headers=tuple(parse_env_headers(otlp("HEADERS"), liberal=True).items()),
        timeout_s=number("OTEL_EXPORTER_OTLP_TIMEOUT", otlp("TIMEOUT"), defaults.timeout_s, least=0.001),
        compression=compression,  # type: ignore[arg-type]  # checked above
        certificate=otlp("CERTIFICATE") or None,
        client_certificate=otlp("CLIENT_CERTIFICATE") or None,
        client_key=otlp("CLIENT_KEY") or None,
        schedule_delay_ms=number(
            "OTEL_BSP_SCHEDULE_DELAY", bsp["SCHEDULE_DELAY"], defaults.schedule_delay_ms, least=1
        ),
        max_queue_size=queue,
        max_export_batch_size=min(batch, queue),
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
