"""Security: the engine over TLS to Redis (AUTH, a least-privilege ACL user) and to Kafka
(SASL/SCRAM-SHA-512 over mutual TLS, a principal with only the ACLs it needs), with its secrets
given in the environment, and none of them in anything the run writes, in either trigger mode.

Redis is Debian's redis-server speaking only TLS. Kafka is Apache Kafka's own SASL_SSL listener:
its TLS from PEM files (KIP-651), SCRAM users created when its storage is formatted, and its
StandardAuthorizer with no rights for anyone but the admin (``User:admin``, a super user) and what
the admin grants. The admin creates every topic beforehand; the engine's principal
(``User:engine``) is granted exactly :data:`ENGINE_RIGHTS`. The broker also asks every client for
a certificate (``ssl.client.auth=required``), so the engine's encrypted client key, and the
``ssl_password`` that unlocks it, is needed to connect at all.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import socket
import ssl
import struct
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
import redis
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    NewTopic,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
)
from kafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
)
from prometheus_client.parser import text_string_to_metric_families
from redis.backoff import NoBackoff
from redis.retry import Retry

from quotastream.acl import ENGINE_USER, engine_acl, set_user
from state.config import load_quota_config
from streaming.commands.exit_codes import EXIT_UNREACHABLE
from streaming.commands.preflight import (
    DEFAULT_TIMEOUT_S,
    UnreachableError,
    check_kafka,
    check_kafka_rights,
    check_redis,
)
from streaming.commands.redaction import redact_logs
from streaming.engine.client_settings import settings_for
from streaming.engine.config_log import TOPIC_CONFIGS
from streaming.engine.job import source_options
from streaming.engine.metric_names import INPUT_BACKLOG
from streaming.engine.offsets import SourceOptions
from streaming.engine.settings import EngineSettings
from streaming.engine.sinks import SinkSettings
from streaming.kafka_broker import KafkaNode, ScramUser, Security, start_kafka
from streaming.services import LocalService, TlsFiles, start_redis
from tests.support.certificates import make_certificates, make_client_certificate
from tests.support.engine import batches_needed, commits, engine_file, quotastream, stored_decisions
from tests.support.expected import (
    assert_reads_as_unwritten,
    by_key,
    final_decisions,
    must_be_written,
)
from tests.support.factories import mixed_payloads

#: The servers' own password (the Redis admin's, the Kafka admin's SCRAM password and client
#: key's): never given to the engine.
ADMIN_PASSWORD = "admin-Secret-4f1c9"
#: The Kafka super user that creates the topics and grants the engine its rights.
KAFKA_ADMIN = "admin"
#: The engine's SCRAM user; its principal is ``User:engine``.
KAFKA_ENGINE = "engine"
#: The password of the engine's Redis ACL user: without it the engine cannot log in to Redis.
ENGINE_SECRET = "engine-Secret-8b2e7"
#: kafka-python's ``ssl_password``: it unlocks the engine's encrypted Kafka client key, which
#: the broker asks for before anything else.
KAFKA_KEY_SECRET = "kafka-Secret-3d5a1"
#: The engine's SCRAM-SHA-512 password (``sasl_plain_password``).
SASL_SECRET = "sasl-Secret-6c0f2"
#: What the engine is given, and must keep out of everything it writes.
ENGINE_SECRETS = (ENGINE_SECRET, KAFKA_KEY_SECRET, SASL_SECRET)
NOT_THE_PASSWORD = "not-the-password"
PREFIX = "secure"
#: Micro-batches the continuous run commits after the one that read the last record: a few
#: trigger rounds without new input (the shards' throttle timers run in them).
BATCHES_AFTER_INPUT = 3
#: A generous bound for what must eventually happen on a loaded machine (liveness only).
LIVENESS_S = 240.0

#: The engine's Kafka rights on the topics of one engine file, by the topic's role (the events,
#: its dead letters, its configuration log) -- and none besides: no cluster right, no consumer
#: group, no other topic. READ on the events: the source fetches them (READ implies DESCRIBE:
#: partitions and offsets). WRITE on the dead letters: the sink produces them (WRITE implies
#: DESCRIBE, and lets the idempotent producer start: no IDEMPOTENT_WRITE on the cluster). READ on
#: the configuration log: the live versions. DESCRIBE_CONFIGS on it: the start-up check of its
#: retention. No CREATE: the operator made the topics, and the engine creates its configuration
#: log only when it is missing. The engine never writes the configuration log (``quotastream
#: quota`` does) and uses no group (its consumers are assigned partitions).
ENGINE_RIGHTS: Final = (
    ("events", ACLOperation.READ),
    ("dead-letter", ACLOperation.WRITE),
    ("config", ACLOperation.READ),
    ("config", ACLOperation.DESCRIBE_CONFIGS),
)


#: Every ACL of the cluster: describing them needs DESCRIBE on the cluster.
ALL_ACLS: Final = ACLFilter(
    None,
    None,
    ACLOperation.ANY,
    ACLPermissionType.ANY,
    ResourcePatternFilter(ResourceType.ANY, None, ACLResourcePatternType.ANY),
)


def topic_of(events: str, role: str) -> str:
    """The name of ``role``'s topic in the engine file reading ``events`` (``engine_file``)."""
    return events if role == "events" else f"{events}.{role}"


