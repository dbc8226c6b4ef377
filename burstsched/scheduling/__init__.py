"""The scheduling engine: runs a profile of plugins for one request or one group."""

from burstsched.scheduling.builder import PreviousPlugins, build_plugins, build_profile, build_scheduler
from burstsched.scheduling.contract import Decider
from burstsched.scheduling.profile import SchedulerProfile, WeightedScorer
from burstsched.scheduling.scheduler import (
    NoEndpointsError,
    PluginContractError,
    PluginObserver,
    Scheduler,
    clamp_score,
)

__all__ = [
    "Decider",
    "NoEndpointsError",
    "PluginContractError",
    "PluginObserver",
    "PreviousPlugins",
    "Scheduler",
    "SchedulerProfile",
    "WeightedScorer",
    "build_plugins",
    "build_profile",
    "build_scheduler",
    "clamp_score",
]
