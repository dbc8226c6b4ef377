"""Contracts between the scheduling engine and its plugins.

Plugins import from here only; the engine lives in :mod:`burstsched.scheduling`.
"""

from burstsched.framework.plugins import (
    DispatchHook,
    EndpointForgetter,
    Filter,
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
from burstsched.framework.state import CycleState, PrefixMatch
from burstsched.framework.types import ApiKind, Decision, EndpointSnapshot, SchedRequest, ScoredEndpoint

__all__ = [
    "ENTRY_POINT_GROUP",
    "ApiKind",
    "CycleState",
    "Decision",
    "DispatchHook",
    "EndpointForgetter",
    "EndpointSnapshot",
    "Filter",
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
    "SchedRequest",
    "ScoredEndpoint",
    "Scorer",
]