def role_of(topic: str) -> tuple[str, str]:
    """The events topic of the engine file ``topic`` belongs to, and its role there."""
    for role in ("dead-letter", "config"):
        if topic.endswith(f".{role}"):
            return topic.removesuffix(f".{role}"), role
    return topic, "events"


@dataclass
class SecureServers:
    tls: TlsFiles
    #: The engine's Kafka client certificate, its key encrypted with KAFKA_KEY_SECRET.
    engine_client: TlsFiles
    #: The Kafka admin's client certificate, its key encrypted with ADMIN_PASSWORD.
    admin_client: TlsFiles
    redis_server: LocalService
    broker: KafkaNode

    def admin_kafka(self) -> dict[str, str]:
        """The test's own Kafka clients: the super user, over the same listener."""
        return {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": KAFKA_ADMIN,
            "sasl_plain_password": ADMIN_PASSWORD,
            "ssl_cafile": str(self.tls.ca),
            "ssl_certfile": str(self.admin_client.cert),
            "ssl_keyfile": str(self.admin_client.key),
            "ssl_password": ADMIN_PASSWORD,
        }

    def engine_kafka_client(self) -> dict[str, str]:
        """The engine's ``kafka.client`` as its file holds it: the SASL password and the key's
        password are not here but in the environment (:data:`ENGINE_ENVIRONMENT`)."""
        return {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": KAFKA_ENGINE,
            "ssl_cafile": str(self.tls.ca),
            "ssl_certfile": str(self.engine_client.cert),
            "ssl_keyfile": str(self.engine_client.key),
        }

    def engine_redis(self) -> dict[str, Any]:
        """The engine's ``redis`` settings as its file holds them (the password: environment)."""
        return {
            "host": "127.0.0.1",
            "port": self.redis_server.port,
            "ssl": True,
            "ssl_ca_file": str(self.tls.ca),
            "username": ENGINE_USER,
            "key_prefix": PREFIX,
        }

    def engine_settings(
        self,
        events: str = "quotastream.events",
        redis_password: str = ENGINE_SECRET,
        key_password: str = KAFKA_KEY_SECRET,
        sasl_password: str = SASL_SECRET,
    ) -> EngineSettings:
        """The settings of an engine reading ``events``, with these secrets."""
        client = {
            **self.engine_kafka_client(),
            "ssl_password": key_password,
            "sasl_plain_password": sasl_password,
            # Typed as kafka-python takes them; each client given the ones it knows (the
            # source's consumers, the dead-letter producer, the configuration log's clients).
            "request_timeout_ms": 40_000,
            "fetch_max_bytes": 32 << 20,  # consumers only
            "linger_ms": 2,  # producers only
        }
        kafka = {
            "bootstrap_servers": self.broker.address,
            "topics": [events],
            "dead_letter_topic": topic_of(events, "dead-letter"),
            "config_topic": topic_of(events, "config"),
            "client": client,
        }
        return EngineSettings.model_validate(
            {"kafka": kafka, "redis": {**self.engine_redis(), "password": redis_password}}
        )

    def admin_redis(self) -> redis.Redis:
        return redis.Redis(
            host=self.redis_server.host,
            port=self.redis_server.port,
            password=ADMIN_PASSWORD,
            ssl=True,
            ssl_ca_certs=str(self.tls.ca),
        )

    def provision(self, events: str, without: tuple[str, ACLOperation] | None = None) -> None:
        """What an operator does before the engine's first start: the admin creates the
        engine's topics and grants it :data:`ENGINE_RIGHTS` on them (all but ``without``).
        ``without`` CREATE on the configuration log: that topic is not made, so the engine
        would have to create it."""
        admin = KafkaAdminClient(bootstrap_servers=self.broker.address, **self.admin_kafka())
        topics = [NewTopic(events, 3, 1), NewTopic(topic_of(events, "dead-letter"), 1, 1)]
        if without != ("config", ACLOperation.CREATE):
            topics.append(NewTopic(topic_of(events, "config"), 1, 1, topic_configs=TOPIC_CONFIGS))
        try:
            admin.create_topics(topics)
            rights = [
                ACL(
                    f"User:{KAFKA_ENGINE}",
                    "*",
                    operation,
                    ACLPermissionType.ALLOW,
                    ResourcePattern(ResourceType.TOPIC, topic_of(events, role)),
                )
                for role, operation in ENGINE_RIGHTS
                if (role, operation) != without
            ]
            created = admin.create_acls(rights)
            assert not created["failed"], created
        finally:
            admin.close()


