"""The remote log bridge (``quotastream brokers``, quotastream/brokers/bridge.py) on a real 3-node
Apache Kafka with tiered storage: the engine, fed only from ``__remote_log_metadata``, publishes
each partition's remote log size as the broker's own ``RemoteLogSizeBytes`` gauge reads it."""

from __future__ import annotations

import base64
import json
import math
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import (
    AlterConfigOp,
    ConfigResource,
    ConfigResourceType,
    KafkaAdminClient,
    NewTopic,
)
from kafka.protocol.consumer.offsets import OffsetSpec
from prometheus_client import CollectorRegistry
from pyspark.sql import SparkSession

from quotastream.brokers.bridge import UNDECODABLE, UNFOLLOWABLE, RemoteLogBridge
from quotastream.brokers.remote_log_metadata import (
    SEGMENT,
    SEGMENT_UPDATE,
    RemoteLogMetadataSchemas,
    UndecodableRecordError,
)
from quotastream.brokers.segments import RefusedRecordError, SegmentLifecycle
from quotastream.client import QuotaClient
from quotastream.outage import Outage
from state.config import load_quota_config
from state.event_contract import encode
from state.remote_log_view import RemoteLog
from streaming.commands.brokers import build_lineage_source, build_remote_log_bridge
from streaming.engine.job import start_query
from streaming.engine.settings import EngineSettings
from streaming.kafka_broker import KafkaCluster, kafka_libs, kafka_version
from streaming.services import LocalService
from tests.servers import broker_metric, start_command, topic_records, until, wait_until_in_sync
from tests.support.engine import engine_settings
from tests.support.remote_log import metadata_values

ROOT = Path(__file__).parents[1]
QUOTAS = ROOT / "conf" / "quotas.yaml"
METADATA_TOPIC = "__remote_log_metadata"
COUNT = "kafka_server_BrokerTopicMetrics_Count"
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
    engine = engine_settings(cluster, redis_server, tmp_path, name, shuffle_partitions=2)
    brokers = {
        "cluster": {"bootstrap_servers": cluster.address},
        "remote_log_metadata": {
            "topic": metadata_topic,
            "kafka_storage_jar": str(libs / f"kafka-storage-{kafka_version(libs)}.jar"),
            "group_id": name,
            "poll_ms": 200,
        },
        # The bridge's events alone: a test that wants lineages runs the source itself.
        "leader_epochs": {"enabled": False},
        "metrics": {"enabled": False},
    }
    settings = EngineSettings.model_validate({**engine.model_dump(), "brokers": brokers})
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
    gauge = "kafka_server_BrokerTopicMetrics_Value"
    return broker_metric(node, gauge, name="RemoteLogSizeBytes", topic=topic)


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

        # Converged: the broker's retention has deleted segments of `sized` (its task runs
        # every 0.5 s, late on a busy machine), every size agrees, and neither they nor the
        # metadata topic changed for 3 s. Kafka deletes a remote segment only once the log's
        # excess over retention.bytes covers the whole segment, and segments roll by time: a
        # slow machine may have uploaded too few by now, so `sized` gets more until one goes.
        published = "quotastream_remote_log_events_published_total"
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
            deleted = bridge.sample(published, event="delete_finished")
            if deleted and broker == engine and time.monotonic() - steady_since >= 3:
                break
            assert time.monotonic() < deadline, f"broker {broker}, engine {engine}, {deleted=}"
            if deleted:
                time.sleep(0.5)
            else:
                produce(address, [sized], seconds=1)
    finally:
        query.stop()
    assert all(size > 0 for size in engine.values()), engine
    assert bridge.sample(published, event="copy_finished") > deleted
    assert bridge.sample("quotastream_remote_log_dead_letters_total", reason=UNDECODABLE) == 0


def topic_values(address: str, topic: str) -> list[tuple[bytes | None, bytes]]:
    return [(record.key, record.value) for record in topic_records(address, topic)]


