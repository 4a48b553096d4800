"""Kafka as a Spark streaming source: a Python data source built on kafka-python.

Spark's JVM Kafka connector is not always available, so quotastream reads Kafka itself:

* offsets per topic-partition live in Spark's checkpoint (``streaming.offsets``), so a restarted
  query replays exactly the ranges of the batch it did not finish;
* one input partition per topic-partition range; each Python worker keeps one cached consumer
  (a fresh consumer per read costs hundreds of milliseconds);
* the end of a partition is what its records say, not only what ListOffsets says: some brokers
  (tansu, which the tests and the embedded default use) report the base offset of the last batch
  plus one, so the driver reads the tail once and takes the fetch's high watermark;
* offsets that vanish (retention, a broker that lost its log, a deleted topic) fail the query
  with the topic, partition and offsets named, or with ``failOnDataLoss=false`` log a warning and
  restart that partition from its earliest offset when it is back.

Usage::

    spark.dataSource.register(KafkaSource)
    spark.readStream.format("quotastream-kafka")
        .option("kafka.bootstrap.servers", "host:9092").option("subscribe", "events").load()
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import OffsetOutOfRangeError
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType
from typing_extensions import override

from streaming.kafka_clients import (
    checked_end_offsets,
    new_consumer,
    partition_name,
    true_end_offsets,
)
from streaming.offsets import (
    OffsetRange,
    Offsets,
    SourceOptions,
    from_json,
    limit_end,
    plan_ranges,
    to_json,
)

log = logging.getLogger(__name__)

SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp long, "
    "config_version long"
)
ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),
        ("config_version", pa.int64()),  # the live configuration this micro-batch decides with
    ]
)
_RECORDS_PER_BATCH = 8192


@dataclass(frozen=True)
class ReadTask:
    """One input partition: an offset range, and the configuration version of its batch."""

    offsets: OffsetRange
    config_version: int


class DataLossError(RuntimeError):
    """Offsets the query still needed are gone from the broker (``failOnDataLoss=true``)."""


class KafkaSource(DataSource):
    @classmethod
    @override
    def name(cls) -> str:
        return "quotastream-kafka"

    @override
    def schema(self) -> str:
        return SCHEMA

    @override
    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        return KafkaStreamReader(SourceOptions.parse(self.options))


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._consumer: KafkaConsumer | None = None
        #: With Trigger.AvailableNow: the ends to stop at, taken when the query starts.
        self._target: Offsets | None = None
        #: Partitions read before that the last trigger did not find in the metadata.
        self._missing: set[tuple[str, int]] = set()

    def __getstate__(self) -> dict[str, Any]:
        # Shipped to the workers without the driver's consumer.
        return {"options": self.options, "_consumer": None, "_target": None, "_missing": set()}

    @override
    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._true_ends(self._topic_partitions())

    # ------------------------------------------------------------------ driver side
    @override
    def initialOffset(self) -> dict[str, dict[str, int]]:
        partitions = self._topic_partitions()
        starting = self.options.starting_offsets
        if starting == "earliest":
            offsets = self._earliest(partitions)
        elif starting == "latest":
            offsets = self._true_ends(partitions)
        else:
            earliest = self._earliest(partitions)
            offsets = {tp: starting.get(tp, earliest[tp]) for tp in partitions}
        return to_json(offsets)

    @override
    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    @override
    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, dict[str, int]]:
        begin = from_json(start)
        partitions = self._topic_partitions()
        available, unchecked = checked_end_offsets(
            self._driver_consumer(), partitions, self.options.poll_timeout_ms
        )
        earliest = self._earliest([tp for tp in partitions if tp not in begin])
        # Partitions that appeared since the last batch are read from their beginning.
        begin = {**earliest, **begin}
        for tp, end in available.items():
            if end >= begin.get(tp, 0):
                continue
            if tp in unchecked:
                # A slow broker, or one that reports its end too low: not proof of a loss.
                log.warning(
                    "%s-%d: the broker reports the log ending at %d, below %d; its records did "
                    "not answer in time, so it is read again at the next trigger",
                    *tp,
                    end,
                    begin[tp],
                )
                available[tp] = begin[tp]
                continue
            self._lost(tp, f"the next offset to read is {begin[tp]} but the log ends at {end}")
        missing = {tp for tp in begin if tp[0] in self.options.topics and tp not in available}
        for tp in sorted(missing):
            # Right after a broker restart its metadata may lack a partition for a moment: only
            # one missing at two triggers in a row is gone.
            if tp in self._missing:
                self._lost(tp, f"the partition is gone (the next offset to read was {begin[tp]})")
            else:
                log.warning("%s-%d is not in the broker's metadata; checking again", *tp)
        self._missing = missing
        if self._target is not None:
            # Stop at what existed when the query started; never go back behind the checkpoint.
            target = self._target
            available = {
                tp: max(begin.get(tp, 0), min(end, target.get(tp, begin.get(tp, 0))))
                for tp, end in available.items()
            }
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        ends = limit_end({tp: begin[tp] for tp in available}, available, max_rows)
        config = self._config()
        for tp, version in config.items():
            if version < begin.get(tp, 0):
                self._lost(tp, f"the configuration log ends at {version}, below {begin[tp]}")
        return to_json({**begin, **{tp: max(end, 0) for tp, end in ends.items()}, **config})

    @override
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, until = from_json(start), from_json(end)
        # The configuration log is not read as data: its end offset is the batch's version.
        version = until.pop(self._config_partition, 0)
        # A partition whose log restarted below the checkpoint (data loss tolerated) is read
        # again from its beginning.
        restarted = {tp: 0 for tp, offset in until.items() if offset < begin.get(tp, 0)}
        ranges = plan_ranges({**begin, **restarted}, until)
        return [InputPartition(ReadTask(offset_range, version)) for offset_range in ranges]

    @override
    def commit(self, end: dict[str, Any]) -> None:
        """Offsets are kept in Spark's checkpoint; nothing is committed to Kafka."""

    @override
    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    # ------------------------------------------------------------------ worker side
    @override
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        task: ReadTask = partition.value
        offset_range = task.offsets
        consumer = _worker_consumer(self.options)
        tp = TopicPartition(offset_range.topic, offset_range.partition)
        consumer.assign([tp])
        consumer.seek(tp, offset_range.start)
        rows: dict[str, list[Any]] = {name: [] for name in ARROW_SCHEMA.names}
        expected = offset_range.start
        deadline = time.monotonic() + self.options.poll_timeout_ms / 1000
        while consumer.position(tp) < offset_range.end:
            try:
                records = consumer.poll(timeout_ms=200, max_records=_RECORDS_PER_BATCH).get(tp, [])
            except OffsetOutOfRangeError:
                # The next offset is gone (or never was); if that is tolerated, go on from the
                # earliest offset the log still has.
                expected = self._resume_after_loss(consumer, tp, expected, offset_range)
                continue
            if not records:
                if time.monotonic() > deadline:
                    self._check_gone(consumer, tp, expected, offset_range)
                    raise TimeoutError(
                        f"{partition_name(tp)}: offsets {expected}..{offset_range.end - 1} not "
                        f"received within {self.options.poll_timeout_ms} ms"
                    )
                continue
            deadline = time.monotonic() + self.options.poll_timeout_ms / 1000
            if records[0].offset > expected:
                self._check_gone(consumer, tp, expected, offset_range)
            for record in records:
                if record.offset >= offset_range.end:
                    break
                rows["key"].append(record.key)
                rows["value"].append(record.value)
                rows["offset"].append(record.offset)
                rows["timestamp"].append(record.timestamp)
            expected = records[-1].offset + 1
            if len(rows["offset"]) >= _RECORDS_PER_BATCH:
                yield _record_batch(rows, tp, task.config_version)
                rows = {name: [] for name in ARROW_SCHEMA.names}
        if rows["offset"]:
            yield _record_batch(rows, tp, task.config_version)

    # ------------------------------------------------------------------ internals
    def _driver_consumer(self) -> KafkaConsumer:
        if self._consumer is None:
            self._consumer = _new_consumer(self.options)
        return self._consumer

    def _topic_partitions(self) -> list[TopicPartition]:
        consumer = self._driver_consumer()
        partitions = []
        for topic in self.options.topics:
            ids = consumer.partitions_for_topic(topic)
            if not ids:
                log.warning("topic %r has no partitions (yet); nothing to read from it", topic)
                continue
            partitions += [TopicPartition(topic, partition) for partition in sorted(ids)]
        return partitions

    @property
    def _config_partition(self) -> tuple[str, int]:
        return (self.options.config_topic or "", 0)

    def _config(self) -> Offsets:
        """The configuration log's end (the newest version), kept with the batch's offsets."""
        topic = self.options.config_topic
        if topic is None:
            return {}
        if not self._driver_consumer().partitions_for_topic(topic):
            return {(topic, 0): 0}
        return self._true_ends([TopicPartition(topic, 0)])

    def _earliest(self, partitions: Sequence[TopicPartition]) -> Offsets:
        if not partitions:
            return {}
        found = self._driver_consumer().beginning_offsets(list(partitions))
        return {(tp.topic, tp.partition): offset for tp, offset in found.items()}

    def _true_ends(self, partitions: Sequence[TopicPartition]) -> Offsets:
        return true_end_offsets(self._driver_consumer(), partitions, self.options.poll_timeout_ms)

    def _lost(self, tp: tuple[str, int], what: str) -> None:
        message = f"{tp[0]}-{tp[1]}: {what}; records the query has not read are gone"
        if self.options.fail_on_data_loss:
            raise DataLossError(f"{message} (failOnDataLoss=true)")
        log.warning("%s; restarting this partition from its earliest offset", message)

    def _resume_after_loss(
        self, consumer: KafkaConsumer, tp: TopicPartition, expected: int, offset_range: OffsetRange
    ) -> int:
        earliest: int = consumer.beginning_offsets([tp])[tp]
        what = f"offset {expected} is out of the log's range (earliest {earliest})"
        self._lost((tp.topic, tp.partition), what)
        consumer.seek(tp, earliest)
        return earliest

    def _check_gone(
        self, consumer: KafkaConsumer, tp: TopicPartition, expected: int, offset_range: OffsetRange
    ) -> None:
        earliest = consumer.beginning_offsets([tp])[tp]
        if earliest > expected:
            self._lost(
                (tp.topic, tp.partition),
                f"offsets {expected}..{min(earliest, offset_range.end) - 1} were deleted",
            )


_WORKER_CONSUMERS: dict[tuple[str, tuple[tuple[str, str], ...]], KafkaConsumer] = {}


def _worker_consumer(options: SourceOptions) -> KafkaConsumer:
    """One consumer per Python worker process and broker settings, reused across reads."""
    key = (options.bootstrap_servers, tuple(sorted((k, str(v)) for k, v in options.client.items())))
    consumer = _WORKER_CONSUMERS.get(key)
    if consumer is None:
        consumer = _WORKER_CONSUMERS[key] = _new_consumer(options)
    return consumer


def _new_consumer(options: SourceOptions) -> KafkaConsumer:
    return new_consumer(options.bootstrap_servers, options.client)


def _record_batch(
    rows: dict[str, list[Any]], tp: TopicPartition, config_version: int
) -> pa.RecordBatch:
    count = len(rows["offset"])
    rows["topic"] = [tp.topic] * count
    rows["partition"] = [tp.partition] * count
    rows["config_version"] = [config_version] * count
    return pa.RecordBatch.from_pydict(rows, schema=ARROW_SCHEMA)
