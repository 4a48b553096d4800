"""``quotastream run`` refuses bad configuration and unreachable servers before starting anything.

Each case names what is wrong (file, key and value, or the endpoint) and leaves no checkpoint,
no exporter port and no Spark behind.
"""

from __future__ import annotations

import socket
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kafka.admin import KafkaAdminClient, NewTopic

from streaming.commands.cli import main
from streaming.commands.exit_codes import EXIT_UNREACHABLE, EXIT_USAGE
from streaming.services import LocalService, free_port

SECRET = "do-not-print-this-pass"


def engine_file(tmp_path: Path, bootstrap: str, redis_port: int, **sections: Any) -> Path:
    quotas = tmp_path / "quotas.yaml"
    if not quotas.exists():
        quotas.write_text(yaml.safe_dump({"clients": [{"user": "a", "producer_byte_rate": 10}]}))
    settings: dict[str, Any] = {
        "quotas": str(quotas),
        "kafka": {"bootstrap_servers": bootstrap},
        "redis": {"port": redis_port},
        "spark": {"checkpoint": str(tmp_path / "checkpoint")},
        "metrics": {"port": free_port()},
    }
    for name, values in sections.items():
        settings.setdefault(name, {}).update(values)
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


def refused(path: Path, capsys: pytest.CaptureFixture[str], code: int, *expected: str) -> str:
    """Runs the engine, which must exit with ``code`` having started nothing."""
    assert main(["run", "--engine-config", str(path), "--no-simulate"]) == code
    error = capsys.readouterr().err
    for text in expected:
        assert text in error
    settings = yaml.safe_load(path.read_text())
    assert not Path(settings["spark"]["checkpoint"]).exists()
    with socket.socket() as probe:  # the exporter's port was never bound
        probe.bind(("127.0.0.1", settings["metrics"]["port"]))
    return error


@pytest.mark.parametrize(
    ("quotas", "expected"),
    [
        ("clients: [{user: a, producer_byte_rate: -5}", "invalid YAML"),
        (
            "clients: [{user: a, producer_byte_rate: -5}]",
            "producer_byte_rate: Input should be greater than 0 (got -5)",
        ),
        ("clients: [{user: a, producer_byte_rate: 0}]", "(got 0)"),
        (
            "clients: [{user: a, producer_byte_rat: 5}]",
            "clients[0].producer_byte_rat: Extra inputs",
        ),
        (
            "clients: [{user: a, producer_byte_rate: 5}, {user: a, consumer_byte_rate: 5}]",
            "clients[1] repeats the entity of clients[0]",
        ),
    ],
)
def test_a_bad_quota_file_is_named_with_its_key_and_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], quotas: str, expected: str
) -> None:
    (tmp_path / "quotas.yaml").write_text(quotas)
    path = engine_file(tmp_path, "127.0.0.1:1", 1)
    refused(path, capsys, EXIT_USAGE, str(tmp_path / "quotas.yaml"), expected)


@pytest.mark.parametrize(
    ("sections", "expected"),
    [
        ({"kafka": {"topics": []}}, "kafka.topics: List should have at least 1 item"),
        ({"kafka": {"bootstrap_sever": "x"}}, "kafka.bootstrap_sever: Extra inputs"),
        (
            {"spark": {"shards": 0}},
            "spark.shards: Input should be greater than or equal to 1 (got 0)",
        ),
        ({"redis": {"max_outage_s": -1}}, "redis.max_outage_s"),
        (
            {"kafka": {"max_outage_s": 0}},
            "kafka.max_outage_s: Input should be greater than 0 (got 0)",
        ),
        (
            {"redis": {"ssl_cert_file": "c.pem"}},
            "ssl_cert_file and ssl_key_file must be set together",
        ),
    ],
)
def test_a_bad_engine_setting_is_named_with_its_key_and_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sections: dict[str, Any], expected: str
) -> None:
    path = engine_file(tmp_path, "127.0.0.1:1", 1, **sections)
    refused(path, capsys, EXIT_USAGE, str(path), expected)