#: Secrets come from the environment, as the docs say they should.
ENGINE_ENVIRONMENT = {
    "QUOTASTREAM_REDIS__PASSWORD": ENGINE_SECRET,
    "QUOTASTREAM_KAFKA__CLIENT__SSL_PASSWORD": KAFKA_KEY_SECRET,
    "QUOTASTREAM_KAFKA__CLIENT__SASL_PLAIN_PASSWORD": SASL_SECRET,
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureServers]:
    tls = make_certificates(tmp_path_factory.mktemp("tls"))
    engine_client = make_client_certificate(tls, "engine-client", KAFKA_KEY_SECRET)
    admin_client = make_client_certificate(tls, "admin-client", ADMIN_PASSWORD)
    security = Security(
        tls=tls,
        scram_users=(ScramUser(KAFKA_ADMIN, ADMIN_PASSWORD), ScramUser(KAFKA_ENGINE, SASL_SECRET)),
        super_users=(f"User:{KAFKA_ADMIN}",),
        authorizer=True,
        client_certificates=True,
    )
    with (
        start_redis(password=ADMIN_PASSWORD, tls=tls) as redis_server,
        start_kafka(security=security) as broker,
    ):
        servers = SecureServers(tls, engine_client, admin_client, redis_server, broker)
        set_user(servers.admin_redis(), ENGINE_USER, engine_acl(PREFIX, ENGINE_SECRET))
        yield servers


_API_VERSIONS = 18
_CORRELATION_ID = 0x5EC


def kafka_answers(address: str, tls: ssl.SSLContext | None = None) -> bool:
    """Whether a Kafka ApiVersions request (v0) gets its answer at ``address``: in plaintext, or
    over TLS with ``tls`` (a SASL listener answers it before any login)."""
    host, port = address.rsplit(":", 1)
    client_id = b"probe"
    header = struct.pack(">hhih", _API_VERSIONS, 0, _CORRELATION_ID, len(client_id))
    request = header + client_id
    with socket.create_connection((host, int(port)), timeout=30) as raw:
        try:
            connection = tls.wrap_socket(raw, server_hostname=host) if tls else raw
            connection.sendall(struct.pack(">i", len(request)) + request)
            reply = connection.makefile("rb").read(8)  # the answer's size and correlation id
        except (ConnectionError, ssl.SSLError):  # refused at the handshake or after it
            return False
    return len(reply) == 8 and struct.unpack(">ii", reply)[1] == _CORRELATION_ID