def by_partition(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Events per segment topic partition, in order: what the events topic must keep in order."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        grouped.setdefault(f"{event['topic']}-{event['partition']}", []).append(event)
    return grouped


def published(address: str, topic: str) -> dict[str, list[dict[str, Any]]]:
    """The events of each key, in order (each message a batched one)."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for key, value in topic_values(address, topic):
        assert key is not None
        grouped.setdefault(key.decode(), []).extend(json.loads(value))
    return grouped


def lifecycle_events(schemas: RemoteLogMetadataSchemas, values: list[bytes]) -> list[Any]:
    """What Kafka's records make, the pure lifecycle as the oracle (refused records skipped),
    as the events topic holds them."""
    lifecycle, events = SegmentLifecycle(), []
    for value in values:
        try:
            events += lifecycle.apply(schemas.decode(value))
        except (UndecodableRecordError, RefusedRecordError):
            continue
    return [json.loads(encode(event)) for event in events]


def test_the_bridge_resumes_from_its_position_and_dead_letters_what_it_cannot_follow(
    tiered_cluster: KafkaCluster, redis_server: LocalService, tmp_path: Path
) -> None:
    """The bridge reads a copy of the cluster's real ``__remote_log_metadata`` (a record Kafka's
    own metadata manager would refuse must not go into the real one), in two halves split
    between a segment's upload start and its end, with two records it cannot follow in front:
    an update of a segment it has not seen start, and a record of a version the schemas do not
    list. Run in a thread, then stopped; then as ``quotastream brokers`` after the second half
    came, stopped by SIGTERM; then started again and killed. It publishes each event Kafka's
    records make exactly once, in each partition's order: the second run rebuilt the started
    upload from the first half and published only what came after its position; the third
    published nothing. The two refused records are each one dead letter, with their reason
    and coordinates."""
    address = tiered_cluster.address
    topic = f"uploads-{uuid.uuid4().hex[:6]}"
    admin = KafkaAdminClient(bootstrap_servers=address)
    admin.create_topics([NewTopic(topic, 2, 3, topic_configs=TIERED)])
    admin.close()
    produce(address, [topic], seconds=4)
    libs = kafka_libs()
    schemas = RemoteLogMetadataSchemas.from_jar(libs / f"kafka-storage-{kafka_version(libs)}.jar")

    def copies_agree() -> list[bytes] | None:
        """The metadata now, once the uploads its records make equal what the brokers counted
        (``RemoteCopyBytesPerSec`` of the topic, on every broker): each upload's remote_copy
        bytes are the copy quota's."""
        values = metadata_values(address)
        made = sum(
            event["bytes"]
            for event in lifecycle_events(schemas, values)
            if event["kind"] == "remote_copy" and event["topic"] == topic
        )
        counted = sum(
            broker_metric(node, COUNT, name="RemoteCopyBytesPerSec", topic=topic) or 0
            for node in tiered_cluster.nodes
        )
        return values if made == counted > 0 else None

    records = until(copies_agree, 60, "the uploads' bytes equal the brokers' count")
    decoded = [schemas.decode(value) for value in records]
    finished = {
        d.message.remote_log_segment_id.id
        for d in decoded
        if d.name == SEGMENT_UPDATE and d.message.remote_log_segment_state == 1
    }
    # After the last upload start whose finish comes later: the second half finishes it.
    split = 1 + max(
        i
        for i, d in enumerate(decoded)
        if d.name == SEGMENT and d.message.remote_log_segment_id.id in finished
    )
    first_finish = next(
        value
        for value, d in zip(records, decoded, strict=True)
        if d.name == SEGMENT_UPDATE and d.message.remote_log_segment_state == 1
    )
    unknown_version = records[0][:2] + b"\x09" + records[0][3:]
    refused = [first_finish, unknown_version]
    first, second = refused + records[:split], records[split:]
    copy = f"metadata-copy-{uuid.uuid4().hex[:6]}"
    settings = settings_for(tiered_cluster, redis_server, tmp_path, metadata_topic=copy)
    events_topic, dead_letter = settings.kafka.topics[0], settings.kafka.dead_letter_topic
    publish_values(address, copy, first)

    registry = CollectorRegistry()
    bridge = build_remote_log_bridge(settings, registry)
    thread = threading.Thread(target=bridge.run, daemon=True)
    thread.start()
    assert bridge.caught_up.wait(60)
    bridge.stop()
    thread.join(30)
    expected_first = lifecycle_events(schemas, first)
    assert expected_first
    assert published(address, events_topic) == by_partition(expected_first)
    letters = sorted(
        (json.loads(value) for _, value in topic_values(address, dead_letter)),
        key=lambda letter: int(letter["source"]["offset"]),
    )
    assert [(letter["reason"], letter["source"]) for letter in letters] == [
        (UNFOLLOWABLE, {"topic": copy, "partition": 0, "offset": 0, "index": None}),
        (UNDECODABLE, {"topic": copy, "partition": 0, "offset": 1, "index": None}),
    ]
    assert [payload_of(letter) for letter in letters] == refused
    assert "version 9" in letters[1]["detail"]

    publish_values(address, copy, second, create=False)
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump(settings.model_dump(mode="json")))
    command, output = ["brokers", "--engine-config", str(path)], tmp_path / "brokers.log"
    process = start_command(command, output, "caught up with")
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    expected = lifecycle_events(schemas, first + second)
    assert len(expected) > len(expected_first)
    assert published(address, events_topic) == by_partition(expected)

    process = start_command(command, output, "caught up with")
    process.kill()
    process.wait(30)
    assert published(address, events_topic) == by_partition(expected)
    assert len(topic_values(address, dead_letter)) == 2


