"""The router's configuration: models, loading and the JSON schema."""

from burstsched.config.admission import AdmissionConfig
from burstsched.config.errors import ConfigError, ConfigIssue
from burstsched.config.flow_control import FlowControlConfig, HeadroomConfig, QueueBoundsConfig
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
    DiscoveryConfig,
    DispatchConfig,
    EndpointConfig,
    LimitsConfig,
    MetricsConfig,
    PluginSpec,
    PoolConfig,
    PoolSelectorConfig,
    PrefixHashingConfig,
    ProfileConfig,
    ProfilePluginRef,
    RecordingConfig,
    RouterConfig,
    ShutdownConfig,
    TimeoutsConfig,
    TracingConfig,
    UpstreamTLSConfig,
)
from burstsched.config.prewarm import PrewarmConfig
from burstsched.config.saturation import SaturationConfig
from burstsched.config.tokenizer import TokenizerConfig

__all__ = [
    "attach_kv_events",
    "with_tokenizer",
    "AdmissionConfig",
    "AuthConfig",
    "CircuitConfig",
    "ConfigError",
    "ConfigIssue",
    "FlowControlConfig",
    "HeadroomConfig",
    "QueueBoundsConfig",
    "DiscoveryConfig",
    "DispatchConfig",
    "EndpointConfig",
    "KVEventsConfig",
    "LoadedConfig",
    "LimitsConfig",
    "PluginSpec",
    "PoolConfig",
    "PoolSelectorConfig",
    "PrefixHashingConfig",
    "PrewarmConfig",
    "ProfileConfig",
    "ProfilePluginRef",
    "RouterConfig",
    "SaturationConfig",
    "ShutdownConfig",
    "TimeoutsConfig",
    "TokenizerConfig",
    "MetricsConfig",
    "RecordingConfig",
    "TracingConfig",
    "UpstreamTLSConfig",
    "decode_config",
    "load_config",
    "parse_config_document",
    "parse_config_text",
    "parse_endpoint_arg",
    "read_config",
]