def internal_listener(node: KafkaNode) -> str:
    """The node's plaintext listener for its own traffic (never told to clients)."""
    lines = node.config.read_text().splitlines()
    settings = dict(line.split("=", 1) for line in lines if "=" in line)
    listeners = dict(entry.split("://", 1) for entry in settings["listeners"].split(","))
    return listeners["INTERNAL"]


def test_plaintext_clients_are_refused_by_both_servers(servers: SecureServers) -> None:
    plaintext_redis = redis.Redis(
        host="127.0.0.1",
        port=servers.redis_server.port,
        socket_timeout=30,
        retry=Retry(NoBackoff(), 0),
    )
    with pytest.raises(redis.ConnectionError):
        plaintext_redis.ping()
    # The node's own listener answers this request; the one clients are given does not.
    assert kafka_answers(internal_listener(servers.broker))
    assert not kafka_answers(servers.broker.address)
    # Both present a certificate that only the test CA vouches for, which no system trusts.
    for server in (servers.redis_server, servers.broker):
        with (
            socket.create_connection((server.host, server.port), timeout=30) as connection,
            pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"),
        ):
            ssl.create_default_context().wrap_socket(connection, server_hostname=server.host)


def test_the_broker_answers_only_clients_with_a_certificate(
    servers: SecureServers,
) -> None:
    trusting = ssl.create_default_context(cafile=servers.tls.ca)
    assert not kafka_answers(servers.broker.address, trusting)
    with_certificate = ssl.create_default_context(cafile=servers.tls.ca)
    with_certificate.load_cert_chain(
        servers.engine_client.cert, servers.engine_client.key, password=KAFKA_KEY_SECRET
    )
    assert kafka_answers(servers.broker.address, with_certificate)


def test_each_secret_given_to_the_engine_is_what_lets_it_in(servers: SecureServers) -> None:
    servers.provision("secrets-check")
    # The engine's start-up checks, with the secrets the runs below are given ...
    settings = servers.engine_settings("secrets-check")
    check_kafka(settings.kafka, DEFAULT_TIMEOUT_S)
    assert check_kafka_rights(settings.kafka, DEFAULT_TIMEOUT_S) == set()
    check_redis(settings.redis, DEFAULT_TIMEOUT_S)
    # ... and with any one wrong. A client key that does not unlock makes no connection at all
    # (kafka-python loads it before each one, and the broker asks every client for its
    # certificate), and a wrong SCRAM password no login, however long the check waits.
    wrong_password = servers.engine_settings("secrets-check", redis_password=NOT_THE_PASSWORD)
    with pytest.raises(UnreachableError, match="login refused"):
        check_redis(wrong_password.redis, DEFAULT_TIMEOUT_S)
    wrong_key = servers.engine_settings("secrets-check", key_password=NOT_THE_PASSWORD)
    wrong_login = servers.engine_settings("secrets-check", sasl_password=NOT_THE_PASSWORD)
    for wrong in (wrong_key, wrong_login):
        with pytest.raises(UnreachableError, match=f"Kafka at {servers.broker.address}"):
            check_kafka(wrong.kafka, 2.0)


def test_the_engine_user_may_write_only_under_its_prefix(servers: SecureServers) -> None:
    engine = redis.Redis(**servers.engine_settings().redis.connection())
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


