"""The Kafka stream reader against a real broker (Apache Kafka), driven the way Spark drives it."""

from __future__ import annotations

import logging
import os
import pickle
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import KafkaTimeoutError
from pyspark import cloudpickle
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from state.config import parse_quota_config
from state.events import EventBounds
from streaming.commands.run import failure_line
from streaming.engine.kafka_clients import end_offsets, new_consumer
from streaming.engine.kafka_source import DataLossError, engine_source
from streaming.engine.offsets import LAYOUT_KEY, layout_of
from streaming.engine.shard_layout import ShardLayout
from streaming.engine.source_process import RUNNER_MODULE
from streaming.engine.source_records import BYTES_PER_CHUNK
from streaming.engine.stages import StageSettings
from streaming.kafka_broker import KafkaNode
from streaming.services import LocalService
from tests.support.factories import MIXED_QUOTAS
from tests.support.kafka_source import new_topic, produce, read_all, reader

#: What Spark's planning processes do with a registered source, in a fresh interpreter: unpickle
#: the class (as Spark pickles it), build the source and its stream reader, ask the schema.
_PLANNING = """
import pickle, sys
source_class = pickle.loads(open(sys.argv[1], "rb").read())
source = source_class({"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "events"})
reader = source.streamReader(source.schema())
heavy = ("pandas", "redis", "state.config", "streaming.engine.stages", "streaming.engine.settings")
print(sorted(name for name in heavy if name in sys.modules))
"""


