"""Flow control: the router's own queue while the pool has no room, released by priority, fairness and
prefix as endpoints get room (:mod:`.queue`); when an endpoint has room (:mod:`.headroom`); who a request
is for (:mod:`.identity`); program-aware fairness (:mod:`.fairness`), per-priority dispatch ceilings
(:mod:`.ceiling`) and the probabilistic admitter (:mod:`.admitter`), as llm-d's flow control has them."""

from burstsched.flow.admitter import ProbabilisticAdmitter
from burstsched.flow.headroom import Reserved, Room, room_of
from burstsched.flow.identity import Identity, identify
from burstsched.flow.queue import Disconnected, FlowMetrics, FlowQueue, FlowRefused, Released, RoomSource

__all__ = [
    "Disconnected",
    "FlowMetrics",
    "FlowQueue",
    "FlowRefused",
    "Identity",
    "ProbabilisticAdmitter",
    "Released",
    "Reserved",
    "Room",
    "RoomSource",
    "identify",
    "room_of",
]
