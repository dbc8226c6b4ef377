"""vLLM's KV-cache events: typed events, and their wire format in both encodings.

A publisher (vLLM, or the simulator) sends ZMQ multipart messages of three frames::

    [topic (utf-8), sequence number (8 bytes, big-endian, from 0), payload (msgpack)]

The payload is an event batch ``[ts, [event, ...], data_parallel_rank]``. Each event is either a
msgpack map tagged by ``type`` (``{"type": "BlockStored", "block_hashes": [...], ...}``, vLLM 0.32 and
later, fields equal to their default left out) or, in older versions, a tagged array in field order
with trailing defaults left out (``["BlockStored", block_hashes, parent_block_hash, token_ids, ...]``).
:func:`decode_batch` accepts both, even mixed in one batch; :func:`encode_batch` writes either.

The replay socket (ROUTER) answers a request ``[b"", start_seq (8 bytes)]`` with one
``[b"", topic, seq, payload]`` per buffered batch from ``start_seq`` on, then ``[b"", b"", seq -1, b""]``
(vLLM 0.32; older notes described the frames without the topic, and a reader accepts both).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgpack

Encoding = Literal["map", "array"]
REPLAY_END_SEQ = -1
MEDIUM_GPU = "GPU"


class KVEventDecodeError(ValueError):
    """A message or payload that is not a KV-event batch."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks that entered the prefix cache; ``token_ids`` holds all of them, in order."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = MEDIUM_GPU
    lora_name: str | None = None
    extra_keys: tuple[Any, ...] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks evicted from the prefix cache."""

    block_hashes: tuple[int, ...]
    medium: str | None = MEDIUM_GPU
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The whole prefix cache was reset."""


@dataclass(frozen=True, slots=True)
class UnknownEvent:
    """An event of a type this decoder does not know; kept so consumers can log it."""

    type: str


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared | UnknownEvent


@dataclass(frozen=True, slots=True)
class EventBatch:
    """The events of one engine step."""

    ts: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None = None


@dataclass(frozen=True, slots=True)
class KVEventMessage:
    """One received message: topic, sequence number and batch."""

    topic: str
    seq: int
    batch: EventBatch


_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
)
_STORED_REQUIRED = 7  # block_hashes … lora_name have no default in vLLM: always written
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
_REMOVED_REQUIRED = 2


def encode_seq(seq: int) -> bytes:
    """A sequence number as the 8-byte big-endian frame vLLM sends (-1 marks a replay's end)."""
    return seq.to_bytes(8, "big", signed=seq < 0)


def decode_seq(frame: bytes) -> int:
    """The sequence number in a frame; the replay end marker decodes to -1."""
    if len(frame) != 8:
        raise KVEventDecodeError(f"sequence frame has {len(frame)} bytes, expected 8")
    value = int.from_bytes(frame, "big")
    return REPLAY_END_SEQ if value == 2**64 - 1 else value


def encode_batch(batch: EventBatch, encoding: Encoding = "map") -> bytes:
    """The msgpack payload of ``batch``, events as tagged maps or tagged arrays."""
    events = [_encode_event(e, encoding) for e in batch.events]
    packed: bytes = msgpack.packb([batch.ts, events, batch.data_parallel_rank], use_bin_type=True)
    return packed