def payload_of(letter: dict[str, Any]) -> bytes:
    if "payload_base64" in letter:
        return base64.b64decode(letter["payload_base64"])
    return str(letter["payload"]).encode()


def publish_values(address: str, topic: str, values: list[bytes], create: bool = True) -> None:
    if create:
        admin = KafkaAdminClient(bootstrap_servers=address)
        admin.create_topics([NewTopic(topic, 1, 3)])
        admin.close()
    producer = KafkaProducer(bootstrap_servers=address, acks="all")
    for value in values:
        producer.send(topic, value)
    producer.flush()
    producer.close()


@dataclass(frozen=True)
class Settled:
    """A tiered partition at rest: every rolled segment uploaded, and the engine's view of its
    remote log (segments and lineage) the leader's."""

    remote_log: RemoteLog
    #: Kafka's ``onlyLocalLogSegmentsSize``: the leader's local segments from the highest
    #: offset in remote storage on (the active one, once every rolled one is uploaded).
    local_only_bytes: int


def settled(cluster: KafkaCluster, settings: EngineSettings, topic: str) -> Settled | None:
    partition = TopicPartition(topic, 0)
    admin = KafkaAdminClient(bootstrap_servers=cluster.address)
    try:
        [described] = admin.describe_topics([topic])
        leader = described["partitions"][0]
        tiered = admin.list_partition_offsets({partition: OffsetSpec.LATEST_TIERED})[partition]
        end = admin.list_partition_offsets({partition: OffsetSpec.LATEST})[partition]
    finally:
        admin.close()
    node = next(node for node in cluster.nodes if node.node_id == leader["leader_id"])
    local = {
        int(path.stem): path.stat().st_size for path in (node.log_dir / f"{topic}-0").glob("*.log")
    }
    remote_log = QuotaClient(
        redis.Redis(host=settings.redis.host, port=settings.redis.port), settings.redis.key_prefix
    ).remote_log(topic, 0)
    view = remote_log.retention
    broker_size = broker_remote_log_size(cluster, topic)
    at_rest = (
        tiered.offset == max(local) - 1
        and view is not None
        and view.lineage is not None
        and view.lineage[-1][0] == leader["leader_epoch"]
        and view.log_end_offset == end.offset
        and broker_size == remote_log.total
    )
    if not at_rest:
        return None
    only_local = sum(size for base, size in local.items() if base >= tiered.offset)
    return Settled(remote_log, only_local)


def produce_segments(address: str, topic: str, segments: float) -> None:
    """``segments`` times ``SEGMENT_BYTES`` of 10 kB records."""
    producer = KafkaProducer(bootstrap_servers=address, acks="all", linger_ms=5)
    for _ in range(int(segments * SEGMENT_BYTES / 10_000)):
        producer.send(topic, b"x" * 10_000)
    producer.close()


#: Kafka's smallest ``segment.bytes``: a walked topic's segments roll by size alone.
SEGMENT_BYTES = 1_048_576