def test_spark_plans_the_source_without_importing_the_staging_code(tmp_path: Path) -> None:
    """Each query start runs the source's planning in fresh Python processes (create, plan the
    reads, the trigger planner): none of them may need pandas, Redis or the quota core, whose
    imports cost each process over a second. A read gets the very settings the engine bound."""
    stage = StageSettings(parse_quota_config(MIXED_QUOTAS, "test"), EventBounds(), 65_536)
    source_class = engine_source(stage)
    pickled = tmp_path / "source.pickle"
    pickled.write_bytes(cloudpickle.dumps(source_class))  # type: ignore[no-untyped-call]
    planning = subprocess.run(
        [sys.executable, "-c", _PLANNING, str(pickled)], capture_output=True, text=True, check=True
    )
    assert planning.stdout.split() == ["[]"], planning.stdout
    reader = source_class({"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "events"})
    shipped = pickle.loads(pickle.dumps(reader.streamReader(reader.schema())))
    assert shipped.stage is not None
    assert shipped.stage.load() == stage


@pytest.fixture
def broker(kafka: KafkaNode) -> KafkaNode:
    """The session's broker: each test reads topics of its own."""
    return kafka


#: The layout a new checkpoint pins when the options name none.
NEW_LAYOUT = {LAYOUT_KEY: {"shards": 1, "tasks": 1}}


def reported_ends(broker: LocalService, topic: str, partitions: int) -> dict[TopicPartition, int]:
    """The partitions' end offsets as ListOffsets answers them."""
    consumer = KafkaConsumer(bootstrap_servers=broker.address)
    reported: dict[TopicPartition, int] = consumer.end_offsets(
        [TopicPartition(topic, p) for p in range(partitions)]
    )
    consumer.close()
    return reported


def test_the_broker_reports_true_end_offsets(broker: LocalService) -> None:
    """The source takes a partition's end from ListOffsets alone: Apache Kafka counts every
    record there, also those a producer's ``linger_ms`` batched together."""
    topic = new_topic(broker, 3)
    produce(broker, topic, 1000, 3)
    assert sum(reported_ends(broker, topic, 3).values()) == 1000
    source = reader(broker, topic, startingOffsets="earliest")
    start = source.initialOffset()
    end = source.latestOffset(start, ReadAllAvailable())
    assert end == {topic: {"0": 334, "1": 333, "2": 333}, **NEW_LAYOUT}
    rows = read_all(source, start, end)
    assert sorted(int(value) for _, _, value in rows) == list(range(1000))
    assert source.latestOffset(end, ReadAllAvailable()) == end
    source.stop()


def test_batches_read_exact_ranges_with_no_gap_and_no_overlap(broker: LocalService) -> None:
    topic = new_topic(broker, 2)
    source = reader(broker, topic, startingOffsets="earliest", maxOffsetsPerTrigger="150")
    start = source.initialOffset()
    produce(broker, topic, 500, 2)
    seen: list[tuple[int, int, bytes]] = []
    while True:
        end = source.latestOffset(start, source.getDefaultReadLimit())
        if end == start:
            break
        batch = read_all(source, start, end)
        assert len(batch) <= 150 + 2  # the limit, give or take rounding up per partition
        seen += batch
        start = end
    assert len(seen) == len(set(seen)) == 500
    assert sorted(int(value) for _, _, value in seen) == list(range(500))
    # Replaying a planned batch reads exactly the same records (what a restart does).
    assert read_all(source, {topic: {"0": 10, "1": 20}}, {topic: {"0": 60, "1": 25}}) == [
        *[(0, offset, str(2 * offset).encode()) for offset in range(10, 60)],
        *[(1, offset, str(2 * offset + 1).encode()) for offset in range(20, 25)],
    ]
    source.stop()


def test_a_read_is_cut_into_chunks_of_about_bytes_per_chunk(broker: LocalService) -> None:
    """A backlog of large records is staged a bounded chunk at a time, not 100k records at once
    (a staging holds several times its payload): every chunk but the last holds at least
    ``BYTES_PER_CHUNK`` of values, and at most what one poll adds beyond that."""
    topic = new_topic(broker, 1)
    value = b"x" * 900_000  # under the broker's and the producer's 1 MiB message limit
    count = BYTES_PER_CHUNK // len(value) + 10
    producer = KafkaProducer(bootstrap_servers=broker.address)
    for _ in range(count):
        producer.send(topic, value, partition=0)
    producer.flush()
    producer.close()
    source = reader(broker, topic, startingOffsets="earliest")
    start = source.initialOffset()
    end = source.latestOffset(start, ReadAllAvailable())
    worker = pickle.loads(pickle.dumps(source))
    (partition,) = source.partitions(start, end)
    chunks = list(worker.records(partition.value))
    assert [offset for chunk in chunks for offset in chunk.offsets] == list(range(count))
    first, last = chunks
    # A poll brings what kafka-python fetched of the partition: 1 MiB a fetch by default.
    assert BYTES_PER_CHUNK <= first.value_bytes < BYTES_PER_CHUNK + (2 << 20)
    assert last.value_bytes == (count - len(first.offsets)) * len(value)
    source.stop()


def test_latest_starts_after_existing_records(broker: LocalService) -> None:
    topic = new_topic(broker, 1)
    produce(broker, topic, 50, 1)
    source = reader(broker, topic)  # startingOffsets defaults to latest
    start = source.initialOffset()
    assert start == {topic: {"0": 50}, **NEW_LAYOUT}
    produce(broker, topic, 5, 1, first=50)
    end = source.latestOffset(start, ReadAllAvailable())
    assert [value for _, _, value in read_all(source, start, end)] == [
        str(i).encode() for i in range(50, 55)
    ]
    source.stop()


def test_a_topic_created_after_the_query_started_is_read_from_its_beginning(
    broker: LocalService,
) -> None:
    topic = f"later-{uuid.uuid4().hex[:8]}"
    source = reader(broker, topic, startingOffsets="latest")
    start = source.initialOffset()
    assert start == NEW_LAYOUT
    admin = KafkaAdminClient(bootstrap_servers=broker.address)
    admin.create_topics([NewTopic(topic, 2, 1)])
    admin.close()
    produce(broker, topic, 10, 2)
    end = source.latestOffset(start, ReadAllAvailable())
    assert sorted(int(v) for _, _, v in read_all(source, start, end)) == list(range(10))
    source.stop()


def test_vanished_offsets_fail_naming_topic_partition_and_offsets(broker: LocalService) -> None:
    """As after an in-memory broker restart: the checkpoint is ahead of the log."""
    topic = new_topic(broker, 1)
    produce(broker, topic, 5, 1)
    source = reader(broker, topic)
    with pytest.raises(
        DataLossError,
        match=rf"{topic}-0: the next offset to read is 900 but the "
        r"log ends at 5.*failOnDataLoss=true",
    ):
        source.latestOffset({topic: {"0": 900}}, ReadAllAvailable())
    source.stop()


def test_vanished_offsets_restart_from_the_earliest_when_tolerated(
    broker: LocalService, caplog: pytest.LogCaptureFixture
) -> None:
    topic = new_topic(broker, 1)
    produce(broker, topic, 5, 1)
    source = reader(broker, topic, failOnDataLoss="false")
    start = {topic: {"0": 900}}
    end = source.latestOffset(start, ReadAllAvailable())
    assert "restarting this partition from its earliest offset" in caplog.text
    assert [int(v) for _, _, v in read_all(source, start, end)] == [0, 1, 2, 3, 4]
    source.stop()


def test_a_partition_missing_from_the_metadata_is_gone_only_at_two_triggers_in_a_row(
    broker: LocalService, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker restarting may lack a partition in its metadata for a moment: missing at one
    trigger is not a loss, missing at the next one is. A trigger that finds the broker
    unreachable says nothing about which partitions exist, so it breaks the row."""
    topic = new_topic(broker, 2)
    produce(broker, topic, 20, 2)
    source = reader(broker, topic, **{"kafkaConsumer.pollTimeoutMs": "300"})
    # The checkpoint has a partition 2 that the broker's metadata does not.
    checkpoint = {topic: {"0": 4, "1": 4, "2": 7}}
    with caplog.at_level(logging.WARNING, logger="streaming.engine.kafka_source"):
        first = source.latestOffset(checkpoint, ReadAllAvailable())
    assert first == {topic: {"0": 10, "1": 10, "2": 7}}
    assert f"{topic}-2 is not in the broker's metadata; checking again" in caplog.text
    broker.pause()
    try:
        assert source.latestOffset(first, ReadAllAvailable()) == first
    finally:
        broker.resume()
    assert source.latestOffset(first, ReadAllAvailable()) == first
    with pytest.raises(
        DataLossError, match=rf"{topic}-2: the partition is gone \(the next offset to read was 7\)"
    ):
        source.latestOffset(first, ReadAllAvailable())
    source.stop()


def test_a_checkpoint_keeps_the_shard_layout_it_began_with(
    broker: LocalService, caplog: pytest.LogCaptureFixture
) -> None:
    """The layout (the shards, and the state tasks their keys are spread over) is pinned with
    the first batch's offsets, as Spark pins the state tasks: a restart with other settings keeps
    it, and a checkpoint begun before layouts keeps its shard numbers."""
    topic = new_topic(broker, 2)
    produce(broker, topic, 20, 2)
    first = reader(broker, topic, startingOffsets="earliest", shards="8", stateTasks="2")
    start = first.initialOffset()
    first.stop()
    assert layout_of(start) == ShardLayout(8, 2)
    restarted = reader(broker, topic, shards="16", stateTasks="4")
    with caplog.at_level(logging.WARNING, logger="streaming.engine.kafka_source"):
        end = restarted.latestOffset(start, ReadAllAvailable())
        tasks = [partition.value for partition in restarted.partitions(start, end)]
    assert layout_of(end) == ShardLayout(8, 2)
    assert {task.layout for task in tasks} == {ShardLayout(8, 2)}
    assert "the checkpoint keeps its 8 shards (spark.shards is 16)" in caplog.text
    before_layouts = {topic: {"0": 0, "1": 0}}
    end = restarted.latestOffset(before_layouts, ReadAllAvailable())
    assert layout_of(end) is None
    tasks = [partition.value for partition in restarted.partitions(before_layouts, end)]
    assert {task.layout for task in tasks} == {ShardLayout.numbered(16)}
    restarted.stop()


def test_asking_for_a_topic_the_broker_lacks_does_not_create_it(broker: LocalService) -> None:
    """The broker creates a topic a Metadata request names unless the request says not to
    (``auto.create.topics.enable`` is on by default): the source's consumers asking for their
    topic after a broker restarted empty got it back with the broker's default partition count
    (one), and the operator's topic of three could not be created."""
    topic = f"lacking-{uuid.uuid4().hex[:8]}"
    consumer = new_consumer(broker.address, {}, request_timeout_ms=2_000)
    # kafka-python waits out the timeout for a partition the broker does not know; had the
    # topic been created, its end offset (0) would be the answer.
    with pytest.raises(KafkaTimeoutError):
        end_offsets(consumer, [TopicPartition(topic, 0)], timeout_ms=2_000)
    consumer.close()
    admin = KafkaAdminClient(bootstrap_servers=broker.address)
    try:
        assert topic not in admin.list_topics()
    finally:
        admin.close()


def test_max_offsets_per_trigger_is_the_default_read_limit(broker: LocalService) -> None:
    topic = new_topic(broker, 1)
    assert isinstance(reader(broker, topic).getDefaultReadLimit(), ReadAllAvailable)
    limit = reader(broker, topic, maxOffsetsPerTrigger="10").getDefaultReadLimit()
    assert limit == ReadMaxRows(10)


def test_available_now_stops_at_what_existed_when_the_query_started(
    broker: LocalService,
) -> None:
    topic = new_topic(broker, 1)
    produce(broker, topic, 100, 1)
    source = reader(broker, topic, startingOffsets="earliest", maxOffsetsPerTrigger="30")
    source.prepareForTriggerAvailableNow()
    produce(broker, topic, 50, 1, first=100)  # arrives after the start: not part of this run
    start = source.initialOffset()
    ends = []
    while (end := source.latestOffset(start, source.getDefaultReadLimit())) != start:
        ends.append(end[topic]["0"])
        start = end
    assert ends == [30, 60, 90, 100]
    source.stop()


def source_processes() -> set[int]:
    """Spark's source processes on the driver (streaming/engine/source_process.py) that this
    process started, through the driver's JVM."""
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            command = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue  # ended meanwhile
        pid = int(cmdline.parent.name)
        if RUNNER_MODULE.encode() in command and os.getpid() in ancestors(pid):
            found.add(pid)
    return found


def ancestors(pid: int) -> list[int]:
    chain = []
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat[stat.rfind(")") + 2 :].split()[1])
        chain.append(pid)
    return chain


@pytest.mark.parametrize(
    ("signum", "line"),
    [
        (
            signal.SIGKILL,
            r"the Kafka source's Python process on the driver ended without an error while "
            r"Spark waited for its (initialOffset|latestOffset|reportLatestOffset|partitions|"
            r"commit): killed by a signal it cannot catch \(SIGKILL, as the kernel's "
            r"out-of-memory killer sends it\) or crashed \(then its stack is in the driver's "
            r"log\); the checkpoint is intact: a restart resumes from it",
        ),
        (
            signal.SIGTERM,
            r"the Kafka source's Python process on the driver \(pid \d+\) was sent SIGTERM: "
            r"something outside the query stopped it",
        ),
    ],
    ids=["SIGKILL", "SIGTERM"],
)
def test_the_end_of_the_sources_process_on_the_driver_is_named(
    spark: SparkSession, broker: LocalService, tmp_path: Path, signum: int, line: str
) -> None:
    """The process that answers Spark's calls to the source on the driver (``latestOffset``
    each trigger) killed while the query runs: the query fails, and its one line says what
    happened, where Spark says only ``[STREAM_FAILED] ... terminated with exception:`` (the JVM
    read EOF). Raised in the process, an error would have been reported with its traceback."""
    topic = new_topic(broker, 1)
    produce(broker, topic, 10, 1)
    stage = StageSettings(parse_quota_config(MIXED_QUOTAS, "test"), EventBounds(), 65_536)
    source = engine_source(stage)
    spark.dataSource.register(source)
    options = {
        "kafka.bootstrap.servers": broker.address,
        "subscribe": topic,
        "startingOffsets": "earliest",
    }
    before = source_processes()
    query = (
        spark.readStream.format(source.name())
        .options(**options)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        # Its first batch read the records: the process has created the reader and answers.
        deadline = time.monotonic() + 120
        while not query.recentProgress and query.isActive and time.monotonic() < deadline:
            time.sleep(0.05)
        assert query.recentProgress, query.exception()
        (process,) = source_processes() - before
        os.kill(process, signum)
        with pytest.raises(StreamingQueryException) as failed:
            query.awaitTermination(120)
    finally:
        query.stop()
    assert re.fullmatch(line, failure_line(failed.value)), failure_line(failed.value)
