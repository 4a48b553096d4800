"""Remote segments' lifecycle, from ``__remote_log_metadata``'s records to the engine's
``remote_segment`` events, and each upload's ``remote_copy`` event (``docs/events.md``).

Kafka writes a segment's upload as a record of its metadata in state ``COPY_SEGMENT_STARTED``
(offsets, leader epochs, size), then an update to ``COPY_SEGMENT_FINISHED`` that repeats none of
it; its deletion as two updates, ``DELETE_SEGMENT_STARTED`` then ``DELETE_SEGMENT_FINISHED``. The
engine counts a segment from its ``copy_finished`` event until its ``delete_finished`` one, with
its size and epochs on both: so a started upload is remembered until it finishes, and a finished
one until it is deleted. Each upload's start is also the bytes Kafka's copy quota (KIP-956)
records for it, per partition: a ``remote_copy`` event. A segment's records are in one
partition of the metadata topic (Kafka picks it by the segment's topic partition), in the order
they were written.

Pure: records in, events out; what to do with what it refuses is the caller's.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from quotastream.brokers.remote_log_metadata import (
    PARTITION_DELETE,
    PARTITION_DELETE_STATES,
    SEGMENT,
    SEGMENT_SNAPSHOT,
    SEGMENT_STATES,
    SEGMENT_UPDATE,
    Decoded,
    kafka_uuid,
)
from state.event_contract import RemoteCopy, RemoteSegment

COPY_STARTED, COPY_FINISHED, DELETE_STARTED, DELETE_FINISHED = (
    SEGMENT_STATES[state] for state in range(4)
)
PARTITION_DELETED = PARTITION_DELETE_STATES[2]
#: What a record makes: an upload's ``remote_copy``, a segment's ``remote_segment``.
SegmentEvent = RemoteCopy | RemoteSegment


class RefusedRecordError(ValueError):
    """A record that says something this lifecycle cannot follow; the message says what."""


@dataclass(frozen=True)
class _Segment:
    topic: str
    topic_id: uuid.UUID
    partition: int
    segment_id: str
    end_offset: int
    leader_epochs: dict[int, int]
    size: int
    finished: bool = False

    def event(
        self, state: Literal["copy_finished", "delete_finished"], broker: int, ts: int
    ) -> RemoteSegment:
        return RemoteSegment(
            ts=ts,
            broker=broker,
            topic=self.topic,
            partition=self.partition,
            leader_epoch=max(self.leader_epochs),
            segment_id=self.segment_id,
            state=state,
            bytes=self.size,
            segment_leader_epochs=dict(sorted(self.leader_epochs.items())),
            end_offset=self.end_offset,
        )


class SegmentLifecycle:
    """The segments whose upload started and that are not deleted yet, by segment id."""

    def __init__(self) -> None:
        self._segments: dict[str, _Segment] = {}

    def __len__(self) -> int:
        return len(self._segments)

    def apply(self, record: Decoded) -> list[SegmentEvent]:
        """The events ``record`` makes (none for a step the engine does not count), or
        :class:`RefusedRecordError`."""
        m = record.message
        if record.name == SEGMENT:
            return self._started(m)
        if record.name == SEGMENT_UPDATE:
            return self._updated(m)
        if record.name == PARTITION_DELETE:
            if PARTITION_DELETE_STATES.get(m.remote_partition_delete_state) != PARTITION_DELETED:
                return []
            # Its segments were deleted one by one before; an upload that never finished is
            # forgotten with its partition.
            gone = m.topic_id_partition
            for key, segment in list(self._segments.items()):
                if (segment.topic_id, segment.partition) == (gone.id, gone.partition):
                    del self._segments[key]
            return []
        if record.name == SEGMENT_SNAPSHOT:
            raise RefusedRecordError("a segment snapshot names no topic partition")
        raise RefusedRecordError(f"a {record.name}, which no rule here follows")

    def _started(self, m: Any) -> list[SegmentEvent]:
        state = _state(m.remote_log_segment_state)
        if state != COPY_STARTED:
            raise RefusedRecordError(f"a segment's metadata in state {state}")
        segment_id = m.remote_log_segment_id
        epochs = {e.leader_epoch: e.offset for e in m.segment_leader_epochs}
        if not epochs:
            raise RefusedRecordError("a segment without leader epochs")
        key = kafka_uuid(segment_id.id)
        if key in self._segments:
            return []
        segment = self._segments[key] = _Segment(
            topic=segment_id.topic_id_partition.name,
            topic_id=segment_id.topic_id_partition.id,
            partition=segment_id.topic_id_partition.partition,
            segment_id=key,
            end_offset=m.end_offset,
            leader_epochs=epochs,
            size=m.segment_size_in_bytes,
        )
        # The copy quota records the segment's size as the upload begins (RLMCopyTask: the
        # same FileRecords.sizeInBytes() this record carries), once per attempt.
        return [
            RemoteCopy(
                ts=m.event_timestamp_ms,
                broker=m.broker_id,
                topic=segment.topic,
                partition=segment.partition,
                bytes=segment.size,
            )
        ]

    def _updated(self, m: Any) -> list[SegmentEvent]:
        state = _state(m.remote_log_segment_state)
        key = kafka_uuid(m.remote_log_segment_id.id)
        segment = self._segments.get(key)
        if segment is None:
            raise RefusedRecordError(f"{state} for segment {key}, whose upload was not read")
        if state == COPY_FINISHED:
            self._segments[key] = dataclasses.replace(segment, finished=True)
            return [segment.event("copy_finished", m.broker_id, m.event_timestamp_ms)]
        if state == DELETE_FINISHED:
            del self._segments[key]
            if not segment.finished:  # never counted
                return []
            return [segment.event("delete_finished", m.broker_id, m.event_timestamp_ms)]
        if state == DELETE_STARTED:
            return []  # counted until its deletion finishes, as Kafka's RemoteLogSizeBytes
        raise RefusedRecordError(f"an update of segment {key} to {state}")


def _state(value: int) -> str:
    try:
        return SEGMENT_STATES[value]
    except KeyError:
        raise RefusedRecordError(f"segment state {value}, which Kafka does not define") from None
