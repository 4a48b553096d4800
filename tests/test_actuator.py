"""The actuator (``quotastream brokers``, quotastream/brokers/actuator.py) on a real 3-node Apache
Kafka: the engine's replication and remote-copy throttles set on the brokers' own configs, a
reassignment held to its throttle by Kafka itself, and nothing left behind afterwards, even when
the actuator is killed mid-move."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from kafka import KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic
from prometheus_client import CollectorRegistry

from quotastream.brokers.actuator import Actuator
from quotastream.brokers.throttles import (
    COPY_RATE,
    FOLLOWER_RATE,
    FOLLOWER_REPLICAS,
    LEADER_RATE,
    LEADER_REPLICAS,
)
from quotastream.outage import Outage
from streaming.commands.brokers import build_actuator
from streaming.commands.cli import main
from streaming.engine.settings import EngineSettings
from streaming.kafka_broker import KafkaCluster, KafkaNode
from streaming.services import LocalService
from tests.servers import broker_metric, start_command, until

ROOT = Path(__file__).parents[1]
SHIPPED_QUOTAS = ROOT / "conf" / "quotas.yaml"
COUNT = "kafka_server_BrokerTopicMetrics_Count"
#: What ``quotastream brokers`` logs once its workers run.
RUNNING = "quotastream brokers running: actuator"
THROTTLE = 400_000  # bytes a second
#: Kafka's remote.log.manager.copy.quota.window.num x .window.size.seconds (defaults).
COPY_QUOTA_WINDOW_S = 11
OFFERED = 40_000  # bytes a second to a tiered topic: a 40 kB segment a second to upload
#: The tolerance. Kafka lets a replica fetch through while the measured rate (11 one-second
#: windows, SimpleRate) is under the throttle, so the bytes moved by time t are at most
#: throttle x t plus one fetch: ``replica.fetch.max.bytes``, 1 MiB by default.
REPLICA_FETCH_MAX_BYTES = 1_048_576
MOVED_BYTES = 5_000_000
ALL_KEYS = (LEADER_RATE, FOLLOWER_RATE, COPY_RATE, LEADER_REPLICAS, FOLLOWER_REPLICAS)


def settings_file(
    cluster: KafkaCluster, redis_server: LocalService, tmp_path: Path, **quotas: Any
) -> tuple[Path, EngineSettings]:
    name = f"actuator-{uuid.uuid4().hex[:8]}"
    quota_file = tmp_path / "quotas.yaml"
    quota_file.write_text(yaml.safe_dump(quotas))
    settings = EngineSettings.model_validate(
        {
            "quotas": str(quota_file),
            "kafka": {"bootstrap_servers": cluster.address, "config_topic": f"{name}.config"},
            "redis": {"host": redis_server.host, "port": redis_server.port, "key_prefix": name},
            "brokers": {
                "cluster": {"bootstrap_servers": cluster.address},
                "actuator": {"enabled": True, "interval_ms": 300},
                "metrics": {"enabled": False},
            },
        }
    )
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump(settings.model_dump(mode="json")))
    return path, settings


@pytest.fixture
def run_actuator() -> Iterator[Any]:
    stops: list[tuple[threading.Event, threading.Thread]] = []

    def start(settings: EngineSettings) -> CollectorRegistry:
        registry = CollectorRegistry()
        actuator = build_actuator(settings, registry)
        stopped = threading.Event()
        outage = Outage("the cluster", 60)
        thread = threading.Thread(target=actuator.run, args=(stopped, 0.3, outage), daemon=True)
        thread.start()
        stops.append((stopped, thread))
        return registry

    yield start
    for stopped, thread in stops:
        stopped.set()
        thread.join(30)


def throttle_configs(address: str, topic: str) -> dict[str, str]:
    """Every dynamic throttle config on the cluster: ``"broker 1 key"`` / ``"topic T key"``."""
    admin = KafkaAdminClient(bootstrap_servers=address)
    try:
        resources = [ConfigResource(ConfigResourceType.BROKER, str(b)) for b in (1, 2, 3)]
        described = admin.describe_configs(
            [*resources, ConfigResource(ConfigResourceType.TOPIC, topic)]
        )
    finally:
        admin.close()
    found = {}
    for kind, by_name in described.items():
        for name, entries in by_name.items():
            for key, entry in entries.items():
                dynamic = entry["config_source"] in (
                    "DYNAMIC_BROKER_CONFIG",
                    "DYNAMIC_TOPIC_CONFIG",
                )
                if key in ALL_KEYS and dynamic:
                    found[f"{kind} {name} {key}"] = entry["value"]
    return found


def replication_bytes_in(node: KafkaNode) -> float:
    count = broker_metric(node, COUNT, name="ReplicationBytesInPerSec")
    assert count is not None, f"no ReplicationBytesInPerSec on node {node.node_id}"
    return count


def topic_on_broker_1(address: str, nbytes: int = MOVED_BYTES) -> str:
    """A one-partition topic whose only replica is broker 1, holding ``nbytes``."""
    topic = f"moving-{uuid.uuid4().hex[:6]}"
    admin = KafkaAdminClient(bootstrap_servers=address)
    admin.create_topics([NewTopic(topic, replica_assignments={0: [1]})])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=address, acks="all", linger_ms=20)
    for _ in range(nbytes // 10_000):
        producer.send(topic, b"x" * 10_000, partition=0)
    producer.flush()
    producer.close()
    return topic


def plan_throttle(path: Path, topic: str) -> None:
    """The reassignment's throttle, as an operator sets it: ``quotastream replication throttle``
    (a change to the live configuration), moving partition 0 from broker 1 to broker 2."""
    arguments = ["--topic", topic, "--leader-replicas", "0:1", "--follower-replicas", "0:2"]
    rate = ["--rate", str(THROTTLE), "--brokers", "1,2"]
    command = ["replication", "throttle", "--engine-config", str(path), *arguments, *rate]
    assert main(command) == 0


def move_to_broker_2(address: str, topic: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=address)
    try:
        accepted = admin.alter_partition_reassignments({TopicPartition(topic, 0): [2]})
        assert accepted == {TopicPartition(topic, 0): None}
    finally:
        admin.close()


def moved(address: str, topic: str) -> bool:
    admin = KafkaAdminClient(bootstrap_servers=address)
    try:
        if admin.list_partition_reassignments():
            return False
        [described] = admin.describe_topics([topic])
        return bool(described["partitions"][0]["replica_nodes"] == [2])
    finally:
        admin.close()


def test_a_reassignment_completes_within_the_throttle_the_actuator_set_and_leaves_nothing(
    tiered_cluster: KafkaCluster, redis_server: LocalService, tmp_path: Path, run_actuator: Any
) -> None:
    """The operator plans a move's throttle with ``quotastream replication throttle``; the
    actuator sets it on the brokers (rates on brokers 1 and 2, the lists on the topic) before
    the move starts. The move completes; broker 2's replication bytes in, from its JMX exporter,
    stay within the throttle (one fetch ahead at most); once it is complete the
    actuator removes the lists from the live configuration and every throttle from the brokers."""
    address = tiered_cluster.address
    path, settings = settings_file(tiered_cluster, redis_server, tmp_path)
    topic = topic_on_broker_1(address)
    registry = run_actuator(settings)
    plan_throttle(path, topic)
    wanted = {
        f"broker {b} {key}": str(THROTTLE) for b in (1, 2) for key in (LEADER_RATE, FOLLOWER_RATE)
    } | {f"topic {topic} {LEADER_REPLICAS}": "0:1", f"topic {topic} {FOLLOWER_REPLICAS}": "0:2"}
    until(lambda: throttle_configs(address, topic) == wanted, 30, "the throttle set")

    follower = next(node for node in tiered_cluster.nodes if node.node_id == 2)
    before, started = replication_bytes_in(follower), time.monotonic()
    move_to_broker_2(address, topic)
    samples = []
    while not moved(address, topic):
        samples.append((time.monotonic() - started, replication_bytes_in(follower) - before))
        assert samples[-1][0] < 120, "the move did not complete in 2 minutes"
        time.sleep(0.5)
    took = time.monotonic() - started
    assert took > MOVED_BYTES / THROTTLE * 0.7  # unthrottled, it takes a second or two
    for at, nbytes in samples:
        assert nbytes <= THROTTLE * at + REPLICA_FETCH_MAX_BYTES, (at, nbytes)
    fetched = [(at, nbytes) for at, nbytes in samples if nbytes > 0]
    (first_at, first), (last_at, last) = fetched[0], fetched[-1]
    # Bytes come a fetch (up to REPLICA_FETCH_MAX_BYTES) at a time, so between two samples the
    # count may be one fetch ahead of the throttle: 407 kB/s over 9.8 s against 400 kB/s once,
    # when a fetch had just landed before the last sample.
    assert last - first <= THROTTLE * (last_at - first_at) + REPLICA_FETCH_MAX_BYTES

    until(lambda: throttle_configs(address, topic) == {}, 30, "every throttle removed")
    changes = "quotastream_actuator_changes_total"
    assert (
        registry.get_sample_value(
            changes, {"key": LEADER_REPLICAS, "op": "delete", "dry_run": "False"}
        )
        == 1.0
    )
    history = subprocess.run(
        [
            sys.executable,
            "-m",
            "streaming.commands.cli",
            "quota",
            "history",
            "--engine-config",
            str(path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "quotastream-actuator" in history


def test_an_actuator_killed_mid_move_and_started_again_leaves_nothing_behind(
    tiered_cluster: KafkaCluster, redis_server: LocalService, tmp_path: Path
) -> None:
    """``quotastream brokers`` sets a move's throttle and is killed (SIGKILL) while the move
    runs under it; the move completes meanwhile. Started again, it finds the reassignment it
    saw running has finished, and removes the throttle: from the live configuration, then
    from every broker and the topic."""
    address = tiered_cluster.address
    path, settings = settings_file(tiered_cluster, redis_server, tmp_path)
    topic = topic_on_broker_1(address)
    plan_throttle(path, topic)
    command, output = ["brokers", "--engine-config", str(path)], tmp_path / "brokers.log"
    process = start_command(command, output, RUNNING)
    ownership = redis.Redis(host=redis_server.host, port=redis_server.port)
    try:
        until(lambda: len(throttle_configs(address, topic)) == 6, 60, "the throttle set")
        move_to_broker_2(address, topic)
        seen = f"reassigning|{topic}"
        until(
            lambda: ownership.hexists(f"{settings.redis.key_prefix}:actuator", seen),
            30,
            "the move seen running",
        )
    finally:
        process.kill()
        process.wait(30)
    assert len(throttle_configs(address, topic)) == 6  # nothing removed it
    until(lambda: moved(address, topic), 120, "the move complete")
    assert len(throttle_configs(address, topic)) == 6
    process = start_command(command, output, RUNNING)
    try:
        until(lambda: throttle_configs(address, topic) == {}, 60, "every throttle removed")
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0


@pytest.fixture
def passes() -> Iterator[Any]:
    """Actuators whose passes the test runs itself (``reconcile()``), closed afterwards."""
    built: list[Actuator] = []

    def build(settings: EngineSettings, registry: CollectorRegistry) -> Actuator:
        built.append(build_actuator(settings, registry))
        return built[-1]

    yield build
    for actuator in built:
        actuator.close()


def test_a_move_that_completes_between_two_passes_has_its_throttle_removed_at_the_next(
    tiered_cluster: KafkaCluster, redis_server: LocalService, tmp_path: Path, passes: Any
) -> None:
    """A 20 kB partition moves from broker 1 to broker 2 in well under a second: here, wholly
    between two passes, so no pass sees it running. The throttle the actuator set for it goes
    at the next pass all the same (its follower list's replicas are all in place and nothing of
    the topic is moving): from the live configuration, the topic and every broker."""
    address = tiered_cluster.address
    path, settings = settings_file(tiered_cluster, redis_server, tmp_path)
    topic = topic_on_broker_1(address, nbytes=20_000)
    plan_throttle(path, topic)
    actuator = passes(settings, CollectorRegistry())
    actuator.reconcile()
    assert len(throttle_configs(address, topic)) == 6  # both rates on brokers 1, 2; both lists

    move_to_broker_2(address, topic)
    until(lambda: moved(address, topic), 60, "the move complete")
    actuator.reconcile()
    assert throttle_configs(address, topic) == {}
    assert actuator.reconcile() == []  # the lists are gone from the configuration too


def test_the_shipped_quota_file_on_a_cluster_without_its_topic_sets_no_replication_throttle(
    tiered_cluster: KafkaCluster,
    redis_server: LocalService,
    tmp_path: Path,
    passes: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """conf/quotas.yaml throttles replicas of a topic ``orders`` the cluster does not have:
    Kafka refuses its lists (unknown topic). Each pass tries them again and makes its other
    changes: the copy rates, but no replication rate (no list of the actuator's needs one). The
    refusal is logged once per key, with Kafka's error, and counted at each pass. Once the topic
    exists its throttle is set, and with the quotas removed everything it set goes."""
    address = tiered_cluster.address
    quotas = yaml.safe_load(SHIPPED_QUOTAS.read_text())
    assert "orders" in quotas["topics"]
    _, settings = settings_file(tiered_cluster, redis_server, tmp_path, **quotas)
    copy_rates = {f"broker {b} {COPY_RATE}": "52428800" for b in (1, 2)} | {
        f"broker 3 {COPY_RATE}": "20971520"
    }
    registry = CollectorRegistry()
    actuator = passes(settings, registry)
    caplog.set_level(logging.INFO, logger="quotastream.brokers.actuator")
    actuator.reconcile()
    actuator.reconcile()
    assert throttle_configs(address, "orders") == copy_rates
    refusals = [
        r.getMessage()
        for r in caplog.records
        if r.name == "quotastream.brokers.actuator" and r.levelno == logging.WARNING
    ]
    assert len(refusals) == 2, refusals  # once per list, not once per pass
    for key in (LEADER_REPLICAS, FOLLOWER_REPLICAS):
        assert any(f"topic orders {key}" in r and "UnknownTopicOrPartition" in r for r in refusals)
        refused = {"key": key, "op": "set"}
        count = registry.get_sample_value("quotastream_actuator_refused_changes_total", refused)
        assert count == 2.0

    admin = KafkaAdminClient(bootstrap_servers=address)
    try:
        admin.create_topics([NewTopic("orders", replica_assignments={0: [1], 1: [2]})])
        until(lambda: "orders" in admin.list_topics(), 30, "orders created")
        actuator.reconcile()
        leader_rates = {f"broker {b} {LEADER_RATE}": "3145728" for b in (1, 2, 3)}
        lists = {
            f"topic orders {LEADER_REPLICAS}": "0:1,1:2",
            f"topic orders {FOLLOWER_REPLICAS}": "0:3,1:3",
        }
        assert throttle_configs(address, "orders") == copy_rates | leader_rates | lists

        (tmp_path / "none.yaml").write_text("{}")
        removed = settings.model_copy(update={"quotas": str(tmp_path / "none.yaml")})
        passes(removed, CollectorRegistry()).reconcile()
        assert throttle_configs(address, "orders") == {}
    finally:
        admin.delete_topics(["orders"])
        admin.close()


def leader_metric(cluster: KafkaCluster, topic: str, name: str) -> float:
    """A per-topic ``BrokerTopicMetrics`` counter of ``topic``'s leader (partition 0)."""
    admin = KafkaAdminClient(bootstrap_servers=cluster.address)
    try:
        [described] = admin.describe_topics([topic])
    finally:
        admin.close()
    leader = described["partitions"][0]["leader_id"]
    node = next(node for node in cluster.nodes if node.node_id == leader)
    return broker_metric(node, COUNT, name=name, topic=topic) or 0.0


def test_the_remote_copy_rate_the_actuator_sets_is_the_brokers_own_quota(
    tiered_cluster: KafkaCluster, redis_server: LocalService, tmp_path: Path, run_actuator: Any
) -> None:
    """``remote.log.manager.copy.max.bytes.per.second`` in the quota file reaches every broker as
    a dynamic config, and the broker holds its uploads to it: a topic rolling 40 kB segments a
    second has them uploaded at most at the rate, one segment ahead, while the rest wait.
    Removed from the configuration, the rate is removed from the brokers."""
    address = tiered_cluster.address
    rate = 10_000
    path, settings = settings_file(
        tiered_cluster, redis_server, tmp_path, brokers={"<default>": {COPY_RATE: rate}}
    )
    run_actuator(settings)
    wanted = {f"broker {b} {COPY_RATE}": str(rate) for b in (1, 2, 3)}
    until(lambda: throttle_configs(address, "__remote_log_metadata") == wanted, 30, "the rate set")

    topic = f"uploads-{uuid.uuid4().hex[:6]}"
    tiered = {"remote.storage.enable": "true", "segment.ms": "1000", "local.retention.ms": "1000"}
    admin = KafkaAdminClient(bootstrap_servers=address)
    admin.create_topics([NewTopic(topic, 1, 3, topic_configs=tiered)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=address, acks="all", linger_ms=5)
    copied, produced, started = [], 0, time.monotonic()
    while (elapsed := time.monotonic() - started) < 10:
        while produced < OFFERED * elapsed:  # 40 kB a second, whatever the loop's pace
            producer.send(topic, b"x" * 2_000)
            produced += 2_000
        producer.flush()
        copied.append(
            (time.monotonic(), leader_metric(tiered_cluster, topic, "RemoteCopyBytesPerSec"))
        )
        time.sleep(0.1)
    producer.close()
    uploads = [(at, nbytes) for at, nbytes in copied if nbytes > 0]
    assert uploads, "nothing was uploaded"
    (first_at, first) = uploads[0]
    for at, nbytes in uploads:
        # The copy quota is a SimpleRate over 11 windows of 1 s (RLMQuotaManager), and
        # an upload is let through while the rate is within it: after the quiet spell before
        # the first upload, what the window holds may reach the rate times its 11 s at once,
        # plus the segment let through last (a second's 40 kB and its batches' overhead). A
        # slow machine's late task finds several segments rolled and sends them so. Then the
        # rate holds.
        burst = rate * COPY_QUOTA_WINDOW_S + 50_000
        assert nbytes - first <= rate * (at - first_at) + burst, (at - first_at, nbytes)
    # Unthrottled, every rolled segment is uploaded within a task interval (0.5 s).
    assert uploads[-1][1] < produced / 2, (uploads[-1][1], produced)

    command = ["quota", "delete", "--engine-config", str(path), "--broker", "<default>", COPY_RATE]
    assert main(command) == 0
    until(lambda: throttle_configs(address, "__remote_log_metadata") == {}, 30, "the rate removed")


def test_a_dry_run_logs_and_counts_what_it_would_set_and_sets_nothing(
    tiered_cluster: KafkaCluster,
    redis_server: LocalService,
    tmp_path: Path,
    run_actuator: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, settings = settings_file(
        tiered_cluster, redis_server, tmp_path, brokers={"<default>": {COPY_RATE: 5_000}}
    )
    dry = settings.model_copy(
        update={
            "brokers": settings.brokers.model_copy(
                update={"actuator": settings.brokers.actuator.model_copy(update={"dry_run": True})}
            )
        }
    )
    caplog.set_level(logging.INFO, logger="quotastream.brokers.actuator")
    registry = run_actuator(dry)
    would = {"key": COPY_RATE, "op": "set", "dry_run": "True"}
    until(
        lambda: (registry.get_sample_value("quotastream_actuator_changes_total", would) or 0) >= 6,
        30,
        "two passes over three brokers",
    )
    assert throttle_configs(tiered_cluster.address, "__remote_log_metadata") == {}
    assert f"dry run, not applied: set broker 1 {COPY_RATE}=5000" in caplog.text
