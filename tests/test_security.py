"""Security: the engine over TLS to Redis (AUTH, a least-privilege ACL user) and to Kafka (a
client key it unlocks with ``ssl_password``), with its secrets given in the environment, and
none of them in anything the run writes, in either trigger mode.

Redis is Debian's redis-server speaking only TLS. Kafka is tansu behind a TLS terminator
(stunnel): tansu 0.6 cannot combine its own ``--cert`` and ``--key`` options.
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
from typing import Any

import pytest
import redis
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families
from redis.backoff import NoBackoff
from redis.retry import Retry

from quotastream.acl import ENGINE_USER, engine_acl, set_user
from state.config import load_quota_config
from streaming.commands.preflight import (
    DEFAULT_TIMEOUT_S,
    UnreachableError,
    check_kafka,
    check_redis,
)
from streaming.commands.redaction import redact_logs
from streaming.engine.job import source_options
from streaming.engine.metric_names import INPUT_BACKLOG
from streaming.engine.offsets import SourceOptions
from streaming.engine.settings import EngineSettings
from streaming.engine.sinks import SinkSettings
from streaming.services import (
    LocalService,
    TlsFiles,
    free_port,
    start_kafka,
    start_redis,
)
from tests.certificates import make_certificates, make_client_certificate
from tests.expected import by_key, final_decisions
from tests.factories import mixed_payloads
from tests.servers import start_tls_proxy
from tests.test_chaos import batches_needed, commits, engine_file, quotastream, stored_decisions

#: The Redis admin's password: the servers' own, never given to the engine.
ADMIN_PASSWORD = "admin-Secret-4f1c9"
#: The password of the engine's ACL user: without it the engine cannot log in to Redis.
ENGINE_SECRET = "engine-Secret-8b2e7"
#: kafka-python's ``ssl_password``: it unlocks the engine's encrypted Kafka client key, which
#: every Kafka client of the engine loads before it connects.
KAFKA_KEY_SECRET = "kafka-Secret-3d5a1"
#: What the engine is given, and must keep out of everything it writes.
ENGINE_SECRETS = (ENGINE_SECRET, KAFKA_KEY_SECRET)
NOT_THE_PASSWORD = "not-the-password"
PREFIX = "secure"
#: Micro-batches the continuous run commits after the one that read the last record: a few
#: trigger rounds without new input (the shards' throttle timers run in them).
BATCHES_AFTER_INPUT = 3
#: A generous bound for what must eventually happen on a loaded machine (liveness only).
LIVENESS_S = 240.0


@dataclass
class SecureServers:
    tls: TlsFiles
    #: The engine's Kafka client certificate, its key encrypted with KAFKA_KEY_SECRET.
    engine_client: TlsFiles
    redis_server: LocalService
    broker: LocalService
    kafka_tls: LocalService  # where clients connect: TLS in front of the broker

    def kafka_client(self) -> dict[str, str]:
        """The test's own Kafka clients: TLS, trusting the test CA."""
        return {"security_protocol": "SSL", "ssl_cafile": str(self.tls.ca)}

    def engine_kafka_client(self) -> dict[str, str]:
        """The engine's ``kafka.client`` as its file holds it: the key's password is not here
        but in the environment (:data:`ENGINE_ENVIRONMENT`)."""
        return {
            **self.kafka_client(),
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
        self, redis_password: str = ENGINE_SECRET, key_password: str = KAFKA_KEY_SECRET
    ) -> EngineSettings:
        client = {**self.engine_kafka_client(), "ssl_password": key_password}
        return EngineSettings.model_validate(
            {
                "kafka": {"bootstrap_servers": self.kafka_tls.address, "client": client},
                "redis": {**self.engine_redis(), "password": redis_password},
            }
        )

    def admin_redis(self) -> redis.Redis:
        return redis.Redis(
            host=self.redis_server.host,
            port=self.redis_server.port,
            password=ADMIN_PASSWORD,
            ssl=True,
            ssl_ca_certs=str(self.tls.ca),
        )


