"""Kafka as a Spark streaming source: a Python data source built on kafka-python.

Spark's JVM Kafka connector is not always available, so quotastream reads Kafka itself, and
decides where the event enters: each read parses, validates, resolves and sums its records on
the executor that fetched them (``streaming.engine.stages.staged_batches``), so the source's rows
are usage sums, segment events and rejects, and raw payloads never cross into the JVM; and packs
them per shard (one row per staging and shard: a task's ranges are staged together, up to
``RECORDS_PER_CHUNK`` records or ``BYTES_PER_CHUNK`` of values a call), so Spark moves a few
values, not each row.

* offsets per topic-partition live in Spark's checkpoint (``streaming.engine.offsets``), so a
  restarted query replays exactly the ranges of the batch it did not finish;
* one input partition per topic-partition range; each Python worker keeps one cached consumer
  (a fresh consumer per read costs hundreds of milliseconds);
* the end of a partition is what ListOffsets says (its high watermark: Apache Kafka answers
  OFFSET_NOT_AVAILABLE rather than a stale end while a new leader's watermark catches up);
* offsets that vanish (retention, a broker that lost its log, a deleted topic) fail the query
  with the topic, partition and offsets named, or with ``failOnDataLoss=false`` log a warning and
  restart that partition from its earliest offset when it is back;
* a broker that does not answer (down, restarting, a partition without a leader) is an outage,
  never a loss: a trigger plans nothing new, a read waits for its records, and only after
  ``maxOutageSeconds`` does the query fail, naming the bootstrap servers. The driver's outage
  clock goes to the metrics through ``statusFile`` (``streaming.engine.source_status``).

Usage::

    source = engine_source(stage_settings)
    spark.dataSource.register(source)
    spark.readStream.format(source.name())
        .option("kafka.bootstrap.servers", "host:9092").option("subscribe", "events").load()
"""

from __future__ import annotations

import logging
import pickle
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError, OffsetOutOfRangeError
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType
from typing_extensions import override

from quotastream.outage import Outage, OutageStatus
from streaming.engine.kafka_clients import (
    beginning_offsets,
    end_offsets,
    is_outage,
    kafka_outage,
    new_consumer,
    partition_name,
    ride_out,
)
from streaming.engine.offsets import (
    OffsetRange,
    Offsets,
    SourceOptions,
    from_json,
    group_ranges,
    layout_of,
    limit_end,
    plan_ranges,
    to_json,
)
from streaming.engine.shard_layout import ShardLayout
from streaming.engine.source_process import watch_source_process
from streaming.engine.source_records import (
    BYTES_PER_CHUNK,
    RECORDS_PER_CHUNK,
    STAGED_SCHEMA,
    KafkaRecords,
)
from streaming.engine.source_status import write_status
from streaming.engine.worker_heap import freeze_imports

if TYPE_CHECKING:
    from streaming.engine.stages import StageSettings

log = logging.getLogger(__name__)

#: A read task has at least this many records (unless the batch has fewer): tiny micro-batches
#: run one task, not one per partition.
MIN_RECORDS_PER_TASK = 100


@dataclass(frozen=True)
class ReadTask:
    """One input partition: offset ranges, and what their batch pinned: the configuration
    version and the shard layout."""

    ranges: tuple[OffsetRange, ...]
    config_version: int
    layout: ShardLayout


@dataclass(frozen=True)
class _Ends:
    """What a trigger read of the logs' ends (``KafkaStreamReader._ends``)."""

    events: Offsets
    #: The configuration log's end (``{}`` without one; 0 while its topic does not exist).
    config: Offsets


class DataLossError(RuntimeError):
    """Offsets the query still needed are gone from the broker (``failOnDataLoss=true``)."""


@dataclass(frozen=True)
class PickledStage:
    """Stage settings as the source carries them: pickled, and unpickled only by a read.

    Spark's planning processes unpickle the source and its reader and never read; settings held
    as objects would make each of them import the staging code (pandas, the quota core) only to
    rebuild them (``streaming.engine.source_records``)."""

    data: bytes

    @staticmethod
    def of(stage: StageSettings) -> PickledStage:
        return PickledStage(pickle.dumps(stage))

    def load(self) -> StageSettings:
        stage: StageSettings = pickle.loads(self.data)
        return stage


class KafkaSource(DataSource):
    """The engine's source; :func:`engine_source` binds the stage settings its reads need."""

    stage: ClassVar[PickledStage | None] = None

    @classmethod
    @override
    def name(cls) -> str:
        return "quotastream-kafka"

    @override
    def schema(self) -> StructType:
        return from_arrow_schema(STAGED_SCHEMA)

    @override
    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        if self.stage is None:
            raise TypeError("register engine_source(settings), not KafkaSource itself")
        # Called in the process that answers the driver's calls for the query's life: its end
        # must say why (streaming/engine/source_process.py).
        watch_source_process()
        return KafkaStreamReader(SourceOptions.parse(self.options), self.stage)


