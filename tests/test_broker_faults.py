"""Broker faults under a running query: a broker that loses its log, and one that keeps it.

An in-memory broker restarted forgets every record: the offsets in the checkpoint point past the
end of the new log. With failOnDataLoss the query fails naming topic, partition and offsets;
without it the engine warns, counts it and reads the new log from its beginning. A broker that
keeps its log in an object store (tansu on S3, SeaweedFS) restarts without losing a record; while
it is down the query waits for it (a Kafka outage), for as long as ``kafka.max_outage_s``.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.sql.streaming.query import StreamingQuery

from quotastream import QuotaClient
from quotastream.outage import OutageStatus
from state.config import parse_quota_config
from streaming.job import start_query
from streaming.kafka_clients import RECONNECT_BACKOFF_MAX_MS
from streaming.kafka_source import KafkaStreamReader
from streaming.metrics import KAFKA_OUTAGE, KAFKA_OUTAGES, SOURCE_DATA_LOSS, EngineMetrics
from streaming.offsets import SourceOptions
from streaming.services import LocalService, start_kafka, start_object_store
from streaming.source_status import read_status
from tests.expected import by_key, final_decisions
from tests.factories import MIXED_QUOTAS, mixed_payloads, produce
from tests.test_chaos import commits, engine_file, quotastream, stored_decisions
from tests.test_metrics import samples
from tests.test_streaming import engine_settings, publish

CONFIG = parse_quota_config(MIXED_QUOTAS, "test config")


def read_offsets(query: StreamingQuery, topic: str) -> int:
    """Records of ``topic`` the query has read, by its last progress (0 before one)."""
    progress = query.lastProgress
    return read_offsets_of(progress, topic) if progress else 0


def read_offsets_of(progress: dict[str, Any], topic: str) -> int:
    """Records of ``topic`` read by the end of one micro-batch."""
    end: Any = progress["sources"][0]["endOffset"]
    offsets = json.loads(end) if isinstance(end, str) else end
    return sum(int(offset) for offset in (offsets or {}).get(topic, {}).values())


def wait_until_read(query: StreamingQuery, topic: str, count: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while read_offsets(query, topic) < count:
        assert query.isActive, query.exception()
        assert time.monotonic() < deadline, f"read {read_offsets(query, topic)} of {count}"
        time.sleep(0.2)


def restarted_empty(broker: LocalService) -> LocalService:
    """The in-memory broker stopped and started again on its port: its log is gone."""
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
        # The topic comes back as a client asks for it (tansu creates topics on demand).
        publish(broker, topic, mixed_payloads(4, 6, users=3), create=False)
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
        # Back with a short log: read from its beginning, so the newcomer is decided.
        ts = int(time.time() * 1000)
        late = json.dumps(produce("late", "c", 100, ts)).encode()
        publish(broker, topic, [late] * 6, create=False)
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


def wait_for_outage(
    query: StreamingQuery, metrics: EngineMetrics, failed_triggers: int, timeout_s: float = 120
) -> OutageStatus:
    """Waits until the source has found the broker unreachable at ``failed_triggers`` triggers."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert query.isActive, query.exception()
        status = read_status(metrics.source_status_file)
        if (
            status is not None
            and status.since_ms is not None
            and status.failures >= failed_triggers
        ):
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.2)


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
    with start_object_store() as store:
        storage, environment = f"s3://{store.bucket}/", store.environment()
        broker = start_kafka(storage=storage, storage_environment=environment)
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
            assert all(
                source.latestOffset(start, ReadAllAvailable()) == start for source in sources
            )
            port = broker.port
            broker.process.kill()
            broker.stop()
            # Triggers find it down (each waits one request timeout) for the whole outage.
            back_at = time.monotonic() + LONG_OUTAGE_S
            while time.monotonic() < back_at:
                for source in sources:
                    assert source.latestOffset(start, ReadAllAvailable()) == start
            broker = start_kafka(port=port, storage=storage, storage_environment=environment)
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


def test_a_broker_down_for_several_triggers_is_waited_out_and_every_record_decided_once(
    spark: SparkSession, redis_server: LocalService, tmp_path: Path
) -> None:
    """The broker keeps its log in an object store (tansu on S3, SeaweedFS): killed, down for
    several triggers, started again on its port. The query waits, counts the outage, and
    decides every record before and after exactly as the batch recomputation does."""
    topic = f"durable-{uuid.uuid4().hex[:8]}"
    values = mixed_payloads(5, 1200, users=8, span_ms=5000)
    metrics = EngineMetrics(port=0)
    with start_object_store() as store:
        storage, environment = f"s3://{store.bucket}/", store.environment()
        broker = start_kafka(storage=storage, storage_environment=environment)
        query = None
        try:
            publish(broker, topic, values[:600])
            settings = engine_settings(broker, redis_server, tmp_path, topic)
            assert settings.kafka.fail_on_data_loss
            query = start_query(spark, settings, CONFIG, metrics=metrics)
            wait_until_read(query, topic, 600)
            batches_before = len(query.recentProgress)
            # Killed outright; down while several triggers find it unreachable.
            port = broker.port
            broker.process.kill()
            broker.stop()
            during = wait_for_outage(query, metrics, failed_triggers=4)
            scraped = metrics.scrape()
            assert samples(scraped, KAFKA_OUTAGE)[""] > 0
            assert samples(scraped, KAFKA_OUTAGES)[""] >= 1
            # Started again on its port with the same storage; the rest is published.
            broker = start_kafka(port=port, storage=storage, storage_environment=environment)
            publish(broker, topic, values[600:], create=False)
            wait_until_read(query, topic, 1200)
            assert query.exception() is None
            # Nothing was read twice: offsets only moved forward, batch after batch.
            read = [read_offsets_of(p, topic) for p in query.recentProgress[batches_before:]]
            assert read == sorted(read)
            after = read_status(metrics.source_status_file)
            assert after is not None
            assert after.since_ms is None
            assert after.outages >= during.outages >= 1
            assert samples(metrics.scrape(), KAFKA_OUTAGE)[""] == 0
        finally:
            if query is not None:
                query.stop()
            metrics.close()
            broker.stop()
    stored = stored_decisions(redis.Redis(host=redis_server.host, port=redis_server.port), topic)
    expected = by_key(final_decisions(values, CONFIG))
    assert len(stored) == len(expected)
    for (quota, entity), want in expected.items():
        got = stored[f"{topic}:{quota}:{entity}"]
        assert got["rate"] == pytest.approx(want["rate"]), (quota, entity)
        assert got["throttle_ms"] == want["throttle_ms"], (quota, entity)


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
