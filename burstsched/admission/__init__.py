"""Burst admission: hold cold requests a few milliseconds, group them by shared prefix, place each group.

The app calls :meth:`Admission.admit` once per request; the parts it is built from (the window, the pure
grouping and assignment functions, the placement on the scheduler) are exported for tests and reuse.
"""

from burstsched.admission.assign import SHARING_ROLES, Limits, Rank, Role, Slot, assign, group_cap
from burstsched.admission.clock import Clock, LoopClock, ManualClock
from burstsched.admission.errors import (
    AdmissionClosed,
    AdmissionError,
    AdmissionQueueFull,
    NoEndpointAvailable,
)
from burstsched.admission.facade import Admission, Admitted
from burstsched.admission.grouping import Group, group_requests
from burstsched.admission.placement import GroupPlacer, Placed, Produced, Snapshots, warm_blocks
from burstsched.admission.window import AdmissionWindow, Batch
from burstsched.config.admission import AdmissionConfig

__all__ = [
    "Admission",
    "AdmissionClosed",
    "AdmissionConfig",
    "AdmissionError",
    "AdmissionQueueFull",
    "AdmissionWindow",
    "Admitted",
    "Batch",
    "Clock",
    "Group",
    "GroupPlacer",
    "Limits",
    "LoopClock",
    "ManualClock",
    "NoEndpointAvailable",
    "Placed",
    "Produced",
    "Rank",
    "Role",
    "SHARING_ROLES",
    "Slot",
    "Snapshots",
    "assign",
    "group_cap",
    "group_requests",
    "warm_blocks",
]
