"""Remote segments' lifecycle: ``__remote_log_metadata``'s records to ``remote_segment`` events
(quotastream/brokers/segments.py). The records are built here by their decoded field names; the
decoding itself, and the lifecycle on records a real cluster wrote, are in
tests/test_remote_log_metadata.py."""

from __future__ import annotations

import uuid
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quotastream.brokers.remote_log_metadata import (
    PARTITION_DELETE,
    SEGMENT,
    SEGMENT_SNAPSHOT,
    SEGMENT_UPDATE,
    Decoded,
    kafka_uuid,
)
from quotastream.brokers.segments import RefusedRecordError, SegmentEvent, SegmentLifecycle
from state.event_contract import RemoteCopy, RemoteSegment
from tests.support.published import assert_all_accepted

TOPIC_ID = uuid.UUID(int=7)
COPY_STARTED, COPY_FINISHED, DELETE_STARTED, DELETE_FINISHED = range(4)


def partition(number: int = 0) -> SimpleNamespace:
    return SimpleNamespace(name="tiered", id=TOPIC_ID, partition=number)


def started(segment: uuid.UUID, *, number: int = 0, state: int = COPY_STARTED) -> Decoded:
    message = SimpleNamespace(
        remote_log_segment_id=SimpleNamespace(topic_id_partition=partition(number), id=segment),
        start_offset=10,
        end_offset=19,
        broker_id=2,
        event_timestamp_ms=900,
        segment_leader_epochs=[
            SimpleNamespace(leader_epoch=0, offset=10),
            SimpleNamespace(leader_epoch=3, offset=15),
        ],
        segment_size_in_bytes=8_560,
        remote_log_segment_state=state,
    )
    return Decoded(SEGMENT, 0, message)


def updated(segment: uuid.UUID, state: int, *, at: int = 1_000, number: int = 0) -> Decoded:
    message = SimpleNamespace(
        remote_log_segment_id=SimpleNamespace(topic_id_partition=partition(number), id=segment),
        broker_id=3,
        event_timestamp_ms=at,
        remote_log_segment_state=state,
    )
    return Decoded(SEGMENT_UPDATE, 0, message)


def partition_deleted(state: int, number: int = 0) -> Decoded:
    message = SimpleNamespace(
        topic_id_partition=partition(number), remote_partition_delete_state=state
    )
    return Decoded(PARTITION_DELETE, 0, message)


def events(lifecycle: SegmentLifecycle, records: list[Decoded]) -> list[SegmentEvent]:
    return [event for record in records for event in lifecycle.apply(record)]


def segment_events(lifecycle: SegmentLifecycle, records: list[Decoded]) -> list[RemoteSegment]:
    """The ``remote_segment`` events of ``records`` (not their uploads' ``remote_copy``)."""
    return [e for e in events(lifecycle, records) if isinstance(e, RemoteSegment)]


def test_an_upload_counts_from_its_finish_to_its_deletions_finish() -> None:
    segment = uuid.uuid4()
    lifecycle = SegmentLifecycle()
    made = events(
        lifecycle,
        [
            started(segment),
            updated(segment, COPY_FINISHED, at=1_000),
            updated(segment, DELETE_STARTED, at=5_000),
            updated(segment, DELETE_FINISHED, at=5_100),
        ],
    )
    expected: dict[str, Any] = {
        "broker": 3,
        "topic": "tiered",
        "partition": 0,
        "leader_epoch": 3,
        "segment_id": kafka_uuid(segment),
        "bytes": 8_560,
        "segment_leader_epochs": {0: 10, 3: 15},
        "end_offset": 19,
    }
    assert made == [
        # What the copy quota records as the upload begins.
        RemoteCopy(ts=900, broker=2, topic="tiered", partition=0, bytes=8_560),
        RemoteSegment(**expected, ts=1_000, state="copy_finished"),
        RemoteSegment(**expected, ts=5_100, state="delete_finished"),
    ]
    assert len(lifecycle) == 0  # forgotten once deleted


