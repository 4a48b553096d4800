"""``__remote_log_metadata`` to the engine's events topic: the remote log bridge of ``quotastream
brokers``.

Why a bridge and not a source of the engine: a segment's records need state across records (the
update that finishes an upload repeats none of its size, epochs or offsets), the engine's source
stays one topic of one validated contract, and the bridge runs next to the cluster while the
engine may run anywhere. What it publishes is ordinary ``remote_segment`` events.

Position. The bridge's position is the offsets committed per metadata partition in its consumer
group, each committed once the events of the records before it are acknowledged by the events
topic's brokers (``acks=all``). Every start (a new process, or a retry after a failure) reads
each metadata partition from its beginning (the topic keeps its records for ever, as Kafka's own
metadata manager rebuilds its cache from them) to rebuild which uploads started and which
segments live, and publishes only what comes from records at or after the committed position.
So a crash re-sends at most the records after the last commit (the engine counts a segment once
however often its events come), and a first start publishes the whole history once.

Order. Each event is keyed by its segment's topic partition, so all of a partition's events land
in one partition of the events topic, in the order Kafka wrote them: the engine never sees a
segment's copy after its delete, which would count it again once its tombstone is forgotten
(``state/remote_log.py``). The events of a poll go out through the agents' publisher
(:mod:`quotastream.publisher`), batched per key.

Refusals. A record the decoder or the lifecycle refuses goes to the engine's dead-letter topic
with the reason (``undecodable_record``, ``unfollowable_record``), the detail, the record's bytes
and its coordinates, and is counted; the bridge goes on.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from typing import Any

from kafka import TopicPartition
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata
from prometheus_client import CollectorRegistry, Counter, Gauge

from quotastream.brokers.remote_log_metadata import (
    RemoteLogMetadataSchemas,
    UndecodableRecordError,
)
from quotastream.brokers.segments import RefusedRecordError, SegmentEvent, SegmentLifecycle
from quotastream.clock import SYSTEM_CLOCK, Clock
from quotastream.outage import Outage
from quotastream.publisher import EventsPublisher
from state.event_contract import RemoteCopy, dead_letter_record

log = logging.getLogger(__name__)

UNDECODABLE = "undecodable_record"
UNFOLLOWABLE = "unfollowable_record"


class RemoteLogBridgeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.records = Counter(
            "quotastream_remote_log_records",
            "Records read from __remote_log_metadata, by whether their events were published "
            "now or before this start (replayed: read again to rebuild the segments' state)",
            ["read"],
            registry=registry,
        )
        self.events = Counter(
            "quotastream_remote_log_events_published",
            "Events published to the events topic: remote_copy, and remote_segment by state",
            ["event"],
            registry=registry,
        )
        self.too_old = Counter(
            "quotastream_remote_log_copies_too_old",
            "remote_copy events not published: older than events.max_past_ms, so the engine "
            "would reject them (a first start's history, or a long outage)",
            registry=registry,
        )
        self.dead_letters = Counter(
            "quotastream_remote_log_dead_letters",
            "Records of __remote_log_metadata sent to the dead-letter topic, by reason",
            ["reason"],
            registry=registry,
        )
        self.restarts = Counter(
            "quotastream_remote_log_restarts",
            "Times the bridge read the metadata topic again from its beginning after a failure",
            registry=registry,
        )
        self.segments = Gauge(
            "quotastream_remote_log_segments_followed",
            "Remote segments whose upload started and that are not deleted yet",
            registry=registry,
        )
        self.behind = Gauge(
            "quotastream_remote_log_records_behind",
            "Records of __remote_log_metadata not read yet (at the last poll)",
            registry=registry,
        )


class RemoteLogBridge:
    """Reads the metadata topic, publishes its segments' events; :meth:`run` until stopped.

    ``new_consumer()`` makes a kafka-python ``KafkaConsumer`` of the bridge's group on the
    cluster (no auto-commit), made again after a failure; ``publisher`` sends to the engine's
    events topic and its dead-letter topic, its producer closed after a failure.
    ``remote_copy`` events older than ``traffic_horizon_ms`` (the engine's
    ``events.max_past_ms``) are counted, not published: the engine would reject them, and no
    quota window counts them any more."""

    def __init__(
        self,
        schemas: RemoteLogMetadataSchemas,
        metadata_topic: str,
        *,
        new_consumer: Callable[[], Any],
        publisher: EventsPublisher,
        metrics: RemoteLogBridgeMetrics,
        poll_ms: int,
        retry_ms: int,
        max_retry_ms: int,
        server: str,
        traffic_horizon_ms: int | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._schemas = schemas
        self._metadata_topic = metadata_topic
        self._new_consumer = new_consumer
        self._publisher = publisher
        self._metrics = metrics
        self._poll_ms = poll_ms
        self._retry_ms = retry_ms
        self._max_retry_ms = max_retry_ms
        self._outage = Outage(
            server,
            math.inf,
            meanwhile="reading __remote_log_metadata again once it answers",
            clock=clock,
        )
        self._traffic_horizon_ms = traffic_horizon_ms
        self._clock = clock
        self._stopped = threading.Event()
        #: Set once a pass has read every partition up to where it was when the pass began.
        self.caught_up = threading.Event()

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        """Passes over the topic until :meth:`stop`; a failed pass is retried from the
        beginning after a backoff (doubling, up to ``max_retry_ms``)."""
        failed_in_a_row = 0
        while not self._stopped.is_set():
            try:
                self._pass()
            except (KafkaError, OSError) as error:
                # A pass that reached Kafka before it failed starts the backoff over.
                failed_in_a_row = 1 if not self._outage.down else failed_in_a_row + 1
                self._outage.failed(error)
                self._metrics.restarts.inc()
                self.caught_up.clear()
                wait_ms = min(self._retry_ms * 2 ** (failed_in_a_row - 1), self._max_retry_ms)
                self._stopped.wait(wait_ms / 1000)
            else:
                return

    def _pass(self) -> None:
        consumer = self._new_consumer()
        try:
            partitions = self._partitions(consumer)
            if partitions is None:
                return
            consumer.assign(partitions)
            committed = {tp: consumer.committed(tp) or 0 for tp in partitions}
            consumer.seek_to_beginning(*partitions)
            ends = consumer.end_offsets(partitions)
            self._publisher.producer()  # made now: a pass without one fails here
            self._outage.recovered()
            lifecycle = SegmentLifecycle()
            read = {tp: consumer.position(tp) for tp in partitions}
            while not self._stopped.is_set():
                batch = consumer.poll(timeout_ms=self._poll_ms)
                events: list[SegmentEvent] = []
                sent = []
                for tp, records in batch.items():
                    for record in records:
                        fresh = record.offset >= committed[tp]
                        published, letter = self._follow(lifecycle, record, fresh)
                        events += published
                        if letter is not None:
                            sent.append(self._publisher.send_dead_letter(letter))
                        read[tp] = record.offset + 1
                sent += self._publisher.send(events, key_of=_partition_key)
                self._metrics.segments.set(len(lifecycle))
                advanced = {tp: offset for tp, offset in read.items() if offset > committed[tp]}
                if advanced:
                    # Raises what failed to send: retried from here.
                    self._publisher.confirm(sent, timeout_s=None)
                    consumer.commit(
                        {tp: OffsetAndMetadata(offset, "", -1) for tp, offset in advanced.items()}
                    )
                    committed.update(advanced)
                if not self.caught_up.is_set() and all(read[tp] >= ends[tp] for tp in partitions):
                    log.info(
                        "caught up with %s: %d segments followed",
                        self._metadata_topic,
                        len(lifecycle),
                    )
                    self.caught_up.set()
                self._metrics.behind.set(self._behind(consumer, partitions))
        finally:
            consumer.close()
            # What it could not send is not committed: the next pass sends it again.
            self._publisher.close()

    def _partitions(self, consumer: Any) -> list[TopicPartition] | None:
        """The metadata topic's partitions, once it exists (Kafka creates it with the first
        tiered topic); None if stopped meanwhile."""
        waited = False
        while not self._stopped.is_set():
            numbers = consumer.partitions_for_topic(self._metadata_topic)
            if numbers:
                return [TopicPartition(self._metadata_topic, n) for n in sorted(numbers)]
            if not waited:
                log.info("%s does not exist yet: waiting for it", self._metadata_topic)
                waited = True
            self._stopped.wait(self._poll_ms / 1000)
        return None

    def _follow(
        self, lifecycle: SegmentLifecycle, record: Any, fresh: bool
    ) -> tuple[list[SegmentEvent], dict[str, Any] | None]:
        """Applies one record; if ``fresh``, the events to publish (or its dead letter)."""
        self._metrics.records.labels("now" if fresh else "replayed").inc()
        try:
            events = lifecycle.apply(self._schemas.decode(record.value))
        except (UndecodableRecordError, RefusedRecordError) as error:
            if not fresh:
                return [], None
            reason = UNDECODABLE if isinstance(error, UndecodableRecordError) else UNFOLLOWABLE
            source = {
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
                "index": None,
            }
            log.warning(
                "%s-%d@%d sent to the dead letter: %s",
                record.topic,
                record.partition,
                record.offset,
                error,
            )
            self._metrics.dead_letters.labels(reason).inc()
            return [], dead_letter_record(reason, str(error), record.value or b"", source)
        if not fresh:
            return [], None
        published = []
        oldest = (
            None
            if self._traffic_horizon_ms is None
            else self._clock.wall_ms() - self._traffic_horizon_ms
        )
        for event in events:
            if isinstance(event, RemoteCopy):
                if oldest is not None and event.ts < oldest:
                    self._metrics.too_old.inc()
                    continue
                self._metrics.events.labels(event.kind).inc()
            else:
                self._metrics.events.labels(event.state).inc()
            published.append(event)
        return published, None

    @staticmethod
    def _behind(consumer: Any, partitions: list[TopicPartition]) -> int:
        behind = 0
        for tp in partitions:
            end = consumer.highwater(tp)
            if end is not None:
                behind += max(end - consumer.position(tp), 0)
        return behind


def _partition_key(event: SegmentEvent) -> bytes:
    """An event's key: its segment's topic partition (one partition of the events topic
    keeps their order)."""
    return f"{event.topic}-{event.partition}".encode()
