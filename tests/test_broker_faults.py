"""Broker faults under a running query: a broker that loses its log, and one that keeps it.

An in-memory broker restarted forgets every record: the offsets in the checkpoint point past the
end of the new log. With failOnDataLoss the query fails naming topic, partition and offsets;
without it the engine warns, counts it and reads the new log from its beginning. A broker that
keeps its log in an object store (tansu on S3, SeaweedFS) restarts without losing a record.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from quotastream import QuotaClient
from state.config import parse_quota_config
from streaming.job import start_query
from streaming.metrics import SOURCE_DATA_LOSS, EngineMetrics
from streaming.services import LocalService, start_kafka, start_object_store
from tests.expected import by_key, final_decisions
from tests.factories import MIXED_QUOTAS, mixed_payloads, produce
from tests.test_chaos import stored_decisions
from tests.test_metrics import samples
from tests.test_streaming import engine_settings, publish

CONFIG = parse_quota_config(MIXED_QUOTAS, "test config")


def read_offsets(query: StreamingQuery, topic: str) -> int:
    """Records of ``topic`` the query has read, by its last progress (0 before one)."""
    progress = query.lastProgress
    if not progress:
        return 0
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
    assert (
        "the next offset to read is 100 but the log ends at 2" in error
        or "the partition is gone (the next offset to read was 100)" in error
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


def test_a_broker_that_keeps_its_log_in_an_object_store_restarts_without_losing_a_record(
    spark: SparkSession, redis_server: LocalService, tmp_path: Path
) -> None:
    topic = f"durable-{uuid.uuid4().hex[:8]}"
    values = mixed_payloads(5, 1200, users=8, span_ms=5000)
    with start_object_store() as store:
        storage, environment = f"s3://{store.bucket}/", store.environment()
        broker = start_kafka(storage=storage, storage_environment=environment)
        query = None
        try:
            publish(broker, topic, values[:600])
            settings = engine_settings(broker, redis_server, tmp_path, topic)
            assert settings.kafka.fail_on_data_loss
            query = start_query(spark, settings, CONFIG)
            wait_until_read(query, topic, 600)
            # Killed outright, then started again on its port with the same storage.
            port = broker.port
            broker.process.kill()
            broker.stop()
            broker = start_kafka(port=port, storage=storage, storage_environment=environment)
            publish(broker, topic, values[600:], create=False)
            wait_until_read(query, topic, 1200)
            assert query.exception() is None
        finally:
            if query is not None:
                query.stop()
            broker.stop()
    stored = stored_decisions(redis.Redis(host=redis_server.host, port=redis_server.port), topic)
    expected = by_key(final_decisions(values, CONFIG))
    assert len(stored) == len(expected)
    for (quota, entity), want in expected.items():
        got = stored[f"{topic}:{quota}:{entity}"]
        assert got["rate"] == pytest.approx(want["rate"]), (quota, entity)
        assert got["throttle_ms"] == want["throttle_ms"], (quota, entity)