def test_the_engine_principal_may_do_what_the_engine_does_and_nothing_else(
    servers: SecureServers,
) -> None:
    events = "rights-check"
    servers.provision(events)
    admin = KafkaAdminClient(bootstrap_servers=servers.broker.address, **servers.admin_kafka())
    try:
        admin.create_topics([NewTopic("admin-only", 1, 1)])
        # Every ACL of the cluster, as the admin lists them: each is one of ENGINE_RIGHTS, for
        # User:engine alone, on one literal topic of an engine file (other tests provision
        # theirs, some with a right fewer). No cluster, group or prefixed ACL, no ACL for
        # every user (User:*), none for another host, and only grants (no DENY carving
        # exceptions out of a wider grant).
        acls, _ = admin.describe_acls(ALL_ACLS)
    finally:
        admin.close()
    for acl in acls:
        pattern = acl.resource_pattern
        assert (acl.principal, acl.host, acl.permission_type) == (
            f"User:{KAFKA_ENGINE}",
            "*",
            ACLPermissionType.ALLOW,
        ), acl
        assert (pattern.resource_type, pattern.pattern_type) == (
            ResourceType.TOPIC,
            ACLResourcePatternType.LITERAL,
        ), acl
        assert (role_of(pattern.resource_name)[1], acl.operation) in ENGINE_RIGHTS, acl
    granted = [(role_of(acl.resource_pattern.resource_name), acl.operation) for acl in acls]
    assert sorted((role, op) for (family, role), op in granted if family == events) == sorted(
        ENGINE_RIGHTS
    )
    client = servers.engine_settings(events).kafka.client_settings()
    bootstrap = servers.broker.address
    engine = KafkaAdminClient(**settings_for(KafkaAdminClient, client, bootstrap_servers=bootstrap))
    try:
        # What the broker's authorizer says the engine may do, topic by topic (implied rights
        # included), and on a topic it was given no right on.
        dead_letter, config = topic_of(events, "dead-letter"), topic_of(events, "config")
        described = engine.describe_topics([events, dead_letter, config, "admin-only"])
        rights = {t["name"]: set(t["authorized_operations"] or ()) for t in described}
        assert rights == {
            events: {"DESCRIBE", "READ"},
            dead_letter: {"DESCRIBE", "WRITE"},
            config: {"DESCRIBE", "DESCRIBE_CONFIGS", "READ"},
            "admin-only": set(),
        }
        [admin_only] = [t for t in described if t["name"] == "admin-only"]
        assert admin_only["error_code"] == TopicAuthorizationFailedError.errno
        # And what it is refused when it tries: another topic, the cluster's ACLs, writing
        # events or the configuration log, reading its dead letters, a consumer group.
        with pytest.raises(TopicAuthorizationFailedError):
            engine.create_topics([NewTopic("not-for-the-engine", 1, 1)])
        with pytest.raises(ClusterAuthorizationFailedError):
            engine.describe_acls(ALL_ACLS)
    finally:
        engine.close()
    producer = KafkaProducer(**settings_for(KafkaProducer, client, bootstrap_servers=bootstrap))
    try:
        for topic in (events, config):
            with pytest.raises(TopicAuthorizationFailedError):
                producer.send(topic, b"{}").get(timeout=30)
    finally:
        producer.close()
    consumer = KafkaConsumer(
        **settings_for(KafkaConsumer, client, bootstrap_servers=bootstrap, enable_auto_commit=False)
    )
    try:
        consumer.assign([TopicPartition(dead_letter, 0)])
        consumer.seek(TopicPartition(dead_letter, 0), 0)
        with pytest.raises(TopicAuthorizationFailedError):
            consumer.poll(timeout_ms=30_000)
    finally:
        consumer.close()
    member = KafkaConsumer(
        events,
        **settings_for(KafkaConsumer, client, bootstrap_servers=bootstrap, group_id="engine"),
    )
    try:
        with pytest.raises(GroupAuthorizationFailedError):
            member.poll(timeout_ms=30_000)
    finally:
        member.close()


def test_sasl_settings_reach_every_kafka_client_of_the_engine() -> None:
    client = {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "engine",
        "sasl_plain_password": SASL_SECRET,
        "ssl_cafile": "/etc/ca.pem",
    }
    settings = EngineSettings.model_validate({"kafka": {"client": client}})
    # The source, as Spark hands it its options (kafka.* strings) ...
    options = SourceOptions.parse(source_options(settings.kafka))
    assert options.client == client
    assert SASL_SECRET not in repr(options)
    # ... the dead-letter producer ...
    sink = SinkSettings.of(settings)
    assert dict(sink.kafka_client) == client
    assert SASL_SECRET not in repr(sink)
    # ... and the preflight check and configuration log (the same client settings).
    assert settings.kafka.client_settings() == client