def test_the_engines_retention_walk_deletes_what_the_brokers_cleaner_deletes(
    spark: SparkSession,
    tiered_cluster: KafkaCluster,
    redis_server: LocalService,
    tmp_path: Path,
    run_bridge: Any,
) -> None:
    """A tiered topic without retention gets segments under two leaders, its first leader
    restarted mid-segment: the new leader's first upload spans both epochs. At rest, the
    engine's view, fed only by the bridge and the lineage source, is asked which segments
    ``retention.bytes`` = R deletes, R chosen to delete the walk's first two and not the whole
    third (which stops the walk). Then the topic gets R: the segments the broker's cleaner
    deletes, as ``__remote_log_metadata`` has them, are those, in that order; and once the
    engine's view agrees with the broker again, it deletes no more."""
    address = tiered_cluster.address
    settings = settings_for(tiered_cluster, redis_server, tmp_path)
    topic = f"walked-{uuid.uuid4().hex[:6]}"
    admin = KafkaAdminClient(bootstrap_servers=address)
    configs = {"remote.storage.enable": "true", "segment.bytes": str(SEGMENT_BYTES)}
    admin.create_topics([NewTopic(topic, 1, 3, topic_configs={**configs, "retention.ms": "-1"})])
    admin.close()
    run_bridge(settings)
    stopped = threading.Event()
    lineage = threading.Thread(
        target=build_lineage_source(settings, CollectorRegistry()).run,
        args=(stopped, 0.5, Outage("Kafka", math.inf)),
        daemon=True,
    )
    lineage.start()
    query = start_query(spark, settings, load_quota_config(QUOTAS))
    try:
        produce_segments(address, topic, 2.5)
        first = leader_of(address, topic)
        nodes = tiered_cluster.nodes
        index = next(i for i, node in enumerate(nodes) if node.node_id == first)
        nodes[index] = nodes[index].restart()
        wait_until_in_sync(address, [topic])
        produce_segments(address, topic, 2.5)
        assert leader_of(address, topic) != first
        at_rest = until(lambda: settled(tiered_cluster, settings, topic), 120, "at rest")
        leader = leader_of(address, topic)
        remote_log = at_rest.remote_log
        assert sum(remote_log.epochs.values()) > remote_log.total  # a segment spans epochs
        walk = remote_log.retention_walk
        assert len(walk) >= 4, walk
        assert all(within for _, _, within in walk), walk
        [(_, first_size, _), (_, second_size, _), (_, third_size, _)] = walk[:3]
        retention_bytes = (
            at_rest.local_only_bytes
            + at_rest.remote_log.retention_bytes
            - (first_size + second_size + third_size // 2)
        )
        expected = at_rest.remote_log.retention_breach(retention_bytes, at_rest.local_only_bytes)
        assert expected == [walk[0][0], walk[1][0]]

        libs = kafka_libs()
        jar = libs / f"kafka-storage-{kafka_version(libs)}.jar"
        schemas = RemoteLogMetadataSchemas.from_jar(jar)
        admin = KafkaAdminClient(bootstrap_servers=address)
        retention = {"retention.bytes": (AlterConfigOp.SET, str(retention_bytes))}
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, retention)])
        admin.close()

        def deleted() -> list[str]:
            return [
                event["segment_id"]
                for event in lifecycle_events(schemas, metadata_values(address))
                if event["kind"] == "remote_segment"
                and event["topic"] == topic
                and event["state"] == "delete_finished"
            ]

        def deleted_and_settled() -> Settled | None:
            """At rest again, with less in remote storage: the broker's gauge, measured as a
            cleaner run begins, shows one after the run that deleted."""
            now = settled(tiered_cluster, settings, topic)
            return now if now is not None and now.remote_log.total < remote_log.total else None

        after = until(deleted_and_settled, 60, "the broker's cleaner deletes segments")
        # A new leader would compute retention over its own segments (start_kafka_cluster).
        assert leader_of(address, topic) == leader
        assert deleted() == expected
        assert after.remote_log.retention_breach(retention_bytes, after.local_only_bytes) == []
    finally:
        stopped.set()
        query.stop()
        lineage.join(30)
