"""Broker faults under a running query: a broker that loses its log, and one that keeps it.

A broker started anew on its port with an empty log (its disk lost) has forgotten every record:
the offsets in the checkpoint point past the end of the new log. With failOnDataLoss the query
fails naming topic, partition and offsets; without it the engine warns, counts it and reads the
new log from its beginning. A broker that keeps its log (Kafka's own, on disk) restarts without
losing a record; while it is down the query waits for it (a Kafka outage), for as long as
``kafka.max_outage_s``.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Literal

import pytest
from kafka import KafkaProducer
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.sql.streaming.query import StreamingQuery

from quotastream import QuotaClient
from quotastream.outage import OutageStatus
from state.config import parse_quota_config
from streaming.engine.exporter import EngineMetrics
from streaming.engine.job import start_query
from streaming.engine.kafka_clients import RECONNECT_BACKOFF_MAX_MS
from streaming.engine.kafka_source import KafkaStreamReader
from streaming.engine.metric_names import KAFKA_OUTAGE, KAFKA_OUTAGES, SOURCE_DATA_LOSS
from streaming.engine.offsets import SourceOptions
from streaming.engine.source_status import read_status
from streaming.kafka_broker import KafkaCluster, KafkaNode, start_kafka
from streaming.services import LocalService
from tests.servers import wait_until_in_sync
from tests.support.checkpoint import PlannedBatch, planned_batches
from tests.support.engine import commits, engine_file, engine_settings, publish, quotastream
from tests.support.factories import MIXED_QUOTAS, mixed_payloads, produce
from tests.support.prometheus import samples
from tests.support.queries import assert_matches_batch_recomputation, read_offsets, wait_until_read

CONFIG = parse_quota_config(MIXED_QUOTAS, "test config")
#: Partitions of the topics the tests publish to (``tests.test_streaming.publish``'s default).
PARTITIONS = 3


def restarted_empty(broker: LocalService) -> KafkaNode:
    """The broker stopped and started anew on its port: its log is gone."""
    port = broker.port
    broker.stop()
    return start_kafka(port=port)


def test_offsets_lost_with_the_broker_fail_the_query_naming_them(
    spark: SparkSession, redis_server: LocalService, tmp_path: Path
) -> None:
    topic = f"lost-{uuid.uuid4().hex[:8]}"
    broker = start_kafka()
    try:
        publish(broker, topic, mixed_payloads(3, 300, users=3))
        settings = engine_settings(broker, redis_server, tmp_path, topic)
        assert settings.kafka.fail_on_data_loss
        query = start_query(spark, settings, CONFIG)
        wait_until_read(query, topic, 300)
        broker = restarted_empty(broker)
        # Created again, as an operator would, and written to.
        publish(broker, topic, mixed_payloads(4, 6, users=3))
        with pytest.raises(StreamingQueryException) as failed:
            query.awaitTermination(120)
    finally:
        broker.stop()
    error = str(failed.value)
    # Either the partitions were seen gone, or back with a log that ends below the checkpoint.
    assert "failOnDataLoss=true" in error
    named = [f"{topic}-{p}: the" for p in range(3) if f"{topic}-{p}: the" in error]
    assert named, error[:2000]
    # Seen before or after the two new records of its partition arrived.
    assert re.search(
        r"the next offset to read is 100 but the log ends at [0-2];"
        r"|the partition is gone \(the next offset to read was 100\)",
        error,
    ), error[:2000]


def test_offsets_lost_with_the_broker_are_counted_and_the_new_log_read_when_tolerated(
    spark: SparkSession,
    redis_server: LocalService,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = f"tolerated-{uuid.uuid4().hex[:8]}"
    broker = start_kafka()
    metrics = EngineMetrics(port=0)
    query = None
    try:
        publish(broker, topic, mixed_payloads(3, 300, users=3))
        settings = engine_settings(broker, redis_server, tmp_path, topic)
        settings = settings.model_copy(
            update={"kafka": settings.kafka.model_copy(update={"fail_on_data_loss": False})}
        )
        query = start_query(spark, settings, CONFIG, metrics=metrics)
        wait_until_read(query, topic, 300)
        broker = restarted_empty(broker)
        # Back with a short log: read from its beginning, so the newcomer is decided (over its
        # quota, so that its decision is written: docs/redis.md).
        ts = int(time.time() * 1000)
        late = json.dumps(produce("late", "c", 10_000, ts)).encode()
        publish(broker, topic, [late] * 6)
        agent = QuotaClient.connect(redis_server.host, redis_server.port, topic, CONFIG)
        entity = agent.entity_of_client("produce", user="late", client_id="c", broker=1)
        deadline = time.monotonic() + 120
        while agent.lookup("produce", entity) is None:
            assert query.isActive, query.exception()
            assert time.monotonic() < deadline, "the new log's records were not decided"
            time.sleep(0.2)
        # Counted from the batch's progress, which Spark's listener bus delivers after it.
        while not (lost := samples(metrics.scrape(), SOURCE_DATA_LOSS)):
            assert time.monotonic() < deadline, [
                (p["sources"][0]["startOffset"], p["sources"][0]["endOffset"])
                for p in query.recentProgress[-5:]
            ]
            time.sleep(0.2)
        assert sum(lost.values()) >= 1
        assert all(f'topic="{topic}"' in labels for labels in lost)
        assert f"{topic}-" in caplog.text
        assert "the log restarted at" in caplog.text
    finally:
        if query is not None:
            query.stop()
        metrics.close()
        broker.stop()


def test_a_source_that_never_met_the_broker_waits_one_request_timeout_per_trigger() -> None:
    """A trigger of a source first used during an outage (a query starting then) waits one
    request timeout, as every other, not kafka-python's 30 s for a first bootstrap."""
    topic = f"unmet-{uuid.uuid4().hex[:8]}"
    with start_kafka() as broker:
        publish(broker, topic, mixed_payloads(8, 30, users=2))
    source = KafkaStreamReader(
        SourceOptions.parse({"kafka.bootstrap.servers": broker.address, "subscribe": topic})
    )
    start = {topic: {"0": 10, "1": 10, "2": 10}}
    try:
        began = time.monotonic()
        assert source.latestOffset(start, ReadAllAvailable()) == start
        # One 2 s request timeout to bootstrap; a loaded machine may add a little.
        assert time.monotonic() - began < 8
    finally:
        source.stop()


