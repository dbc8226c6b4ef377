"""Flow control: the router's own queue while the pool has no room, released by priority, fairness and
prefix as endpoints get room (:mod:`.queue`); when an endpoint has room (:mod:`.headroom`); who a request
is for (:mod:`.identity`)."""

from burstsched.flow.headroom import Reserved, Room, room_of
from burstsched.flow.identity import Identity, identify
from burstsched.flow.queue import Disconnected, FlowMetrics, FlowQueue, FlowRefused, Released, RoomSource

__all__ = [
    "Disconnected",
    "FlowMetrics",
    "FlowQueue",
    "FlowRefused",
    "Identity",
    "Released",
    "Reserved",
    "Room",
    "RoomSource",
    "identify",
    "room_of",
]