#: Secrets come from the environment, as the docs say they should.
ENGINE_ENVIRONMENT = {
    "QUOTASTREAM_REDIS__PASSWORD": ENGINE_SECRET,
    "QUOTASTREAM_KAFKA__CLIENT__SSL_PASSWORD": KAFKA_KEY_SECRET,
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureServers]:
    tls = make_certificates(tmp_path_factory.mktemp("tls"))
    engine_client = make_client_certificate(tls, "engine-client", KAFKA_KEY_SECRET)
    proxy_port = free_port()
    with (
        start_redis(password=ADMIN_PASSWORD, tls=tls) as redis_server,
        start_kafka(advertised_port=proxy_port) as broker,
        start_tls_proxy(broker, tls, port=proxy_port) as kafka_tls,
    ):
        servers = SecureServers(tls, engine_client, redis_server, broker, kafka_tls)
        set_user(servers.admin_redis(), ENGINE_USER, engine_acl(PREFIX, ENGINE_SECRET))
        yield servers


_API_VERSIONS = 18
_CORRELATION_ID = 0x5EC


def kafka_answers_plaintext(address: str) -> bool:
    """Whether a Kafka ApiVersions request (v0) in plaintext gets its answer at ``address``."""
    host, port = address.rsplit(":", 1)
    client_id = b"plaintext-probe"
    header = struct.pack(">hhih", _API_VERSIONS, 0, _CORRELATION_ID, len(client_id))
    request = header + client_id
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(struct.pack(">i", len(request)) + request)
        try:
            reply = connection.makefile("rb").read(8)  # the answer's size and correlation id
        except ConnectionResetError:
            return False
    return len(reply) == 8 and struct.unpack(">ii", reply)[1] == _CORRELATION_ID


def test_plaintext_clients_are_refused_by_both_servers(servers: SecureServers) -> None:
    plaintext_redis = redis.Redis(
        host="127.0.0.1",
        port=servers.redis_server.port,
        socket_timeout=30,
        retry=Retry(NoBackoff(), 0),
    )
    with pytest.raises(redis.ConnectionError):
        plaintext_redis.ping()
    # The broker behind the TLS terminator answers this request; the address clients are given
    # does not.
    assert kafka_answers_plaintext(servers.broker.address)
    assert not kafka_answers_plaintext(servers.kafka_tls.address)
    # Both present a certificate that only the test CA vouches for, which no system trusts.
    for server in (servers.redis_server, servers.kafka_tls):
        with (
            socket.create_connection((server.host, server.port), timeout=30) as connection,
            pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"),
        ):
            ssl.create_default_context().wrap_socket(connection, server_hostname=server.host)


def test_each_secret_given_to_the_engine_is_what_lets_it_in(servers: SecureServers) -> None:
    # The engine's start-up check, with the secrets the runs below are given ...
    settings = servers.engine_settings()
    check_kafka(settings.kafka, DEFAULT_TIMEOUT_S)
    check_redis(settings.redis, DEFAULT_TIMEOUT_S)
    # ... and with either one wrong. A client key that does not unlock makes no connection at
    # all (kafka-python loads it before each one), however long the check waits.
    wrong_password = servers.engine_settings(redis_password=NOT_THE_PASSWORD)
    with pytest.raises(UnreachableError, match="login refused"):
        check_redis(wrong_password.redis, DEFAULT_TIMEOUT_S)
    with pytest.raises(UnreachableError, match=f"Kafka at {servers.kafka_tls.address}"):
        check_kafka(servers.engine_settings(key_password=NOT_THE_PASSWORD).kafka, 2.0)


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