#: Long enough for kafka-python's own reconnect pause to grow past 10 s if nothing bounds it.
LONG_OUTAGE_S = 45


def test_a_broker_back_after_a_long_outage_is_noticed_within_a_second_or_two() -> None:
    """kafka-python doubles its pause between connection attempts up to 30 s by default: after a
    long outage, a returned broker went unnoticed for up to half a minute more, trigger after
    trigger (measured: 15-23 s after a 60 s outage). The engine's consumers pause at most
    ``RECONNECT_BACKOFF_MAX_MS``. The source's driver side, without Spark; three sources, as
    where each consumer is in its pause when the broker returns is a matter of chance."""
    topic = f"back-{uuid.uuid4().hex[:8]}"
    values = mixed_payloads(7, 600, users=4, span_ms=5000)
    broker = start_kafka()
    options = {
        "kafka.bootstrap.servers": broker.address,
        "subscribe": topic,
        "startingOffsets": "earliest",
    }
    sources = [KafkaStreamReader(SourceOptions.parse(options)) for _ in range(3)]
    try:
        publish(broker, topic, values[:300])
        start = sources[0].latestOffset(sources[0].initialOffset(), ReadAllAvailable())
        assert sum(start[topic].values()) == 300
        # Each has met the broker, as the source of a running query has.
        assert all(source.latestOffset(start, ReadAllAvailable()) == start for source in sources)
        broker.process.kill()
        broker.stop(keep_log=True)
        # Triggers find it down (each waits one request timeout) for the whole outage.
        back_at = time.monotonic() + LONG_OUTAGE_S
        while time.monotonic() < back_at:
            for source in sources:
                assert source.latestOffset(start, ReadAllAvailable()) == start
        broker = broker.restart()
        restarted = time.monotonic()
        publish(broker, topic, values[300:], create=False)
        noticed_s = []
        for source in sources:
            while source.latestOffset(start, ReadAllAvailable()) == start:
                assert time.monotonic() - restarted < 60, "the broker was never noticed"
            noticed_s.append(time.monotonic() - restarted)
        # One pause, a connection and a trigger's requests (2 s each at most) per source,
        # with room for a loaded machine; kafka-python's own pause would be 24-36 s by now.
        assert max(noticed_s) < RECONNECT_BACKOFF_MAX_MS / 1000 + 7, noticed_s
    finally:
        for source in sources:
            source.stop()
        broker.stop()