def test_malformed_engine_yaml_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = engine_file(tmp_path, "127.0.0.1:1", 1)
    text = path.read_text()
    path.write_text(text + "kafka: {unclosed\n")
    assert main(["run", "--engine-config", str(path), "--no-simulate"]) == EXIT_USAGE
    assert f"{path}" in capsys.readouterr().err
    assert not (tmp_path / "checkpoint").exists()


def test_an_unreachable_kafka_is_named_and_nothing_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], redis_server: LocalService
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    path = engine_file(tmp_path, dead, redis_server.port)
    refused(path, capsys, EXIT_UNREACHABLE, f"not started: Kafka at {dead}", "Unable to bootstrap")


def test_an_unreachable_redis_is_named_and_nothing_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kafka: LocalService
) -> None:
    port = free_port()
    path = engine_file(tmp_path, kafka.address, port)
    refused(
        path,
        capsys,
        EXIT_UNREACHABLE,
        f"not started: Redis at redis://127.0.0.1:{port}",
        "Connection refused",
    )


@pytest.mark.parametrize(
    ("partitions", "configs", "expected"),
    [
        (3, {}, "has 3 partitions; it must have exactly 1"),
        (1, {"retention.ms": "604800000"}, "has retention.ms=604800000; it must keep every record"),
    ],
)
def test_a_config_topic_that_is_not_as_it_must_be_is_refused_in_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    kafka: LocalService,
    redis_server: LocalService,
    partitions: int,
    configs: dict[str, str],
    expected: str,
) -> None:
    topic = f"config-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka.address)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1, topic_configs=configs)])
    finally:
        admin.close()
    path = engine_file(tmp_path, kafka.address, redis_server.port, kafka={"config_topic": topic})
    error = refused(path, capsys, EXIT_USAGE, f"config topic {topic!r} {expected}", "Fix: ")
    assert error.count("\n") == 1, error  # one line, no traceback


def test_a_refused_redis_login_is_named_without_the_password(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    kafka: LocalService,
    redis_server: LocalService,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The default user has no password here: Redis refuses a login that sends one.
    monkeypatch.setenv("QUOTASTREAM_REDIS__USERNAME", "engine")
    monkeypatch.setenv("QUOTASTREAM_REDIS__PASSWORD", SECRET)
    path = engine_file(tmp_path, kafka.address, redis_server.port)
    error = refused(path, capsys, EXIT_UNREACHABLE, "login refused")
    assert SECRET not in error


@pytest.mark.parametrize(
    ("proxy", "expected"),
    [
        (
            {"bootstrap_port": 9300, "node_port_base": 9200},
            "bootstrap_port 9300 must be below node_port_base 9200",
        ),
        (
            {"sasl_mechanisms": ["GSSAPI"]},
            "proxy.sasl_mechanisms[0]: Input should be 'PLAIN', 'SCRAM-SHA-256' or "
            "'SCRAM-SHA-512' (got 'GSSAPI')",
        ),
        ({"upstream": {"bootstrap_servers": "kafka-1"}}, "'kafka-1' is not host:port"),
        (
            {"flush_interval_ms": 5},
            "proxy.flush_interval_ms: Input should be greater than or equal to 10 (got 5)",
        ),
        (
            {"tls": {"cert_file": "missing.pem", "key_file": "missing.key"}},
            "tls.cert_file 'missing.pem' is not a file",
        ),
        ({"decisions": {"failure_policy": "ajar"}}, "proxy.decisions.failure_policy"),
    ],
)
def test_a_bad_proxy_setting_is_named_with_its_key_and_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], proxy: dict[str, Any], expected: str
) -> None:
    path = engine_file(tmp_path, "127.0.0.1:1", 1, proxy=proxy)
    assert main(["proxy", "--engine-config", str(path)]) == EXIT_USAGE
    error = capsys.readouterr().err
    assert str(path) in error
    assert expected in error
