"""Contracts between the scheduling engine and its plugins.

Plugins import from here only; the engine lives in :mod:`burstsched.scheduling`.
"""

from burstsched.config.labels import check_label_key, check_label_value
from burstsched.framework.plugins import (
    DispatchHook,
    EndpointEcho,
    EndpointForgetter,
    Filter,
    HeaderReader,
    KVEventConsumer,
    Picker,
    Plugin,
    Producer,
    Resettable,
    Scorer,
)
from burstsched.framework.registry import (
    ENTRY_POINT_GROUP,
    PluginContext,
    PluginFactory,
    PluginParameters,
    PluginRegistry,
    PluginTypeError,
)
from burstsched.framework.saturation import Saturation, SaturationDetector
from burstsched.framework.state import CycleState, PrefixMatch
from burstsched.framework.types import (
    ApiKind,
    Decision,
    EndpointSnapshot,
    SchedRequest,
    ScoredEndpoint,
    TtftEstimate,
    tokens_past,
    uncached_tokens,
)
from burstsched.prefix.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KVEvent

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "KVEvent",
    "ENTRY_POINT_GROUP",
    "ApiKind",
    "CycleState",
    "Decision",
    "DispatchHook",
    "EndpointEcho",
    "EndpointForgetter",
    "EndpointSnapshot",
    "Filter",
    "HeaderReader",
    "KVEventConsumer",
    "Picker",
    "Plugin",
    "PluginContext",
    "PluginFactory",
    "PluginParameters",
    "PluginRegistry",
    "PluginTypeError",
    "PrefixMatch",
    "Producer",
    "Resettable",
    "Saturation",
    "SaturationDetector",
    "SchedRequest",
    "ScoredEndpoint",
    "Scorer",
    "TtftEstimate",
    "tokens_past",
    "uncached_tokens",
    "check_label_key",
    "check_label_value",
]
