"""The router's configuration: models, loading and the JSON schema."""

from burstsched.config.admission import AdmissionConfig
from burstsched.config.errors import ConfigError, ConfigIssue
from burstsched.config.kv_events import KVEventsConfig
from burstsched.config.loader import (
    LoadedConfig,
    attach_kv_events,
    decode_config,
    load_config,
    parse_config_document,
    parse_config_text,
    parse_endpoint_arg,
    read_config,
    with_tokenizer,
)
from burstsched.config.models import (
    AuthConfig,
    CircuitConfig,
    DispatchConfig,
    EndpointConfig,
    LimitsConfig,
    PluginSpec,
    PoolConfig,
    PoolSelectorConfig,
    PrefixHashingConfig,
    ProfileConfig,
    ProfilePluginRef,
    RouterConfig,
    ShutdownConfig,
    TimeoutsConfig,
    TracingConfig,
    UpstreamTLSConfig,
)
from burstsched.config.tokenizer import TokenizerConfig

__all__ = [
    "attach_kv_events",
    "with_tokenizer",
    "AdmissionConfig",
    "AuthConfig",
    "CircuitConfig",
    "ConfigError",
    "ConfigIssue",
    "DispatchConfig",
    "EndpointConfig",
    "KVEventsConfig",
    "LoadedConfig",
    "LimitsConfig",
    "PluginSpec",
    "PoolConfig",
    "PoolSelectorConfig",
    "PrefixHashingConfig",
    "ProfileConfig",
    "ProfilePluginRef",
    "RouterConfig",
    "ShutdownConfig",
    "TimeoutsConfig",
    "TokenizerConfig",
    "TracingConfig",
    "UpstreamTLSConfig",
    "decode_config",
    "load_config",
    "parse_config_document",
    "parse_config_text",
    "parse_endpoint_arg",
    "read_config",
]