def test_the_secrets_are_masked_in_what_the_engine_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    client = {"ssl_password": KAFKA_KEY_SECRET, "sasl_plain_password": SASL_SECRET}
    settings = EngineSettings.model_validate(
        {"kafka": {"client": client}, "redis": {"password": ENGINE_SECRET}}
    )
    assert not [s for s in ENGINE_SECRETS if s in repr(settings) or s in settings.model_dump_json()]
    logged = io.StringIO()
    monkeypatch.setattr(logging.getLogger(), "handlers", [logging.StreamHandler(logged)])
    redact_logs(settings)  # what `quotastream run` does first
    log = logging.getLogger("quotastream.test")
    log.warning("connecting with %s and %s", ENGINE_SECRET, settings.kafka.client_settings())
    try:
        raise ConnectionError(f"refused: {KAFKA_KEY_SECRET}, {SASL_SECRET}")
    except ConnectionError:
        log.exception("the connection failed")
    text = logged.getvalue()
    assert "connecting with *** and {'ssl_password': '***', 'sasl_plain_password': '***'}" in text
    assert "ConnectionError: refused: ***, ***" in text
    assert not [secret for secret in ENGINE_SECRETS if secret in text], text


def denial(role: str, operation: ACLOperation, denied: str) -> Any:
    return pytest.param((role, operation), denied, id=f"{role}-{operation.name}")


@pytest.mark.parametrize(
    ("without", "denied"),
    [
        denial("events", ACLOperation.READ, "READ topic '{events}' (TOPIC_AUTHORIZATION_FAILED)"),
        denial(
            "dead-letter",
            ACLOperation.WRITE,
            "WRITE topic '{events}.dead-letter' (TOPIC_AUTHORIZATION_FAILED)",
        ),
        denial(
            "config", ACLOperation.READ, "READ topic '{events}.config' (TOPIC_AUTHORIZATION_FAILED)"
        ),
        denial(
            "config",
            ACLOperation.DESCRIBE_CONFIGS,
            "DESCRIBE_CONFIGS topic '{events}.config' (allowed there: DESCRIBE, READ)",
        ),
        # The operator did not make the configuration log, so the engine must, and may not.
        denial(
            "config",
            ACLOperation.CREATE,
            "CREATE topic '{events}.config' (TOPIC_AUTHORIZATION_FAILED)",
        ),
    ],
)
def test_a_denied_right_is_one_line_naming_principal_operation_and_topic_and_nothing_starts(
    servers: SecureServers, tmp_path: Path, without: tuple[str, ACLOperation], denied: str
) -> None:
    role, operation = without
    events = f"denied-{role}-{operation.name.lower()}"
    servers.provision(events, without=without)
    engine = engine_file(
        tmp_path,
        events,
        servers.broker.address,
        servers.engine_redis(),
        kafka={"client": servers.engine_kafka_client()},
    )
    run = subprocess.run(
        quotastream("run", "--engine-config", str(engine), "--available-now"),
        capture_output=True,
        env={**os.environ, **ENGINE_ENVIRONMENT},
        timeout=300,
        check=False,
        start_new_session=True,
    )
    stderr = run.stderr.decode(errors="replace")
    assert run.returncode == EXIT_UNREACHABLE, stderr[-3000:]
    expected = (
        f"quotastream: error: not started: Kafka at {servers.broker.address}: "
        f"User:{KAFKA_ENGINE} may not {denied.format(events=events)}"
    )
    assert stderr.splitlines()[-1] == expected, stderr[-3000:]
    assert stderr.count("not started") == 1, stderr[-3000:]
    # Refused before Spark, the checkpoint or the exporter, with no secret in its output.
    assert not (tmp_path / "checkpoint").exists()
    assert "starting Spark" not in stderr
    assert not [s for s in ENGINE_SECRETS if s.encode() in run.stdout + run.stderr]


def publish(servers: SecureServers, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=servers.broker.address, **servers.admin_kafka())
    for i, value in enumerate(values):
        producer.send(topic, value, partition=i % 3)
    producer.flush()
    producer.close()


def records_of(servers: SecureServers, topic: str) -> list[bytes]:
    """Every record value of ``topic``, read by the admin."""
    consumer = KafkaConsumer(
        bootstrap_servers=servers.broker.address,
        consumer_timeout_ms=3000,
        **servers.admin_kafka(),
    )
    partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    values = [record.value for record in consumer]
    consumer.close()
    return values


