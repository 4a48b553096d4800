"""The remote log bridge (``quotastream brokers``, quotastream/brokers/bridge.py) on a real 3-node
Apache Kafka with tiered storage: the engine, fed only from ``__remote_log_metadata``, publishes
each partition's remote log size as the broker's own ``RemoteLogSizeBytes`` gauge reads it."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import SparkSession

from quotastream.brokers.bridge import UNDECODABLE, RemoteLogBridge
from state.config import load_quota_config
from streaming.commands.brokers import build_remote_log_bridge
from streaming.engine.job import start_query
from streaming.engine.settings import EngineSettings
from streaming.kafka_broker import KafkaCluster, kafka_libs, kafka_version
from streaming.services import LocalService
from tests.servers import wait_until_in_sync

QUOTAS = Path(__file__).parents[1] / "conf" / "quotas.yaml"
METADATA_TOPIC = "__remote_log_metadata"
#: Tiered topics' segments roll every second and leave the local log a second after upload.
TIERED = {"remote.storage.enable": "true", "segment.ms": "1000", "local.retention.ms": "1000"}


def settings_for(
    cluster: KafkaCluster,
    redis_server: LocalService,
    tmp_path: Path,
    metadata_topic: str = METADATA_TOPIC,
) -> EngineSettings:
    """An engine reading its own events topic on ``cluster``, and the bridge of that cluster."""
    name = f"segments-{uuid.uuid4().hex[:8]}"
    libs = kafka_libs()
    base = EngineSettings.model_validate(
        {
            "redis": {"key_prefix": name},
            "spark": {"shards": 2, "shuffle_partitions": 2},
            "brokers": {
                "cluster": {"bootstrap_servers": cluster.address},
                "remote_log_metadata": {
                    "topic": metadata_topic,
                    "kafka_storage_jar": str(libs / f"kafka-storage-{kafka_version(libs)}.jar"),
                    "group_id": name,
                    "poll_ms": 200,
                },
                "metrics": {"enabled": False},
            },
        }
    )
    settings = base.pointed_at(
        cluster.address,
        redis_server.host,
        redis_server.port,
        str(tmp_path / "checkpoint"),
        topics=[name],
        starting_offsets="earliest",
        dead_letter_topic=f"{name}.dead-letter",
        config_topic=None,
    )
    admin = KafkaAdminClient(bootstrap_servers=cluster.address)
    admin.create_topics([NewTopic(t, 3, 3) for t in (name, f"{name}.dead-letter")])
    admin.close()
    return settings


@dataclass
class RunningBridge:
    bridge: RemoteLogBridge
    registry: CollectorRegistry
    thread: threading.Thread

    def sample(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
def run_bridge() -> Iterator[Any]:
    running: list[RunningBridge] = []

    def start(settings: EngineSettings) -> RunningBridge:
        registry = CollectorRegistry()
        bridge = build_remote_log_bridge(settings, registry)
        thread = threading.Thread(target=bridge.run, name="bridge", daemon=True)
        thread.start()
        running.append(RunningBridge(bridge, registry, thread))
        return running[-1]

    yield start
    for each in running:
        each.bridge.stop()
        each.thread.join(30)


def leader_of(address: str, topic: str) -> int:
    admin = KafkaAdminClient(bootstrap_servers=address)
    try:
        [described] = admin.describe_topics([topic])
        return int(described["partitions"][0]["leader_id"])
    finally:
        admin.close()


def broker_remote_log_size(cluster: KafkaCluster, topic: str) -> float | None:
    """The leader's ``RemoteLogSizeBytes`` of a one-partition ``topic`` (the gauge is per topic,
    over the partitions the broker leads), read from its JMX exporter; None before its first
    expiration run."""
    leader = leader_of(cluster.address, topic)
    node = next(node for node in cluster.nodes if node.node_id == leader)
    with urllib.request.urlopen(node.metrics_url, timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "kafka_server_BrokerTopicMetrics_Value"
                and sample.labels.get("name") == "RemoteLogSizeBytes"
                and sample.labels.get("topic") == topic
            ):
                return sample.value
    return None


def engine_remote_log_size(settings: EngineSettings, topic: str) -> int:
    """The total the engine published for partition 0 of ``topic`` (0: no live segment)."""
    client = redis.Redis(host=settings.redis.host, port=settings.redis.port)
    value: bytes | None = client.get(f"{settings.redis.key_prefix}:remote_log_size:{topic}:0")  # type: ignore[assignment]
    return 0 if value is None else int(json.loads(value)["total"])


def metadata_ends(address: str) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=address)
    try:
        partitions = [
            TopicPartition(METADATA_TOPIC, p)
            for p in consumer.partitions_for_topic(METADATA_TOPIC) or ()
        ]
        return {tp.partition: offset for tp, offset in consumer.end_offsets(partitions).items()}
    finally:
        consumer.close()


def produce(address: str, topics: list[str], seconds: float) -> None:
    """About 20 kB a second to each topic: a segment of ~20 kB rolls every second."""
    producer = KafkaProducer(bootstrap_servers=address, acks="all", linger_ms=5)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for topic in topics:
            producer.send(topic, b"x" * 2_000)
        producer.flush()
        time.sleep(0.1)
    producer.close()


def test_the_engine_publishes_each_partitions_remote_log_size_as_the_broker_reports_it(
    spark: SparkSession,
    tiered_cluster: KafkaCluster,
    redis_server: LocalService,
    tmp_path: Path,
    run_bridge: Any,
) -> None:
    """Two tiered topics: one keeps every segment, one deletes the oldest past 60 kB (the
    broker's size-based retention). Segments are uploaded, some deleted, and the leader of each
    topic is restarted mid-way (a new leader uploads and measures from there on). Once nothing
    changes any more, the engine's size of each partition, computed from the remote_segment
    events the bridge made of ``__remote_log_metadata`` alone, equals the current leader's
    ``RemoteLogSizeBytes``."""
    address = tiered_cluster.address
    settings = settings_for(tiered_cluster, redis_server, tmp_path)
    kept, sized = f"kept-{uuid.uuid4().hex[:6]}", f"sized-{uuid.uuid4().hex[:6]}"
    admin = KafkaAdminClient(bootstrap_servers=address)
    admin.create_topics(
        [
            NewTopic(kept, 1, 3, topic_configs=TIERED),
            NewTopic(sized, 1, 3, topic_configs={**TIERED, "retention.bytes": "60000"}),
        ]
    )
    admin.close()
    bridge = run_bridge(settings)
    query = start_query(spark, settings, load_quota_config(QUOTAS))
    try:
        produce(address, [kept, sized], seconds=5)
        leaders = {topic: leader_of(address, topic) for topic in (kept, sized)}
        nodes = tiered_cluster.nodes
        for index in [i for i, node in enumerate(nodes) if node.node_id in leaders.values()]:
            nodes[index] = nodes[index].restart()
        wait_until_in_sync(address, [kept, sized])
        produce(address, [kept, sized], seconds=4)
        moved = {topic: leader_of(address, topic) for topic in (kept, sized)}
        assert all(moved[topic] != leaders[topic] for topic in moved), (leaders, moved)

        # Converged: every size agrees, and neither they nor the metadata topic changed for 3 s.
        deadline, last, steady_since = time.monotonic() + 120, None, time.monotonic()
        while True:
            state = (
                {t: broker_remote_log_size(tiered_cluster, t) for t in (kept, sized)},
                {t: engine_remote_log_size(settings, t) for t in (kept, sized)},
                metadata_ends(address),
            )
            if state != last:
                last, steady_since = state, time.monotonic()
            broker, engine = state[0], state[1]
            if broker == engine and time.monotonic() - steady_since >= 3:
                break
            assert time.monotonic() < deadline, f"broker {broker} != engine {engine}"
            time.sleep(0.5)
    finally:
        query.stop()
    assert all(size > 0 for size in engine.values()), engine
    published = "quotastream_remote_log_events_published_total"
    deleted = bridge.sample(published, state="delete_finished")
    copied = bridge.sample(published, state="copy_finished")
    assert deleted > 0  # the broker's retention deleted segments of `sized`
    assert copied > deleted
    assert bridge.sample("quotastream_remote_log_dead_letters_total", reason=UNDECODABLE) == 0