#: The mid-stream restart's traffic. The producer stays ``PUBLISHED_AHEAD`` records ahead of
#: what the query has read, so the query always has records to read. Once it has read
#: ``READ_BEFORE_FAULT``, the broker hangs in the middle of a micro-batch, takes ``IN_FLIGHT``
#: more records it cannot acknowledge and is killed; ``PUBLISHED_WHILE_DOWN`` more are published
#: before it is back.
DURABLE_RECORDS = 1200
PUBLISHED_AHEAD = 300
READ_BEFORE_FAULT = 300
IN_FLIGHT = 50
PUBLISHED_WHILE_DOWN = 150


class PacedPublisher(threading.Thread):
    """Publishes ``values`` in order, round-robin over the topic's partitions, each as soon as
    the test has granted it (:meth:`grant`). The producer retries what the broker did not
    acknowledge, as an agent's does."""

    def __init__(self, address: str, topic: str, values: list[bytes]) -> None:
        super().__init__(name="paced-publisher", daemon=True)
        self.address, self.topic, self.values = address, topic, values
        self._granted = 0
        self._closed = False
        self._changed = threading.Condition()
        #: Records handed to the producer so far (those with a lower index).
        self.sent = 0
        #: Acknowledged records by index, and any the producer gave up on.
        self.acked: set[int] = set()
        self.failed: dict[int, Exception] = {}
        self.error: BaseException | None = None

    def grant(self, count: int) -> None:
        """Lets the producer publish the records below index ``count``."""
        with self._changed:
            self._granted = max(self._granted, min(count, len(self.values)))
            self._changed.notify_all()

    def close(self) -> None:
        """Stops publishing (a failed test) without waiting for acknowledgements."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def run(self) -> None:
        producer = KafkaProducer(
            bootstrap_servers=self.address,
            linger_ms=10,
            # Notices the restarted broker as soon as the engine's consumers do.
            reconnect_backoff_max_ms=RECONNECT_BACKOFF_MAX_MS,
        )
        try:
            for index, value in enumerate(self.values):
                with self._changed:
                    while not (self._closed or index < self._granted):
                        self._changed.wait()
                    if self._closed:
                        return
                future = producer.send(self.topic, value, partition=index % PARTITIONS)
                future.add_callback(lambda _, index=index: self.acked.add(index))
                future.add_errback(lambda error, index=index: self.failed.update({index: error}))
                self.sent = index + 1
            producer.flush()
        except BaseException as error:
            self.error = error
        finally:
            producer.close(timeout=0 if self._closed else None)


def publish_while_read(
    publisher: PacedPublisher, query: StreamingQuery, topic: str, until: Callable[[], bool]
) -> None:
    """Grants the publisher ``PUBLISHED_AHEAD`` records beyond what the query has read, until
    ``until()``: publishing and reading go on together."""
    deadline = time.monotonic() + 180
    while not until():
        assert query.isActive, query.exception()
        assert publisher.error is None, publisher.error
        assert time.monotonic() < deadline, (publisher.sent, read_offsets(query, topic))
        publisher.grant(read_offsets(query, topic) + PUBLISHED_AHEAD)
        time.sleep(0.05)


def wait_until_sent(publisher: PacedPublisher, count: int) -> None:
    deadline = time.monotonic() + 60
    while publisher.sent < count:
        assert publisher.error is None, publisher.error
        assert time.monotonic() < deadline, (publisher.sent, count)
        time.sleep(0.05)


def wait_until_run_into(
    spark: SparkSession, query: StreamingQuery, metrics: EngineMetrics
) -> OutageStatus | None:
    """Waits until the query has run into the dead broker: two triggers have found it
    unreachable (their outage status is returned), or, should a micro-batch have been planned
    just before the fault, its read waits for the broker and no trigger runs (None)."""
    deadline = time.monotonic() + 120
    while True:
        assert query.isActive, query.exception()
        status = read_status(metrics.source_status_file)
        if status is not None and status.since_ms is not None and status.failures >= 2:
            return status
        if job_stages(spark) == "reading":
            return None
        assert time.monotonic() < deadline, status
        time.sleep(0.1)


def job_stages(spark: SparkSession) -> Literal["reading", "past its read"] | None:
    """Where the running micro-batch is: its job's first stage reads its records, the later
    ones decide and write them (None: no job with tasks runs)."""
    tracker = spark.sparkContext.statusTracker()
    running = set(tracker.getActiveStageIds())
    for job_id in tracker.getActiveJobsIds():
        job = tracker.getJobInfo(job_id)
        if job is None or not job.stageIds:
            continue
        first = min(job.stageIds)
        if running & set(job.stageIds) - {first}:
            return "past its read"
        stage = tracker.getStageInfo(first)
        if first in running and stage is not None and stage.numTasks > 0:
            return "reading"
    return None


def batch_to_read(checkpoint: Path, topic: str) -> PlannedBatch | None:
    """The micro-batch planned last, if it has records of ``topic`` and is not committed yet."""
    planned = planned_batches(checkpoint)
    if not planned or commits(checkpoint) > planned[-1].batch_id:
        return None
    *earlier, last = planned
    start = sum(earlier[-1].offsets.get(topic, {}).values()) if earlier else 0
    return last if sum(last.offsets.get(topic, {}).values()) > start else None


def test_a_durable_broker_killed_mid_stream_is_waited_out_and_every_record_decided_once(
    spark: SparkSession, redis_server: LocalService, tmp_path: Path
) -> None:
    """The broker keeps its log (Kafka's own, on disk). Mid-stream (the
    producer publishing, a micro-batch deciding records it has read, more records to read) the
    broker hangs with records in flight and is killed. While it is down more records are
    published and the query's triggers fail to reach it; it is started again on its port and
    the rest is published. The query never stops, and decides every record (acknowledged
    before the fault, in flight at it, published while the broker was down or after it)
    exactly once, as the batch recomputation does."""
    topic = f"durable-{uuid.uuid4().hex[:8]}"
    values = mixed_payloads(5, DURABLE_RECORDS, users=8, span_ms=5000)
    checkpoint = tmp_path / "checkpoint"
    metrics = EngineMetrics(port=0)
    broker = start_kafka()
    publisher = PacedPublisher(broker.address, topic, values)
    query = None
    try:
        publish(broker, topic, [], partitions=PARTITIONS)
        settings = engine_settings(broker, redis_server, tmp_path, topic)
        assert settings.kafka.fail_on_data_loss
        query = start_query(spark, settings, CONFIG, metrics=metrics)
        publisher.start()
        # Mid-stream: the query has read some records, and a micro-batch has read more and
        # is deciding them; the triggers after it meet the fault.
        publish_while_read(
            publisher,
            query,
            topic,
            until=lambda: (
                read_offsets(query, topic) >= READ_BEFORE_FAULT
                and batch_to_read(checkpoint, topic) is not None
                and job_stages(spark) == "past its read"
            ),
        )
        # The broker hangs: what the producer sends now stays unacknowledged; then it dies.
        broker.pause()
        hung_at = publisher.sent
        publisher.grant(hung_at + IN_FLIGHT)
        wait_until_sent(publisher, hung_at + IN_FLIGHT)
        in_flight = publisher.sent - len(publisher.acked)
        assert in_flight >= IN_FLIGHT
        broker.process.kill()
        broker.stop(keep_log=True)
        down_until = publisher.sent + PUBLISHED_WHILE_DOWN
        publisher.grant(down_until)
        wait_until_sent(publisher, down_until)
        counted = wait_until_run_into(spark, query, metrics)
        if counted is not None:
            scraped = metrics.scrape()
            assert samples(scraped, KAFKA_OUTAGE)[""] > 0
            assert samples(scraped, KAFKA_OUTAGES)[""] >= 1
        # Nothing handed over since the broker hung was acknowledged while it was down.
        assert not publisher.acked & set(range(hung_at, publisher.sent))
        assert publisher.sent < DURABLE_RECORDS  # some are published after the restart
        # Started again on its port with its log; publishing and reading go on.
        broker = broker.restart()
        publish_while_read(publisher, query, topic, until=lambda: not publisher.is_alive())
        assert publisher.error is None, publisher.error
        assert publisher.failed == {}
        assert len(publisher.acked) == DURABLE_RECORDS
        wait_until_read(query, topic, DURABLE_RECORDS)
        assert query.exception() is None
        after = read_status(metrics.source_status_file) or OutageStatus(None, 0, 0)
        assert after.since_ms is None
        assert samples(metrics.scrape(), KAFKA_OUTAGE)[""] == 0
    finally:
        publisher.close()
        if query is not None:
            query.stop()
        metrics.close()
        broker.stop()
    print(f"broker killed with {in_flight} records in flight; the triggers' outage: {counted}")
    # Each record is once in the log and read once: no batch goes back, the last ends at the end.
    ends = [
        [batch.end_of(topic, partition) for partition in range(PARTITIONS)]
        for batch in planned_batches(checkpoint)
    ]
    assert all(
        earlier <= later
        for batch, next_batch in pairwise(ends)
        for earlier, later in zip(batch, next_batch, strict=True)
    ), ends
    assert sum(ends[-1]) == DURABLE_RECORDS
    assert_matches_batch_recomputation(spark, checkpoint, redis_server, topic, values, CONFIG)


def test_an_outage_longer_than_the_limit_fails_the_run_with_one_line(
    redis_server: LocalService, tmp_path: Path
) -> None:
    topic = f"gone-{uuid.uuid4().hex[:8]}"
    broker = start_kafka()
    try:
        publish(broker, topic, mixed_payloads(6, 30, users=2))
        engine = engine_file(
            tmp_path,
            topic,
            broker.address,
            {"host": redis_server.host, "port": redis_server.port, "key_prefix": topic},
            kafka={"max_outage_s": 4},
        )
        checkpoint = tmp_path / "checkpoint"
        run = subprocess.Popen(
            quotastream("run", "--engine-config", str(engine), "--no-simulate"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 180
        while commits(checkpoint) < 1:
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "no micro-batch committed"
            time.sleep(0.2)
        broker.stop()
        _out, err = run.communicate(timeout=180)
    finally:
        broker.stop()
    assert run.returncode == 1
    failed = [line for line in err.decode().splitlines() if line.startswith("the query failed:")]
    assert len(failed) == 1, err.decode()[-3000:]
    assert re.fullmatch(
        rf"the query failed: Kafka at {re.escape(broker.address)} unreachable for more than "
        r"4 s \(\d+ failed attempts\): .+",
        failed[0],
    ), failed[0]


#: The rolling restart's traffic: a first part before the query starts, then one part after each
#: node's restart.
ROLLING_RECORDS = 900


def test_a_rolling_restart_of_a_three_node_cluster_is_read_through_and_decided_once(
    spark: SparkSession, redis_server: LocalService, kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    """The events topic is replicated to all three nodes; while the query runs, each node in
    turn is stopped (Kafka's controlled shutdown moves its leaderships away), started again with
    its log, and waited for until every replica is back in sync, as an operator's rolling
    restart does; records are published between the restarts. The query never stops, reads
    every record once and decides as the batch recomputation does."""
    topic = f"rolling-{uuid.uuid4().hex[:8]}"
    values = mixed_payloads(9, ROLLING_RECORDS, users=6, span_ms=5000)
    parts = [values[i::4] for i in range(4)]
    ordered = [value for part in parts for value in part]
    publish(kafka_cluster, topic, parts[0], replicas=3)
    settings = engine_settings(kafka_cluster, redis_server, tmp_path, topic)
    query = start_query(spark, settings, CONFIG)
    try:
        wait_until_read(query, topic, len(parts[0]))
        published = len(parts[0])
        for index, part in enumerate(parts[1:]):
            node = kafka_cluster.nodes[index]
            kafka_cluster.nodes[index] = node.restart()
            wait_until_in_sync(kafka_cluster.address, [topic, f"{topic}.config"])
            publish(kafka_cluster, topic, part, create=False)
            published += len(part)
            assert query.isActive, query.exception()
        assert published == ROLLING_RECORDS
        wait_until_read(query, topic, ROLLING_RECORDS)
        assert query.exception() is None
    finally:
        query.stop()
    checkpoint = tmp_path / "checkpoint"
    assert sum(planned_batches(checkpoint)[-1].offsets[topic].values()) == ROLLING_RECORDS
    assert_matches_batch_recomputation(spark, checkpoint, redis_server, topic, ordered, CONFIG)
