"""The brokers' metrics source of ``quotastream brokers`` (quotastream/brokers/broker_metrics.py)
on a real 3-node Apache Kafka with tiered storage, each broker running the JMX exporter: remote
reads counted by the brokers are published as ``remote_fetch`` counts, byte for byte, across a
restart of the broker serving them (its exporter down meanwhile, its counters started over)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from prometheus_client import CollectorRegistry

from quotastream.outage import Outage
from streaming.commands.brokers import build_broker_metrics
from streaming.engine.settings import EngineSettings
from streaming.kafka_broker import KafkaCluster, KafkaNode
from streaming.services import LocalService
from tests.servers import broker_metric, topic_records, until, wait_until_in_sync
from tests.support.engine import engine_settings

COUNT = "kafka_server_BrokerTopicMetrics_Count"
TIERED = {"remote.storage.enable": "true", "segment.ms": "1000", "local.retention.ms": "1000"}


def fetched(node: KafkaNode, topic: str) -> float:
    """The bytes ``node`` read from the remote store for ``topic`` since it started."""
    return broker_metric(node, COUNT, name="RemoteFetchBytesPerSec", topic=topic) or 0.0


def read_all(address: str, topic: str, records: int) -> None:
    """Reads ``topic`` from its first offset, in a group of its own: what is no longer in the
    local log is read from the remote store."""
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=address,
        group_id=f"reader-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        consumer_timeout_ms=30_000,
    )
    try:
        for count, _ in enumerate(consumer, start=1):
            if count == records:
                return
        raise AssertionError(f"read fewer than {records} records of {topic}")
    finally:
        consumer.close()


@pytest.fixture
def source_settings(
    tiered_cluster: KafkaCluster, redis_server: LocalService, tmp_path: Path
) -> EngineSettings:
    events = f"broker-counts-{uuid.uuid4().hex[:6]}"
    admin = KafkaAdminClient(bootstrap_servers=tiered_cluster.address)
    admin.create_topics([NewTopic(events, 3, 3)])
    admin.close()
    engine = engine_settings(tiered_cluster, redis_server, tmp_path, events)
    endpoints = {node.node_id: node.metrics_url for node in tiered_cluster.nodes}
    brokers = {"broker_metrics": {"enabled": True, "endpoints": endpoints, "interval_ms": 300}}
    return EngineSettings.model_validate({**engine.model_dump(), "brokers": brokers})


def test_remote_reads_are_published_byte_for_byte_across_a_restart_of_the_broker_serving_them(
    tiered_cluster: KafkaCluster, source_settings: EngineSettings
) -> None:
    """A tiered topic's segments are uploaded and leave the local log; reading it from the start
    reads them from the remote store. The source scrapes every broker every 0.3 s. The leader
    is restarted between two reads: its exporter is down meanwhile, and its counters start over.
    The remote_fetch counts published add up to the bytes the brokers counted after the
    source's first scrape: those before the restart, and those since."""
    address = tiered_cluster.address
    topic = f"fetched-{uuid.uuid4().hex[:6]}"
    admin = KafkaAdminClient(bootstrap_servers=address)
    admin.create_topics([NewTopic(topic, 1, 3, topic_configs=TIERED)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=address, acks="all", linger_ms=5)
    for _ in range(30):  # 3 s: two or three segments to upload
        for _ in range(10):
            producer.send(topic, b"x" * 2_000)
        producer.flush()
        time.sleep(0.1)
    producer.close()
    nodes = tiered_cluster.nodes

    def uploaded_and_gone_locally() -> bool:
        """Some uploaded segment is gone from the leader's local log (local retention, 1 s):
        reading the topic from its start reads the remote store."""
        for node in nodes:
            copied = broker_metric(node, COUNT, name="RemoteCopyBytesPerSec", topic=topic)
            local = broker_metric(
                node, "kafka_log_Log_Value", name="Size", topic=topic, partition="0"
            )
            if copied and local is not None and local + 20_000 < copied:
                return True
        return False

    until(uploaded_and_gone_locally, 60, "an uploaded segment gone from the local log")

    registry = CollectorRegistry()
    source = build_broker_metrics(source_settings, registry)
    stopped = threading.Event()
    thread = threading.Thread(
        target=source.run, args=(stopped, 0.3, Outage("events", 60)), daemon=True
    )

    def scrapes(node: KafkaNode, outcome: str) -> float:
        labels = {"broker": str(node.node_id), "outcome": outcome}
        return registry.get_sample_value("quotastream_broker_metrics_scrapes_total", labels) or 0

    def scraped_twice_more() -> None:
        """Until every broker has been scraped twice more: once may be under way already."""
        before = {node.node_id: scrapes(node, "ok") for node in nodes}
        until(
            lambda: all(scrapes(node, "ok") >= before[node.node_id] + 2 for node in nodes),
            30,
            "two more scrapes",
        )

    baseline = {node.node_id: fetched(node, topic) for node in nodes}
    thread.start()
    try:
        scraped_twice_more()
        read_all(address, topic, 300)
        scraped_twice_more()
        before_restart = {node.node_id: fetched(node, topic) for node in nodes}
        [leader] = [n for n in nodes if before_restart[n.node_id] > baseline[n.node_id]]
        index = nodes.index(leader)
        nodes[index] = nodes[index].restart()
        wait_until_in_sync(address, [topic])
        read_all(address, topic, 300)
        scraped_twice_more()
        expected = sum(
            (before_restart[n.node_id] - baseline[n.node_id]) + fetched(n, topic)
            if n.node_id == leader.node_id
            else fetched(n, topic) - baseline[n.node_id]
            for n in nodes
        )
    finally:
        stopped.set()
        thread.join(30)
    published = [
        json.loads(record.value)
        for record in topic_records(address, source_settings.kafka.topics[0])
    ]
    counts = [event for message in published for event in message]
    ours = [
        event for event in counts if event["kind"] == "remote_fetch" and event["topic"] == topic
    ]
    assert expected > 0
    assert sum(event["bytes"] for event in ours) == expected
    assert "partition" not in ours[0]  # a per-topic count
    assert scrapes(nodes[index], "failed") >= 1  # its exporter was down while it restarted