def redis_values(client: redis.Redis, prefix: str) -> Iterator[tuple[str, bytes]]:
    """Every key the engine wrote under ``prefix``, with its value (a string or a hash)."""
    for key in client.scan_iter(f"{prefix}:*"):
        value = client.hgetall(key) if client.type(key) == b"hash" else client.get(key)
        yield key.decode(), repr(value).encode()


def everything_written(*folders: Path) -> Iterator[tuple[str, bytes]]:
    for folder in folders:
        for path in folder.rglob("*"):
            try:
                if path.is_file():
                    yield str(path), path.read_bytes()
            except FileNotFoundError:
                continue  # a running engine's temporary file, gone between listing and reading


@dataclass
class EngineRun:
    output: bytes
    #: The Prometheus exposition scraped after the input was read (continuous mode only).
    exposition: bytes
    #: Files of the run's folders while it ran, and every path there (continuous mode only):
    #: Spark removes its local and temporary folders when it stops.
    files_while_running: list[tuple[str, bytes]]
    paths_while_running: list[str]


def run_available_now(command: list[str], environment: dict[str, str]) -> EngineRun:
    run = subprocess.run(
        [*command, "--available-now"],
        capture_output=True,
        env=environment,
        timeout=300,
        check=False,
        # No terminal: a client key loaded without its password then fails at once, where
        # OpenSSL would otherwise ask for the password on the terminal and wait.
        start_new_session=True,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-3000:].decode(errors="replace")
    return EngineRun(output, b"", [], [])


def run_continuously(
    command: list[str], environment: dict[str, str], tmp_path: Path, topic: str, records: int
) -> EngineRun:
    """Until it has read ``records`` records of ``topic`` and run a few batches more; then the
    exporter is scraped and the run's folders are read, and SIGTERM stops it."""
    checkpoint = tmp_path / "checkpoint"
    stdout, stderr = tmp_path / "engine.stdout", tmp_path / "engine.stderr"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        engine = subprocess.Popen(
            command, stdout=out, stderr=err, env=environment, start_new_session=True
        )

    def output() -> bytes:
        return stdout.read_bytes() + stderr.read_bytes()

    def output_tail() -> str:
        return output()[-3000:].decode(errors="replace")

    deadline = time.monotonic() + LIVENESS_S

    def wait_until(what: str, done: Callable[[], bool]) -> None:
        while not done():
            assert engine.poll() is None, output_tail()
            assert time.monotonic() < deadline, f"no {what} in {LIVENESS_S:.0f} s:\n{output_tail()}"
            time.sleep(0.2)

    try:

        def read_and_more() -> bool:
            last_input = batches_needed(checkpoint, topic, records)
            return last_input is not None and commits(checkpoint) > last_input + BATCHES_AFTER_INPUT

        wait_until("micro-batches past the input", read_and_more)
        printed = re.search(rb"metrics: (http://\S+/metrics)", output())
        assert printed is not None, output_tail()
        url = printed.group(1).decode()
        exposition = b""

        def backlog_measured() -> bool:
            # Asked of Kafka at each scrape, by the exporter's own client (the same login).
            nonlocal exposition
            with urllib.request.urlopen(url, timeout=30) as reply:
                exposition = reply.read()
            families = text_string_to_metric_families(exposition.decode())
            backlog = [f.samples[0].value for f in families if f.name == INPUT_BACKLOG]
            return backlog == [0.0]

        wait_until("input backlog of 0", backlog_measured)
        files_while_running = list(everything_written(tmp_path))
        paths_while_running = [str(path) for path in tmp_path.rglob("*")]
    finally:
        engine.send_signal(signal.SIGTERM)
        engine.wait(120)
    assert engine.returncode == 0, output_tail()
    return EngineRun(output(), exposition, files_while_running, paths_while_running)


