"""The event contract (``docs/events.md``): what a publisher sends to the events topic, and
what the engine's validator (:func:`state.events.parse_events`) decodes, as the same msgspec
structs, one per kind.

Installed with the agents, so it imports msgspec and the standard library only: the proxy and
``quotastream brokers`` build their events with these structs and encode them with
:func:`encode`; the engine decodes with them, then checks ranges, time bounds and topic names
over whole columns (numpy, pandas and pyarrow: not here). Constraints (``Meta``) are checked on
decode, not on construction: a publisher's output is held to them by
``tests/test_event_contract.py``, which feeds every publisher's events to the validator.

Encoded, an event of a kind with optional fields (``remote_copy``, ``remote_fetch``,
``replication``, ``remote_segment``) leaves out each field at its default, ``count`` of 1
included, as the bridge, the metrics source and ``simulate`` always wrote them; ``produce``,
``fetch`` and ``leader_epochs`` events carry every field, as the proxy and the lineage source
always wrote them. Either way, what decodes is what was built.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta


class EventKind(StrEnum):
    PRODUCE = "produce"
    FETCH = "fetch"
    REMOTE_COPY = "remote_copy"
    REMOTE_FETCH = "remote_fetch"
    REPLICATION = "replication"
    REMOTE_SEGMENT = "remote_segment"
    LEADER_EPOCHS = "leader_epochs"


#: Events about what storage holds, not traffic in a window: no relative past bound.
STORAGE_KINDS = (EventKind.REMOTE_SEGMENT.value, EventKind.LEADER_EPOCHS.value)


class RejectReason(StrEnum):
    """Why a payload was rejected; a small fixed set, so it can label a counter."""

    TOO_LARGE = "too_large"
    INVALID_UTF8 = "invalid_utf8"
    INVALID_JSON = "invalid_json"
    TOO_DEEP = "too_deep"
    NOT_AN_OBJECT = "not_an_object"
    UNKNOWN_KIND = "unknown_kind"
    MISSING_FIELD = "missing_field"
    WRONG_TYPE = "wrong_type"
    INVALID_VALUE = "invalid_value"
    NEGATIVE_BYTES = "negative_bytes"
    TS_OUT_OF_BOUNDS = "ts_out_of_bounds"
    INVALID_TOPIC = "invalid_topic"


_INT64_MAX = 2**63 - 1
Int64 = Annotated[int, Meta(ge=-(2**63), le=_INT64_MAX)]
Count = Annotated[int, Meta(ge=1, le=_INT64_MAX)]
BrokerId = Annotated[int, Meta(ge=0, le=2**31 - 1)]
Partition = Annotated[int, Meta(ge=0, le=2**31 - 1)]
Offset = Annotated[int, Meta(ge=0, le=_INT64_MAX)]
LeaderEpoch = Annotated[int, Meta(ge=0, le=2**31 - 1)]
#: Leader epoch -> its first offset (Kafka's ``segmentLeaderEpochs`` / leader-epoch checkpoint).
EpochOffsets = Annotated[dict[LeaderEpoch, Offset], Meta(min_length=1, max_length=10_000)]
User = Annotated[str, Meta(min_length=1, max_length=1024)]
ClientId = Annotated[str, Meta(max_length=1024)]
Topic = Annotated[str, Meta(max_length=1024)]


class Event(msgspec.Struct, tag_field="kind", kw_only=True, gc=False):
    ts: Int64
    bytes: Int64
    count: Count = 1

    @property
    def kind(self) -> str:
        """The event's kind: its tag, which msgspec writes as ``kind``."""
        return str(self.__struct_config__.tag)


class Produce(Event, tag="produce", kw_only=True):
    user: User
    client_id: ClientId
    broker: BrokerId


class Fetch(Produce, tag="fetch", kw_only=True):
    pass


class RemoteCopy(Event, tag="remote_copy", kw_only=True, omit_defaults=True):
    broker: BrokerId
    topic: Topic
    partition: Partition
    client_id: ClientId | None = None


class RemoteFetch(Event, tag="remote_fetch", kw_only=True, omit_defaults=True):
    broker: BrokerId
    topic: Topic
    #: None: the topic's partitions together (a broker's per-topic counter).
    partition: Partition | None = None
    client_id: ClientId | None = None


#: What a replication event names about the fetch, all or none.
_REPLICA_FIELDS: Final = ("topic", "partition", "replica", "in_sync")


class Replication(Event, tag="replication", kw_only=True, omit_defaults=True):
    broker: BrokerId
    role: Literal["leader", "follower"]
    #: All four, or none: a broker-wide count (a broker's replication counters name no
    #: partition, replica, throttle or ISR).
    topic: Topic | None = None
    partition: Partition | None = None
    replica: BrokerId | None = None
    in_sync: bool | None = None

    def __post_init__(self) -> None:
        missing = [name for name in _REPLICA_FIELDS if getattr(self, name) is None]
        if missing and len(missing) < len(_REPLICA_FIELDS):
            raise ValueError(
                f"Object missing required field `{missing[0]}`: a replication event names its "
                "topic, partition, replica and in_sync, or none of them (a broker-wide count)"
            )


class RemoteSegment(Event, tag="remote_segment", kw_only=True, omit_defaults=True):
    broker: BrokerId
    topic: Topic
    partition: Partition
    leader_epoch: LeaderEpoch  # the segment's last epoch
    segment_id: Annotated[str, Meta(min_length=1, max_length=256)]
    state: Literal["copy_finished", "delete_finished"]
    #: Every epoch of the segment's records with its first offset (default: leader_epoch).
    segment_leader_epochs: EpochOffsets | None = None
    end_offset: Offset | None = None


class LeaderEpochs(Event, tag="leader_epochs", kw_only=True):
    """A partition's leader-epoch lineage as its leader has it (KIP-852's retention needs it)."""

    bytes: Int64 = 0
    broker: BrokerId
    topic: Topic
    partition: Partition
    epochs: EpochOffsets
    log_end_offset: Offset


EVENT_TYPES: tuple[type[Event], ...] = (
    Produce,
    Fetch,
    RemoteCopy,
    RemoteFetch,
    Replication,
    RemoteSegment,
    LeaderEpochs,
)
#: Any event, as the validator decodes it.
AnyEvent = Produce | Fetch | RemoteCopy | RemoteFetch | Replication | RemoteSegment | LeaderEpochs

_ENCODER: Final = msgspec.json.Encoder()


def encode(event: Event) -> bytes:
    """One event as a message's JSON (or an element of a batched message)."""
    return _ENCODER.encode(event)


def dead_letter_record(
    reason: str, detail: str, payload: bytes, source: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A rejected payload as the dead-letter sinks write it: the original text, or base64 where
    it is not UTF-8; ``source``: where it was read (a Kafka record's ``topic``, ``partition``,
    ``offset`` and ``index``, its place in a batched message or null)."""
    record: dict[str, Any] = {"reason": reason, "detail": detail}
    try:
        record["payload"] = payload.decode("utf-8")
    except UnicodeDecodeError:
        record["payload_base64"] = base64.b64encode(payload).decode("ascii")
    if source is not None:
        record["source"] = dict(source)
    return record