def decode_batch(payload: bytes) -> EventBatch:
    """The batch in a msgpack payload (either event encoding; batch as array or map)."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise KVEventDecodeError(f"payload is not msgpack: {exc}") from exc
    if isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, list) and len(raw) in (2, 3):
        ts, events = raw[0], raw[1]
        rank = raw[2] if len(raw) == 3 else None
    else:
        raise KVEventDecodeError("payload is not an event batch [ts, events, data_parallel_rank]")
    if not isinstance(ts, int | float) or not isinstance(events, list):
        raise KVEventDecodeError("event batch needs a numeric ts and a list of events")
    if rank is not None and not isinstance(rank, int):
        raise KVEventDecodeError("data_parallel_rank must be an int or None")
    return EventBatch(float(ts), tuple(_decode_event(e) for e in events), rank)


def decode_message(frames: Sequence[bytes]) -> KVEventMessage:
    """A received PUB message ``[topic, seq, payload]``."""
    if len(frames) != 3:
        raise KVEventDecodeError(f"expected 3 frames (topic, seq, payload), got {len(frames)}")
    try:
        topic = frames[0].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KVEventDecodeError("topic is not utf-8") from exc
    return KVEventMessage(topic, decode_seq(frames[1]), decode_batch(frames[2]))


def _encode_event(event: KVEvent, encoding: Encoding) -> Any:
    if isinstance(event, BlockStored):
        values = [
            list(event.block_hashes),
            event.parent_block_hash,
            list(event.token_ids),
            event.block_size,
            event.lora_id,
            event.medium,
            event.lora_name,
            list(event.extra_keys) if event.extra_keys is not None else None,
            event.group_idx,
            event.kv_cache_spec_kind,
            event.kv_cache_spec_sliding_window,
        ]
        return _tagged("BlockStored", _STORED_FIELDS, values, _STORED_REQUIRED, encoding)
    if isinstance(event, BlockRemoved):
        values = [list(event.block_hashes), event.medium, event.group_idx]
        return _tagged("BlockRemoved", _REMOVED_FIELDS, values, _REMOVED_REQUIRED, encoding)
    if isinstance(event, AllBlocksCleared):
        return {"type": "AllBlocksCleared"} if encoding == "map" else ["AllBlocksCleared"]
    raise TypeError(f"cannot encode {event!r}")


def _tagged(tag: str, fields: Sequence[str], values: list[Any], required: int, encoding: Encoding) -> Any:
    """Like msgspec with ``omit_defaults``: optional fields left out when None (trailing ones, for arrays)."""
    if encoding == "map":
        out: dict[str, Any] = {"type": tag}
        for i, (name, value) in enumerate(zip(fields, values, strict=True)):
            if i < required or value is not None:
                out[name] = value
        return out
    end = len(values)
    while end > required and values[end - 1] is None:
        end -= 1
    return [tag, *values[:end]]


def _decode_event(raw: Any) -> KVEvent:
    if isinstance(raw, dict):
        tag = raw.get("type")
        fields = raw
    elif isinstance(raw, list) and raw and isinstance(raw[0], str):
        tag = raw[0]
        names = _STORED_FIELDS if tag == "BlockStored" else _REMOVED_FIELDS if tag == "BlockRemoved" else ()
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        raise KVEventDecodeError(f"event is neither a tagged map nor a tagged array: {raw!r:.80}")
    if not isinstance(tag, str):
        raise KVEventDecodeError("event has no string type tag")
    if tag == "BlockStored":
        return BlockStored(
            block_hashes=_int_tuple(fields.get("block_hashes"), "block_hashes"),
            parent_block_hash=_opt_int(fields.get("parent_block_hash"), "parent_block_hash"),
            token_ids=_int_tuple(fields.get("token_ids"), "token_ids"),
            block_size=_int(fields.get("block_size"), "block_size"),
            lora_id=_opt_int(fields.get("lora_id"), "lora_id"),
            medium=_opt_str(fields.get("medium"), "medium"),
            lora_name=_opt_str(fields.get("lora_name"), "lora_name"),
            extra_keys=_opt_tuple(fields.get("extra_keys")),
            group_idx=_opt_int(fields.get("group_idx"), "group_idx"),
            kv_cache_spec_kind=_opt_str(fields.get("kv_cache_spec_kind"), "kv_cache_spec_kind"),
            kv_cache_spec_sliding_window=_opt_int(
                fields.get("kv_cache_spec_sliding_window"), "kv_cache_spec_sliding_window"
            ),
        )
    if tag == "BlockRemoved":
        return BlockRemoved(
            block_hashes=_int_tuple(fields.get("block_hashes"), "block_hashes"),
            medium=_opt_str(fields.get("medium"), "medium"),
            group_idx=_opt_int(fields.get("group_idx"), "group_idx"),
        )
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return UnknownEvent(tag)


def _int(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise KVEventDecodeError(f"{name} must be an int, got {value!r:.40}")
    return value


def _opt_int(value: Any, name: str) -> int | None:
    return None if value is None else _int(value, name)


def _opt_str(value: Any, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise KVEventDecodeError(f"{name} must be a string, got {value!r:.40}")
    return value


def _int_tuple(value: Any, name: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise KVEventDecodeError(f"{name} must be a list of ints")
    return tuple(_int(v, name) for v in value)


def _opt_tuple(value: Any) -> tuple[Any, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise KVEventDecodeError("extra_keys must be a list")
    return tuple(tuple(v) if isinstance(v, list) else v for v in value)