@pytest.mark.parametrize("continuous", [False, True], ids=["available-now", "continuous"])
def test_a_run_over_tls_as_the_engine_user_decides_and_writes_no_secret(
    servers: SecureServers, tmp_path: Path, continuous: bool
) -> None:
    topic = f"secure-events-{'continuous' if continuous else 'available-now'}"
    servers.provision(topic)
    values = mixed_payloads(29 if continuous else 23, 600, users=5, span_ms=5000)
    publish(servers, topic, [*values, b"not json"])
    admin = servers.admin_redis()
    admin.flushdb()  # the other mode's decisions
    # Spark's local folders, the JVM's and Python's temporary files: all in the test's folder.
    spark_local, temporary = tmp_path / "spark-local", tmp_path / "tmp"
    spark_local.mkdir()
    temporary.mkdir()
    engine = engine_file(
        tmp_path,
        topic,
        servers.broker.address,
        # Decisions outlive the test: keys written at the first batch's time expire ``keep_ms``
        # after it (docs/redis.md), and a slow first batch can take most of the default 30 s.
        {**servers.engine_redis(), "keep_ms": 3_600_000},
        kafka={"client": servers.engine_kafka_client()},
        spark={"conf": {"spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={temporary}"}},
        metrics={"port": 0},
    )
    environment = {
        **os.environ,
        **ENGINE_ENVIRONMENT,
        "SPARK_LOCAL_DIRS": str(spark_local),
        "TMPDIR": str(temporary),
    }
    command = quotastream("run", "--engine-config", str(engine))
    if continuous:
        run = run_continuously(command, environment, tmp_path, topic, len(values) + 1)
        # The search below covers what exists only while it runs: Spark's block manager and
        # scratch folders, the JVM's temporary files and those of the engine's Python.
        running = run.paths_while_running
        for folder in (
            f"{spark_local}/blockmgr-",
            f"{spark_local}/spark-",
            f"{temporary}/spark-",
            f"{temporary}/quotastream-metrics-",
        ):
            assert any(path.startswith(folder) for path in running), (folder, running)
    else:
        run = run_available_now(command, environment)

    # It decided everything, writing as the least-privileged Redis user over TLS ...
    stored = stored_decisions(admin, PREFIX)
    config = load_quota_config(tmp_path / "quotas.yaml")
    expected = by_key(final_decisions(values, config))
    assert stored.keys() <= {f"{PREFIX}:{quota}:{entity}" for quota, entity in expected}
    assert stored
    for (quota, entity), want in expected.items():
        got = stored.get(f"{PREFIX}:{quota}:{entity}")
        if not must_be_written(want):  # docs/redis.md: an agent reads it as a missing key
            assert_reads_as_unwritten(got, want, config)
            continue
        assert got is not None
        assert got["rate"] == pytest.approx(want["rate"])
    # ... and its dead letter went out as User:engine, over SASL_SSL too.
    dead_letter = records_of(servers, topic_of(topic, "dead-letter"))
    assert [json.loads(value)["reason"] for value in dead_letter] == ["invalid_json"]

    # No secret in anything it printed, served or wrote: its logs (engine, Spark, workers),
    # Spark's local and temporary folders, the checkpoint, the metrics, what it wrote to Redis
    # and Kafka, and the servers' folders (their configuration, logs and Kafka's metadata log,
    # which holds the SCRAM credentials).
    assert b"INFO" in run.output  # the engine's own log is in the captured output
    # The live view's user may write its keys but not list them: said so, not "unreachable".
    summaries = [
        line for line in run.output.decode(errors="replace").splitlines() if "quotastream:" in line
    ]
    assert summaries, run.output[-3000:]
    assert not [line for line in summaries if "unreachable" in line], summaries
    assert f"no view: Redis user {ENGINE_USER} may not list the decisions" in summaries[-1]
    written = [
        ("output", run.output),
        ("metrics exposition", run.exposition),
        *run.files_while_running,
        *everything_written(tmp_path, servers.redis_server.workdir, servers.broker.workdir),
        *redis_values(admin, PREFIX),
        *((topic_of(topic, "dead-letter"), value) for value in dead_letter),
        *((topic_of(topic, "config"), v) for v in records_of(servers, topic_of(topic, "config"))),
    ]
    for secret in ENGINE_SECRETS:
        leaks = [where for where, data in written if secret.encode() in data]
        assert not leaks, f"{secret} found in {leaks}"
