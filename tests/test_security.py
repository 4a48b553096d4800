"""Security: the engine over TLS to Redis (AUTH, a least-privilege ACL user) and to Kafka, with
secrets configured, and none of them in anything the run writes.

Redis is Debian's redis-server speaking only TLS. Kafka is tansu behind a TLS terminator
(stunnel): tansu 0.6 cannot combine its own ``--cert`` and ``--key`` options.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from quotastream.acl import ENGINE_USER, engine_acl, set_user
from state.config import load_quota_config
from streaming.job import source_options
from streaming.offsets import SourceOptions
from streaming.services import (
    LocalService,
    TlsFiles,
    free_port,
    start_kafka,
    start_redis,
    start_tls_proxy,
)
from streaming.settings import EngineSettings
from streaming.sinks import SinkSettings
from tests.certificates import make_certificates
from tests.expected import by_key, final_decisions
from tests.factories import mixed_payloads
from tests.test_chaos import engine_file, stored_decisions

ADMIN_SECRET = "admin-Secret-4f1c9"
ENGINE_SECRET = "engine-Secret-8b2e7"
KAFKA_SECRET = "kafka-Secret-3d5a1"
SECRETS = (ADMIN_SECRET, ENGINE_SECRET, KAFKA_SECRET)
PREFIX = "secure"


@dataclass
class SecureServers:
    tls: TlsFiles
    redis_server: LocalService
    broker: LocalService
    kafka_tls: LocalService  # where clients connect: TLS in front of the broker

    def kafka_client(self) -> dict[str, str]:
        return {"security_protocol": "SSL", "ssl_cafile": str(self.tls.ca)}

    def admin_redis(self) -> redis.Redis:
        return redis.Redis(
            host=self.redis_server.host,
            port=self.redis_server.port,
            password=ADMIN_SECRET,
            ssl=True,
            ssl_ca_certs=str(self.tls.ca),
        )


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureServers]:
    tls = make_certificates(tmp_path_factory.mktemp("tls"))
    proxy_port = free_port()
    with (
        start_redis(password=ADMIN_SECRET, tls=tls) as redis_server,
        start_kafka(advertised_port=proxy_port) as broker,
        start_tls_proxy(broker, tls, port=proxy_port) as kafka_tls,
    ):
        servers = SecureServers(tls, redis_server, broker, kafka_tls)
        set_user(servers.admin_redis(), ENGINE_USER, engine_acl(PREFIX, ENGINE_SECRET))
        yield servers


def test_plaintext_clients_are_refused_by_both_servers(servers: SecureServers) -> None:
    with pytest.raises(redis.ConnectionError):
        redis.Redis(host="127.0.0.1", port=servers.redis_server.port, socket_timeout=2).ping()
    unverified = redis.Redis(
        host="127.0.0.1", port=servers.redis_server.port, ssl=True, ssl_cert_reqs="required"
    )
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        unverified.ping()  # the test CA is not a system CA


def test_the_engine_user_may_write_only_under_its_prefix(servers: SecureServers) -> None:
    engine = redis.Redis(
        host="127.0.0.1",
        port=servers.redis_server.port,
        username=ENGINE_USER,
        password=ENGINE_SECRET,
        ssl=True,
        ssl_ca_certs=str(servers.tls.ca),
    )
    engine.set(f"{PREFIX}:acl-check", "{}")
    forbidden: list[Callable[[], object]] = [
        lambda: engine.set("other:produce:user=a", "{}"),
        engine.flushall,
        lambda: engine.config_get("*"),
        lambda: engine.keys("*"),
    ]
    for command in forbidden:
        with pytest.raises(redis.exceptions.NoPermissionError):
            command()


def test_sasl_settings_reach_every_kafka_client_of_the_engine() -> None:
    client = {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "engine",
        "sasl_plain_password": KAFKA_SECRET,
        "ssl_cafile": "/etc/ca.pem",
    }
    settings = EngineSettings.model_validate({"kafka": {"client": client}})
    # The source, as Spark hands it its options (kafka.* strings) ...
    options = SourceOptions.parse(source_options(settings.kafka))
    assert options.client == client
    assert KAFKA_SECRET not in repr(options)
    # ... the dead-letter producer ...
    sink = SinkSettings.of(settings)
    assert dict(sink.kafka_client) == client
    assert KAFKA_SECRET not in repr(sink)
    # ... and the preflight check and configuration log (the same client settings).
    assert settings.kafka.client_settings() == client


def publish(servers: SecureServers, topic: str, values: list[bytes]) -> None:
    admin = KafkaAdminClient(bootstrap_servers=servers.kafka_tls.address, **servers.kafka_client())
    admin.create_topics([NewTopic(topic, 3, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=servers.kafka_tls.address, **servers.kafka_client())
    for i, value in enumerate(values):
        producer.send(topic, value, partition=i % 3)
    producer.flush()
    producer.close()


def everything_written(*folders: Path) -> Iterator[tuple[Path, bytes]]:
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file():
                yield path, path.read_bytes()


def test_a_run_over_tls_as_the_engine_user_decides_and_writes_no_secret(
    servers: SecureServers, tmp_path: Path
) -> None:
    topic = "secure-events"
    values = mixed_payloads(23, 600, users=5, span_ms=5000)
    publish(servers, topic, [*values, b"not json"])
    engine = engine_file(
        tmp_path,
        topic,
        servers.kafka_tls.address,
        {
            "host": "127.0.0.1",
            "port": servers.redis_server.port,
            "ssl": True,
            "ssl_ca_file": str(servers.tls.ca),
            "username": ENGINE_USER,
            "key_prefix": PREFIX,
        },
        kafka={"client": servers.kafka_client()},
        metrics={"port": 0},
    )
    # Secrets come from the environment, as the docs say they should.
    environment = {
        **os.environ,
        "QUOTASTREAM_REDIS__PASSWORD": ENGINE_SECRET,
        "QUOTASTREAM_KAFKA__CLIENT__SSL_PASSWORD": KAFKA_SECRET,
    }
    run = subprocess.run(
        [
            str(Path(sys.executable).with_name("quotastream")),
            "run",
            "--engine-config",
            str(engine),
            "--available-now",
        ],
        capture_output=True,
        env=environment,
        timeout=300,
        check=False,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-3000:].decode(errors="replace")

    # It decided everything, writing as the least-privileged user over TLS ...
    admin = servers.admin_redis()
    stored = stored_decisions(admin, PREFIX)
    expected = by_key(final_decisions(values, load_quota_config(tmp_path / "quotas.yaml")))
    assert len(stored) == len(expected)
    for (quota, entity), want in expected.items():
        assert stored[f"{PREFIX}:{quota}:{entity}"]["rate"] == pytest.approx(want["rate"])
    # ... and its dead letter went out over TLS too.
    consumer = KafkaConsumer(
        bootstrap_servers=servers.kafka_tls.address,
        consumer_timeout_ms=3000,
        **servers.kafka_client(),
    )
    dead_letter = f"{topic}.dead-letter"
    partitions = [
        TopicPartition(dead_letter, p) for p in consumer.partitions_for_topic(dead_letter)
    ]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    assert [json.loads(r.value)["reason"] for r in consumer] == ["invalid_json"]
    consumer.close()

    # No secret in anything it printed or wrote: logs, checkpoint, the servers' logs.
    assert b"INFO" in output  # the engine's own log is in the captured output
    written = [
        ("output", output),
        *everything_written(tmp_path, servers.redis_server.workdir, servers.broker.workdir),
    ]
    for secret in SECRETS:
        leaks = [str(where) for where, data in written if secret.encode() in data]
        assert not leaks, f"{secret} found in {leaks}"