def test_an_upload_that_never_finished_never_counts_and_goes_with_its_partition() -> None:
    segment = uuid.uuid4()
    lifecycle = SegmentLifecycle()
    assert segment_events(lifecycle, [started(segment), partition_deleted(0)]) == []
    assert len(lifecycle) == 1  # marked for deletion: not gone yet
    assert events(lifecycle, [partition_deleted(2, number=1)]) == []
    assert len(lifecycle) == 1  # another partition's
    assert events(lifecycle, [partition_deleted(2)]) == []
    assert len(lifecycle) == 0
    other = uuid.uuid4()
    assert segment_events(lifecycle, [started(other), updated(other, DELETE_FINISHED)]) == []


@pytest.mark.parametrize(
    ("records", "reason"),
    [
        ([updated(uuid.UUID(int=1), COPY_FINISHED)], "whose upload was not read"),
        (
            [started(uuid.UUID(int=1), state=COPY_FINISHED)],
            "metadata in state COPY_SEGMENT_FINISHED",
        ),
        ([started(uuid.UUID(int=1)), updated(uuid.UUID(int=1), 9)], "segment state 9"),
        (
            [started(uuid.UUID(int=1)), updated(uuid.UUID(int=1), COPY_STARTED)],
            "to COPY_SEGMENT_STARTED",
        ),
        ([Decoded(SEGMENT_SNAPSHOT, 0, SimpleNamespace())], "names no topic partition"),
    ],
    ids=["unknown-segment", "metadata-not-started", "unknown-state", "restarted", "snapshot"],
)
def test_a_record_the_lifecycle_cannot_follow_is_refused_with_the_reason(
    records: list[Decoded], reason: str
) -> None:
    lifecycle = SegmentLifecycle()
    *before, last = records
    events(lifecycle, before)
    with pytest.raises(RefusedRecordError, match=reason):
        lifecycle.apply(last)


LIVES = {
    "interrupted": [COPY_STARTED],
    "uploaded": [COPY_STARTED, COPY_FINISHED],
    "deleted": [COPY_STARTED, COPY_FINISHED, DELETE_STARTED, DELETE_FINISHED],
}
#: The events each life makes.
COUNTED = {
    "interrupted": [],
    "uploaded": ["copy_finished"],
    "deleted": ["copy_finished", "delete_finished"],
}


@given(
    lives=st.lists(st.sampled_from(sorted(LIVES)), min_size=1, max_size=6),
    order=st.randoms(use_true_random=False),
)
def test_segments_interleaved_in_any_order_make_the_same_events(
    lives: list[str], order: Any
) -> None:
    """Each segment's records in the order Kafka wrote them, the segments interleaved anyhow:
    one remote_copy per upload started, one copy_finished per finished upload, one
    delete_finished per deletion, nothing else; each accepted by the engine's validator."""
    queues = []
    for number, life in enumerate(lives):
        segment = uuid.UUID(int=number + 1)
        queues.append(
            [started(segment)]
            + [updated(segment, state, at=i) for i, state in enumerate(LIVES[life][1:])]
        )
    interleaved = []
    while any(queues):
        queue = order.choice([q for q in queues if q])
        interleaved.append(queue.pop(0))
    lifecycle = SegmentLifecycle()
    made_all = events(lifecycle, interleaved)
    made = Counter((e.segment_id, e.state) for e in made_all if isinstance(e, RemoteSegment))
    # Every upload's start is one remote_copy, finished or not.
    assert sum(isinstance(e, RemoteCopy) for e in made_all) == len(lives)
    wanted = Counter(
        (kafka_uuid(uuid.UUID(int=number + 1)), state)
        for number, life in enumerate(lives)
        for state in COUNTED[life]
    )
    assert made == wanted
    assert len(lifecycle) == sum(life != "deleted" for life in lives)
    # What the bridge publishes of them, the engine's validator accepts.
    assert_all_accepted(made_all, max_message_bytes=65_536)