def engine_source(stage: StageSettings) -> type[KafkaSource]:
    """A source class carrying ``stage`` (Spark pickles a registered class by value, so its
    workers get the settings without passing them through string options). Each has its own
    name: queries in one session may decide with different settings."""
    name = f"quotastream-kafka-{uuid.uuid4().hex[:12]}"

    class EngineKafkaSource(KafkaSource):
        @classmethod
        @override
        def name(cls) -> str:
            return name

    EngineKafkaSource.stage = PickledStage.of(stage)
    return EngineKafkaSource


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions, stage: PickledStage | None = None) -> None:
        self.options = options
        #: How reads stage their records (None: :meth:`records` only, as tests use it).
        self.stage = stage
        self._consumer: KafkaConsumer | None = None
        #: With Trigger.AvailableNow: the ends to stop at, taken when the query starts.
        self._target: Offsets | None = None
        #: Partitions read before that the last trigger did not find in the metadata.
        self._missing: set[tuple[str, int]] = set()
        #: Whether a ``spark.shards`` unlike the checkpoint's was reported (once a reader).
        self._warned_layout = False
        #: The driver's outage clock: it lasts across triggers, so an outage is timed from the
        #: first trigger that found the broker unreachable.
        self._outage = kafka_outage(
            options.bootstrap_servers, options.max_outage_s, on_change=self._report
        )

    def __getstate__(self) -> dict[str, Any]:
        # Shipped to the workers without the driver's consumer, targets and clock.
        return {"options": self.options, "stage": self.stage}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"], state["stage"])  # type: ignore[misc]

    @override
    def prepareForTriggerAvailableNow(self) -> None:
        self._target = ride_out(lambda: self._ends().events, self._outage)

    # ------------------------------------------------------------------ driver side
    @override
    def initialOffset(self) -> dict[str, dict[str, int]]:
        # A first start needs real offsets: wait for the broker (up to maxOutageSeconds).
        return ride_out(self._initial_offsets, self._outage)

    def _initial_offsets(self) -> dict[str, dict[str, int]]:
        starting = self.options.starting_offsets
        layout = self.options.layout
        if starting == "latest":
            return to_json(self._ends().events, layout)
        partitions = self._topic_partitions()
        if starting == "earliest":
            offsets = self._earliest(partitions)
        else:
            earliest = self._earliest(partitions)
            offsets = {tp: starting.get(tp, earliest[tp]) for tp in partitions}
        return to_json(offsets, layout)

    @override
    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    @override
    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, dict[str, int]]:
        """The offsets the next micro-batch reads up to; ``start`` itself (nothing new) while
        the broker does not answer. The shard layout ``start`` pinned is kept."""
        begin, layout = from_json(start), layout_of(start)
        try:
            latest = self._latest(begin, limit, layout)
        except KafkaError as error:
            if not is_outage(error):
                raise
            self._outage.failed(error)  # past maxOutageSeconds: OutageError fails the query
            # A broker that does not answer says nothing about which partitions exist.
            self._missing = set()
            return to_json(begin, layout)
        self._outage.recovered()
        return latest

    def _latest(
        self, begin: Offsets, limit: ReadLimit, layout: ShardLayout | None
    ) -> dict[str, dict[str, int]]:
        ends = self._ends()
        available, config = ends.events, ends.config
        earliest = self._earliest([TopicPartition(*tp) for tp in available if tp not in begin])
        # Partitions that appeared since the last batch are read from their beginning.
        begin = {**earliest, **begin}
        for logs in (available, config):
            for tp, end in logs.items():
                if end >= begin.get(tp, 0):
                    continue
                if logs is config:
                    self._lost(tp, f"the configuration log ends at {end}, below {begin[tp]}")
                else:
                    self._lost(
                        tp, f"the next offset to read is {begin[tp]} but the log ends at {end}"
                    )
        missing = {tp for tp in begin if tp[0] in self.options.topics and tp not in available}
        for tp in sorted(missing):
            # Right after a broker restart its metadata may lack a partition for a moment: only
            # one missing at two triggers in a row is gone.
            if tp in self._missing:
                self._lost(tp, f"the partition is gone (the next offset to read was {begin[tp]})")
            else:
                log.warning("%s-%d is not in the broker's metadata; checking again", *tp)
        if self._target is not None:
            # Stop at what existed when the query started; never go back behind the checkpoint.
            target = self._target
            available = {
                tp: max(begin.get(tp, 0), min(end, target.get(tp, begin.get(tp, 0))))
                for tp, end in available.items()
            }
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        limited = limit_end({tp: begin[tp] for tp in available}, available, max_rows)
        # Only a trigger that read the whole metadata counts toward "missing twice in a row".
        self._missing = missing
        until = {**begin, **{tp: max(end, 0) for tp, end in limited.items()}, **config}
        return to_json(until, layout)

    @override
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, until = from_json(start), from_json(end)
        layout = self._layout(end)
        # The configuration log is not read as data: its end offset is the batch's version.
        version = until.pop(self._config_partition, 0)
        # A partition whose log restarted below the checkpoint (data loss tolerated) is read
        # again from its beginning.
        restarted = {tp: 0 for tp, offset in until.items() if offset < begin.get(tp, 0)}
        ranges = plan_ranges({**begin, **restarted}, until)
        tasks = self.options.read_tasks or len(ranges)
        return [
            InputPartition(ReadTask(tuple(group), version, layout))
            for group in group_ranges(ranges, tasks, MIN_RECORDS_PER_TASK)
        ]

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
        """The staged rows of a read task's records, packed per shard (``STAGED_SCHEMA``)."""
        if self.stage is None:
            raise TypeError("this reader has no stage settings: use records()")
        # Only a read stages: the planning processes never import the staging code.
        from streaming.engine.stages import (  # noqa: PLC0415
            packed_by_shard,
            staged_batches,
            staged_together,
        )

        freeze_imports()
        stage = self.stage.load()
        task: ReadTask = partition.value
        for reads in staged_together(self.records(task)):
            yield from packed_by_shard(staged_batches(reads, stage, task.layout))

    def records(self, task: ReadTask) -> Iterator[KafkaRecords]:
        """The records of a read task's ranges, in chunks."""
        for offset_range in task.ranges:
            yield from self._range_records(offset_range, task.config_version)

    def _range_records(
        self, offset_range: OffsetRange, config_version: int
    ) -> Iterator[KafkaRecords]:
        """The records of one planned range, in chunks. They must all be read (the range is in
        the checkpoint already), so a broker that stops answering is waited for, up to
        ``maxOutageSeconds``; records that are gone are data loss."""
        # Each read times its own outage: executors do not report to the driver's status file.
        outage = kafka_outage(self.options.bootstrap_servers, self.options.max_outage_s)
        consumer = ride_out(lambda: _worker_consumer(self.options), outage)
        tp = TopicPartition(offset_range.topic, offset_range.partition)
        consumer.assign([tp])
        consumer.seek(tp, offset_range.start)
        offsets: list[int] = []
        values: list[bytes | None] = []
        value_bytes = 0
        expected = offset_range.start
        stalled_since = time.monotonic()
        while (position := consumer.position(tp)) < offset_range.end:
            try:
                # Never more than the range needs: kafka-python parses every record it returns.
                wanted = min(offset_range.end - position, RECORDS_PER_CHUNK - len(offsets))
                records = consumer.poll(timeout_ms=200, max_records=wanted).get(tp, [])
            except OffsetOutOfRangeError:
                # The next offset is gone (or never was); if that is tolerated, go on from the
                # earliest offset the log still has.
                expected = self._skip_lost(consumer, tp, expected, outage)
                continue
            if not records:
                if time.monotonic() - stalled_since > self.options.poll_timeout_ms / 1000:
                    expected = self._stalled(consumer, tp, expected, offset_range.end, outage)
                    stalled_since = time.monotonic()
                continue
            outage.recovered()
            stalled_since = time.monotonic()
            if records[0].offset > expected and self._earliest_of(consumer, tp, outage) > expected:
                self._lost(
                    (tp.topic, tp.partition),
                    f"offsets {expected}..{min(records[0].offset, offset_range.end) - 1} "
                    "were deleted",
                )
            for record in records:
                if record.offset >= offset_range.end:
                    break
                offsets.append(record.offset)
                values.append(record.value)
                value_bytes += max(record.serialized_value_size, 0)  # -1: no value
            expected = records[-1].offset + 1
            if len(offsets) >= RECORDS_PER_CHUNK or value_bytes >= BYTES_PER_CHUNK:
                yield KafkaRecords(tp.topic, tp.partition, offsets, values, config_version)
                offsets, values, value_bytes = [], [], 0
        if offsets:
            yield KafkaRecords(tp.topic, tp.partition, offsets, values, config_version)

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

    def _layout(self, end: dict[str, Any]) -> ShardLayout:
        """The layout the checkpoint pinned (in every batch's offsets), or the shard numbers of
        one begun before layouts."""
        pinned = layout_of(end)
        configured = self.options.layout
        layout = pinned or ShardLayout.numbered(configured.shards)
        if layout.shards != configured.shards and not self._warned_layout:
            self._warned_layout = True
            log.warning(
                "the checkpoint keeps its %d shards (spark.shards is %d): an entity's state "
                "stays in its shard for the checkpoint's life",
                layout.shards,
                configured.shards,
            )
        return layout

    @property
    def _config_partition(self) -> tuple[str, int]:
        return (self.options.config_topic or "", 0)

    def _ends(self) -> _Ends:
        """The event partitions' ends and the configuration log's (the newest version, kept
        with the batch's offsets), read together: the driver's consumer keeps one assignment.
        A changing one makes kafka-python drop the other topics' metadata, and fetching that
        again from a hung broker waits far longer than any request timeout."""
        partitions = self._topic_partitions()
        topic = self.options.config_topic
        has_config = topic is not None and bool(self._driver_consumer().partitions_for_topic(topic))
        config_partitions = [TopicPartition(topic, 0)] if topic is not None and has_config else []
        ends = end_offsets(
            self._driver_consumer(), partitions + config_partitions, self.options.poll_timeout_ms
        )
        config = {} if topic is None else {(topic, 0): ends.pop((topic, 0), 0)}
        return _Ends(ends, config)

    def _earliest(self, partitions: Sequence[TopicPartition]) -> Offsets:
        return beginning_offsets(self._driver_consumer(), partitions, self.options.poll_timeout_ms)

    def _report(self, status: OutageStatus) -> None:
        if self.options.status_file is not None:
            write_status(self.options.status_file, status)

    def _lost(self, tp: tuple[str, int], what: str) -> None:
        message = f"{tp[0]}-{tp[1]}: {what}; records the query has not read are gone"
        if self.options.fail_on_data_loss:
            raise DataLossError(f"{message} (failOnDataLoss=true)")
        log.warning("%s; restarting this partition from its earliest offset", message)

    def _earliest_of(self, consumer: KafkaConsumer, tp: TopicPartition, outage: Outage) -> int:
        timeout_ms = self.options.poll_timeout_ms
        earliest: int = ride_out(
            lambda: consumer.beginning_offsets([tp], timeout_ms=timeout_ms)[tp], outage
        )
        return earliest

    def _skip_lost(
        self, consumer: KafkaConsumer, tp: TopicPartition, expected: int, outage: Outage
    ) -> int:
        """Offset ``expected`` is out of the log's range: lost (or tolerated: read on from the
        earliest offset the log has)."""
        earliest = self._earliest_of(consumer, tp, outage)
        what = f"offset {expected} is out of the log's range (earliest {earliest})"
        self._lost((tp.topic, tp.partition), what)
        consumer.seek(tp, earliest)
        return earliest

    def _stalled(
        self, consumer: KafkaConsumer, tp: TopicPartition, expected: int, end: int, outage: Outage
    ) -> int:
        """No records for ``pollTimeoutMs``: either they were deleted (data loss), or the broker
        is not serving them (down, restarting, no leader: an outage, waited out)."""
        try:
            earliest = consumer.beginning_offsets([tp], timeout_ms=self.options.poll_timeout_ms)[tp]
        except KafkaError as error:
            if not is_outage(error):
                raise
            outage.failed(error)
            return expected
        if earliest > expected:
            return self._skip_lost(consumer, tp, expected, outage)
        outage.failed(
            TimeoutError(
                f"{partition_name(tp)}: offsets {expected}..{end - 1} not received within "
                f"{self.options.poll_timeout_ms} ms"
            )
        )
        return expected


_WORKER_CONSUMERS: dict[tuple[str, tuple[tuple[str, str], ...]], KafkaConsumer] = {}


def _worker_consumer(options: SourceOptions) -> KafkaConsumer:
    """One consumer per Python worker process and broker settings, reused across reads."""
    key = (options.bootstrap_servers, tuple(sorted((k, str(v)) for k, v in options.client.items())))
    consumer = _WORKER_CONSUMERS.get(key)
    if consumer is None:
        consumer = _WORKER_CONSUMERS[key] = _new_consumer(options)
    return consumer


def close_worker_consumers() -> None:
    """Closes the consumers this process's reads keep. A Python worker keeps them for its life;
    a process that read in-process (the tests) closes them, so that a consumer of a broker since
    stopped does not go on reconnecting in kafka-python's background thread."""
    while _WORKER_CONSUMERS:
        _, consumer = _WORKER_CONSUMERS.popitem()
        consumer.close()


def _new_consumer(options: SourceOptions) -> KafkaConsumer:
    return new_consumer(options.bootstrap_servers, options.client, options.poll_timeout_ms)
