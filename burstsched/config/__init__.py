"""The router's configuration: models, loading and the JSON schema."""

from burstsched.config.admission import AdmissionConfig
from burstsched.config.errors import ConfigError, ConfigIssue
from burstsched.config.loader import decode_config, load_config, parse_config_text, parse_endpoint_arg
from burstsched.config.models import (
    AuthConfig,
    CircuitConfig,
    DispatchConfig,
    EndpointConfig,
    LimitsConfig,
    PluginSpec,
    PoolConfig,
    PrefixHashingConfig,
    ProfileConfig,
    ProfilePluginRef,
    RouterConfig,
    ShutdownConfig,
    TimeoutsConfig,
    TracingConfig,
)

__all__ = [
    "AdmissionConfig",
    "AuthConfig",
    "CircuitConfig",
    "ConfigError",
    "ConfigIssue",
    "DispatchConfig",
    "EndpointConfig",
    "LimitsConfig",
    "PluginSpec",
    "PoolConfig",
    "PrefixHashingConfig",
    "ProfileConfig",
    "ProfilePluginRef",
    "RouterConfig",
    "ShutdownConfig",
    "TimeoutsConfig",
    "TracingConfig",
    "decode_config",
    "load_config",
    "parse_config_text",
    "parse_endpoint_arg",
]
