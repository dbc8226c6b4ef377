"""What the replicas' KV caches hold, learned from their KV-cache events: addresses, streams and the hub."""

from burstsched.kvcache.addresses import StreamAddress, stream_addresses
from burstsched.kvcache.hub import HubObserver, KVEventHub
from burstsched.kvcache.stream import EventStream, Replayed, StreamSink

__all__ = [
    "EventStream",
    "HubObserver",
    "KVEventHub",
    "Replayed",
    "StreamAddress",
    "StreamSink",
    "stream_addresses",
]