def test_sasl_settings_reach_every_kafka_client_of_the_engine() -> None:
    sasl_secret = "sasl-Secret-6c0f2"
    client = {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "engine",
        "sasl_plain_password": sasl_secret,
        "ssl_cafile": "/etc/ca.pem",
    }
    settings = EngineSettings.model_validate({"kafka": {"client": client}})
    # The source, as Spark hands it its options (kafka.* strings) ...
    options = SourceOptions.parse(source_options(settings.kafka))
    assert options.client == client
    assert sasl_secret not in repr(options)
    # ... the dead-letter producer ...
    sink = SinkSettings.of(settings)
    assert dict(sink.kafka_client) == client
    assert sasl_secret not in repr(sink)
    # ... and the preflight check and configuration log (the same client settings).
    assert settings.kafka.client_settings() == client


def test_the_secrets_are_masked_in_what_the_engine_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = EngineSettings.model_validate(
        {
            "kafka": {"client": {"ssl_password": KAFKA_KEY_SECRET}},
            "redis": {"password": ENGINE_SECRET},
        }
    )
    assert not [s for s in ENGINE_SECRETS if s in repr(settings) or s in settings.model_dump_json()]
    logged = io.StringIO()
    monkeypatch.setattr(logging.getLogger(), "handlers", [logging.StreamHandler(logged)])
    redact_logs(settings)  # what `quotastream run` does first
    log = logging.getLogger("quotastream.test")
    log.warning("connecting with %s and %s", ENGINE_SECRET, settings.kafka.client_settings())
    try:
        raise ConnectionError(f"refused: {KAFKA_KEY_SECRET}")
    except ConnectionError:
        log.exception("the connection failed")
    text = logged.getvalue()
    assert "connecting with *** and {'ssl_password': '***'}" in text
    assert "ConnectionError: refused: ***" in text
    assert not [secret for secret in ENGINE_SECRETS if secret in text], text


def publish(servers: SecureServers, topic: str, values: list[bytes]) -> None:
    admin = KafkaAdminClient(bootstrap_servers=servers.kafka_tls.address, **servers.kafka_client())
    admin.create_topics([NewTopic(topic, 3, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=servers.kafka_tls.address, **servers.kafka_client())
    for i, value in enumerate(values):
        producer.send(topic, value, partition=i % 3)
    producer.flush()
    producer.close()


def records_of(servers: SecureServers, topic: str) -> list[bytes]:
    """Every record value of ``topic``, read over TLS."""
    consumer = KafkaConsumer(
        bootstrap_servers=servers.kafka_tls.address,
        consumer_timeout_ms=3000,
        **servers.kafka_client(),
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
            # Asked of Kafka at each scrape, by the exporter's own client (the same client key).
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
        servers.kafka_tls.address,
        servers.engine_redis(),
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

    # It decided everything, writing as the least-privileged user over TLS ...
    stored = stored_decisions(admin, PREFIX)
    expected = by_key(final_decisions(values, load_quota_config(tmp_path / "quotas.yaml")))
    assert len(stored) == len(expected)
    for (quota, entity), want in expected.items():
        assert stored[f"{PREFIX}:{quota}:{entity}"]["rate"] == pytest.approx(want["rate"])
    # ... and its dead letter went out over TLS too.
    dead_letter = records_of(servers, f"{topic}.dead-letter")
    assert [json.loads(value)["reason"] for value in dead_letter] == ["invalid_json"]

    # No secret in anything it printed, served or wrote: its logs (engine, Spark, workers),
    # Spark's local and temporary folders, the checkpoint, the metrics, what it wrote to Redis
    # and Kafka, and the servers' folders (logs, the TLS terminator's configuration).
    assert b"INFO" in run.output  # the engine's own log is in the captured output
    written = [
        ("output", run.output),
        ("metrics exposition", run.exposition),
        *run.files_while_running,
        *everything_written(
            tmp_path,
            servers.redis_server.workdir,
            servers.broker.workdir,
            servers.kafka_tls.workdir,
        ),
        *redis_values(admin, PREFIX),
        *((f"{topic}.dead-letter", value) for value in dead_letter),
        *((f"{topic}.config", value) for value in records_of(servers, f"{topic}.config")),
    ]
    for secret in ENGINE_SECRETS:
        leaks = [where for where, data in written if secret.encode() in data]
        assert not leaks, f"{secret} found in {leaks}"
