"""Traffic recording: one JSON line per dispatched request, for ``burstsched replay`` (schema: README.md)."""

from burstsched.recording.line import LINE_VERSION, REPLICA_KIND, Usage, hex_chain, parse_chain, usage_of
from burstsched.recording.recorder import RecordedRequest, Recorder
from burstsched.recording.writer import RotatingFile

__all__ = [
    "LINE_VERSION",
    "REPLICA_KIND",
    "RecordedRequest",
    "Recorder",
    "RotatingFile",
    "Usage",
    "hex_chain",
    "parse_chain",
    "usage_of",
]
