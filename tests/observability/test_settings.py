"""Whether and how the router traces: the ``tracing:`` section merged with the ``OTEL_*`` environment."""

from __future__ import annotations

import pytest

from burstsched.config import ConfigError, RouterConfig, TracingConfig, parse_config_text
from burstsched.telemetry import TracingSettings, resolve_tracing
from burstsched.telemetry.settings import ExportSettings, resolve_export

OFF = TracingConfig()


def test_off_by_default_and_on_with_only_the_standard_endpoint_variable() -> None:
    assert resolve_tracing(OFF, {}) is None
    assert resolve_tracing(OFF, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4318"}) == TracingSettings(
        "http://jaeger:4318/v1/traces", "burstsched", 1.0
    )
    signal = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/custom/traces"}
    resolved = resolve_tracing(OFF, signal)
    assert resolved is not None and resolved.endpoint == "http://c:4318/custom/traces"  # used as given


def test_signal_endpoint_beats_base_endpoint_beats_config() -> None:
    config = TracingConfig(endpoint="http://from-config:4318")
    base = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://base:4318/"}
    both = {**base, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://signal:4318/v1/traces"}
    assert _endpoint(config, {}) == "http://from-config:4318/v1/traces"
    assert _endpoint(config, base) == "http://base:4318/v1/traces"
    assert _endpoint(config, both) == "http://signal:4318/v1/traces"
    assert _endpoint(TracingConfig(endpoint="http://x:1/otlp/v1/traces"), {}) == "http://x:1/otlp/v1/traces"


def _endpoint(config: TracingConfig, environ: dict[str, str]) -> str:
    resolved = resolve_tracing(config, environ)
    assert resolved is not None
    return resolved.endpoint


def test_enabled_true_without_endpoint_uses_the_local_default() -> None:
    assert resolve_tracing(TracingConfig(enabled=True), {}) == TracingSettings(
        "http://localhost:4318/v1/traces", "burstsched", 1.0
    )


@pytest.mark.parametrize(
    "environ",
    [{"OTEL_SDK_DISABLED": "true"}, {"OTEL_SDK_DISABLED": "TRUE"}, {"OTEL_TRACES_EXPORTER": "none"}],
)
def test_standard_switches_turn_tracing_off(environ: dict[str, str]) -> None:
    on = TracingConfig(enabled=True, endpoint="http://c:4318")
    assert resolve_tracing(on, {**environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) is None


def test_enabled_false_wins_over_an_endpoint_in_the_environment() -> None:
    assert (
        resolve_tracing(TracingConfig(enabled=False), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
        is None
    )


def test_service_name_and_sampler_from_the_environment() -> None:
    config = TracingConfig(endpoint="http://c:4318", service_name="router-a", sample_ratio=0.25)
    assert resolve_tracing(config, {}) == TracingSettings("http://c:4318/v1/traces", "router-a", 0.25)
    environ = {"OTEL_SERVICE_NAME": "router-b", "OTEL_TRACES_SAMPLER": "always_off"}
    assert resolve_tracing(config, environ) == TracingSettings("http://c:4318/v1/traces", "router-b", None)


def test_grpc_protocol_and_bad_urls_are_config_errors() -> None:
    config = TracingConfig(endpoint="http://c:4318")
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
        resolve_tracing(config, {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"})
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        resolve_tracing(config, {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    ok = resolve_tracing(config, {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"})
    assert ok is not None
    with pytest.raises(ConfigError, match="tracing.endpoint"):
        resolve_tracing(TracingConfig(endpoint="jaeger:4318"), {})
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_ENDPOINT"):
        resolve_tracing(OFF, {"OTEL_EXPORTER_OTLP_ENDPOINT": "grpc://jaeger:4317"})


def test_the_config_file_section_is_strict() -> None:
    config = parse_config_text(
        "tracing:\n  enabled: true\n  endpoint: http://127.0.0.1:4318\n  sample_ratio: 0.5\n"
    )
    assert config.tracing == TracingConfig(enabled=True, endpoint="http://127.0.0.1:4318", sample_ratio=0.5)
    assert RouterConfig().tracing == OFF
    with pytest.raises(ConfigError, match="tracing.sample_ratio"):
        parse_config_text("tracing:\n  sample_ratio: 2\n")
    with pytest.raises(ConfigError, match="tracing.exporter"):
        parse_config_text("tracing:\n  exporter: grpc\n")


def test_export_settings_come_from_the_standard_variables_signal_first() -> None:
    environ = {
        "OTEL_EXPORTER_OTLP_HEADERS": "api-key=base",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "Api-Key=s3cret%20x,tenant=t1",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2.5",
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "GZIP",
        "OTEL_EXPORTER_OTLP_CERTIFICATE": "/etc/ca.pem",
        "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE": "/etc/client.pem",
        "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY": "/etc/client.key",
        "OTEL_BSP_SCHEDULE_DELAY": "250",
        "OTEL_BSP_MAX_QUEUE_SIZE": "100",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "512",
    }
    assert resolve_export(environ) == ExportSettings(
        headers=(("api-key", "s3cret x"), ("tenant", "t1")),
        timeout_s=2.5,
        compression="gzip",
        certificate="/etc/ca.pem",
        client_certificate="/etc/client.pem",
        client_key="/etc/client.key",
        schedule_delay_ms=250.0,
        max_queue_size=100,
        max_export_batch_size=100,  # never more than the queue holds
    )
    resolved = resolve_tracing(TracingConfig(enabled=True), environ)
    assert resolved is not None and resolved.export == resolve_export(environ)


@pytest.mark.parametrize(
    "environ",
    [
        {"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"},
        {"OTEL_EXPORTER_OTLP_COMPRESSION": "brotli"},
        {"OTEL_BSP_SCHEDULE_DELAY": "-1"},
        {"OTEL_BSP_MAX_QUEUE_SIZE": "0"},
        {"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "many"},
    ],
)
def test_a_malformed_export_variable_is_logged_and_defaulted(
    environ: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    assert resolve_export(environ) == ExportSettings()
    assert list(environ)[0] in caplog.text or "compression" in caplog.text
