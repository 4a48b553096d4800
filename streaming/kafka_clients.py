"""kafka-python clients as the engine uses them: consumers without a group, true end offsets."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from streaming.offsets import Offsets

log = logging.getLogger(__name__)


def new_consumer(bootstrap_servers: str, client: Mapping[str, Any]) -> KafkaConsumer:
    """A consumer that reads assigned partitions from given offsets and commits nothing.

    It never creates a topic by asking for it: a broker that lost its topics would otherwise
    recreate them with its default partition count, hiding the loss.
    """
    settings: dict[str, Any] = {
        "bootstrap_servers": bootstrap_servers.split(","),
        "group_id": None,
        "enable_auto_commit": False,
        "auto_offset_reset": "none",
        "allow_auto_create_topics": False,
        **client,
    }
    return KafkaConsumer(**settings)


def true_end_offsets(
    consumer: KafkaConsumer, partitions: Sequence[TopicPartition], timeout_ms: int
) -> Offsets:
    """Each partition's end offset as its records show it (:func:`checked_end_offsets`)."""
    return checked_end_offsets(consumer, partitions, timeout_ms)[0]


def checked_end_offsets(
    consumer: KafkaConsumer, partitions: Sequence[TopicPartition], timeout_ms: int
) -> tuple[Offsets, set[tuple[str, int]]]:
    """Each partition's end offset as its records show it, and the partitions whose end could
    not be checked in time (their reported end is given, and may be too low).

    ListOffsets can undercount on some brokers; reading from the last offset it reports and taking
    the fetch's high watermark gives the true end (on Apache Kafka it changes nothing).
    """
    if not partitions:
        return {}, set()
    reported = consumer.end_offsets(list(partitions))
    earliest = consumer.beginning_offsets(list(partitions))
    ends = {tp: reported[tp] for tp in partitions}
    pending = {tp for tp in partitions if reported[tp] > earliest[tp]}
    consumer.assign(list(partitions))
    for tp in partitions:
        consumer.seek(tp, reported[tp] - 1 if tp in pending else reported[tp])
    deadline = time.monotonic() + timeout_ms / 1000
    while pending and time.monotonic() < deadline:
        for tp, records in consumer.poll(timeout_ms=100, max_records=100_000).items():
            if records:
                highwater = consumer.highwater(tp) or 0
                ends[tp] = max(ends[tp], records[-1].offset + 1, highwater)
                pending.discard(tp)
    for tp in pending:
        log.warning("%s: no records at its reported end in %d ms", partition_name(tp), timeout_ms)
    offsets = {(tp.topic, tp.partition): end for tp, end in ends.items()}
    return offsets, {(tp.topic, tp.partition) for tp in pending}


def partition_name(tp: TopicPartition) -> str:
    return f"{tp.topic}-{tp.partition}"
