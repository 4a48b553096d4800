"""Quota configuration: defaults, Kafka's names, and errors that name file, key and value."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from state.config import DEFAULT, QuotaConfig, ThrottledReplicas, load_quota_config
from state.configfile import ConfigError
from state.quota_types import QuotaType
from streaming.commands.redaction import secrets_of
from streaming.engine.settings import load_engine_settings
from tests.support.certificates import make_certificates, make_client_certificate

REPO = Path(__file__).resolve().parent.parent


def load(tmp_path: Path, text: str) -> QuotaConfig:
    path = tmp_path / "quotas.yaml"
    path.write_text(text)
    return load_quota_config(path)


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    return str(caught.value)


def test_shipped_example_is_valid() -> None:
    config = load_quota_config(REPO / "conf" / "quotas.yaml")
    assert config.clients
    assert config.brokers[DEFAULT].rate_for(QuotaType.REMOTE_COPY) is not None


def test_empty_file_means_kafka_defaults_and_no_quotas(tmp_path: Path) -> None:
    config = load(tmp_path, "")
    for quota_type in QuotaType:
        settings = config.quota_types.of(quota_type)
        assert (settings.samples, settings.window_ms, settings.scope) == (11, 1000, "broker")
    assert (config.clients, config.brokers, config.topics) == ([], {}, {})


def test_kafka_names_and_replica_lists_parse(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """
brokers:
  <default>: {leader.replication.throttled.rate: 1000}
  7: {follower.replication.throttled.rate: 5.5}
topics:
  orders:
    leader.replication.throttled.replicas: " 0:101 , 1:102,"
    follower.replication.throttled.replicas: "*"
""",
    )
    assert config.brokers[DEFAULT].rate_for(QuotaType.LEADER_REPLICATION) == 1000
    assert config.brokers[7].rate_for(QuotaType.FOLLOWER_REPLICATION) == 5.5
    orders = config.topics["orders"]
    assert orders.leader == ThrottledReplicas(replicas=frozenset({(0, 101), (1, 102)}))
    assert orders.follower.every_partition


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "clients: [{user: a, producer_byte_rate: -5}]",
            "clients[0].producer_byte_rate: Input should be greater than 0 (got -5)",
        ),
        ("clients: [{user: a, producer_byte_rate: 0}]", "clients[0].producer_byte_rate"),
        ("clients: [{user: a, producer_byte_rate: '100'}]", "(got '100')"),
        ("clients: [{user: a, producer_byte_rate: .inf}]", "producer_byte_rate"),
        (
            "clients: [{user: a, produce_byte_rate: 5}]",
            "clients[0].produce_byte_rate: Extra inputs",
        ),
        ("clients: [{user: a}]", "sets neither producer_byte_rate nor consumer_byte_rate"),
        ("clients: [{producer_byte_rate: 5}]", "needs 'user', 'client_id' or both"),
        (
            "clients: [{user: a, producer_byte_rate: 5}, {user: a, consumer_byte_rate: 5}]",
            "clients[1] repeats the entity of clients[0]",
        ),
        ("quota_types: {produce: {samples: 0}}", "quota_types.produce.samples"),
        ("quota_types: {produce: {scope: region}}", "quota_types.produce.scope"),
        ("quota_types: {produse: {}}", "quota_types.produse: Extra inputs"),
        ("brokers: {abc: {}}", "broker key 'abc' is not a broker id"),
        (
            "brokers: {1: {leader.replication.throttled.rat: 5}}",
            "brokers[1]['leader.replication.throttled.rat']: Extra inputs",
        ),
        ("topics: {'bad topic': {}}", "'bad topic' is not a legal Kafka topic name"),
        (
            "topics: {t: {leader.replication.throttled.replicas: '0-1'}}",
            "entry '0-1' is not 'partition:broker'",
        ),
        (
            "quota_types: {remote_copy: {scope: cluster}}\n"
            "brokers: {1: {remote.log.manager.copy.max.bytes.per.second: 5}}",
            "quota_types.remote_copy.scope is 'cluster'",
        ),
        ("clients: [{user: a, producer_byte_rate: 5}]\nclients: []", "duplicate key 'clients'"),
        ("clients: [unclosed", "invalid YAML"),
        ("- just a list", "the top level must be a mapping"),
    ],
)
def test_errors_name_file_key_and_value(tmp_path: Path, text: str, expected: str) -> None:
    message = error_of(tmp_path, text)
    assert message.startswith(str(tmp_path / "quotas.yaml"))
    assert expected in message


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: file not found"):
        load_quota_config(tmp_path / "nope.yaml")


def test_shipped_engine_settings_are_valid() -> None:
    settings = load_engine_settings(REPO / "conf" / "engine.yaml")
    assert settings.kafka.topics == ["quotastream.events"]
    assert settings.spark.shards == 8
    assert settings.quotas == str(REPO / "conf" / "quotas.yaml")


def test_the_quota_file_is_found_relative_to_the_engine_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "site").mkdir()
    engine = tmp_path / "site" / "engine.yaml"
    engine.write_text("quotas: limits/quotas.yaml\n")
    monkeypatch.chdir(REPO)  # where a conf/quotas.yaml exists, which must not be the one read
    assert load_engine_settings(engine).quotas == str(tmp_path / "site" / "limits" / "quotas.yaml")
    assert load_engine_settings(None).quotas == "conf/quotas.yaml"
    monkeypatch.setenv("QUOTASTREAM_QUOTAS", "mine.yaml")  # the environment's: the working dir's
    assert load_engine_settings(engine).quotas == "mine.yaml"


def test_an_environment_override_of_null_turns_a_setting_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shipped = load_engine_settings(REPO / "conf" / "engine.yaml")
    assert shipped.kafka.config_topic is not None
    assert shipped.events.max_future_ms is not None
    monkeypatch.setenv("QUOTASTREAM_KAFKA__CONFIG_TOPIC", "null")
    monkeypatch.setenv("QUOTASTREAM_EVENTS__MAX_FUTURE_MS", "null")
    settings = load_engine_settings(REPO / "conf" / "engine.yaml")
    assert (settings.kafka.config_topic, settings.events.max_future_ms) == (None, None)
    monkeypatch.setenv("QUOTASTREAM_KAFKA__BOOTSTRAP_SERVERS", "null")
    with pytest.raises(ConfigError, match=r"kafka\.bootstrap_servers: Input should be a valid"):
        load_engine_settings(REPO / "conf" / "engine.yaml")


def test_secrets_never_show_in_settings_output(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUOTASTREAM_REDIS__PASSWORD", "hunter2")
    settings = load_engine_settings(REPO / "conf" / "engine.yaml")
    assert settings.redis.password is not None
    assert settings.redis.password.get_secret_value() == "hunter2"
    assert "hunter2" not in repr(settings)
    assert "hunter2" not in str(settings.model_dump())


def test_an_encrypted_client_key_without_its_password_is_refused_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenSSL would ask for the pass phrase on the terminal at the first connection instead."""
    server = make_certificates(tmp_path / "tls")
    client = make_client_certificate(server, "engine", key_password="kafka-key-secret")
    engine = tmp_path / "engine.yaml"
    engine.write_text(
        yaml.safe_dump(
            {
                "kafka": {
                    "client": {"ssl_certfile": str(client.cert), "ssl_keyfile": str(client.key)}
                }
            }
        )
    )
    with pytest.raises(ConfigError) as refused:
        load_engine_settings(engine)
    assert str(refused.value) == (
        f"{engine} (or its QUOTASTREAM_* override): kafka: client.ssl_keyfile holds an encrypted"
        " private key, and client.ssl_password is not set (QUOTASTREAM_KAFKA__CLIENT__SSL_PASSWORD)"
    )
    monkeypatch.setenv("QUOTASTREAM_KAFKA__CLIENT__SSL_PASSWORD", "kafka-key-secret")
    assert "ssl_password" in load_engine_settings(engine).kafka.client_settings()
    # An unencrypted key needs no password.
    monkeypatch.delenv("QUOTASTREAM_KAFKA__CLIENT__SSL_PASSWORD")
    engine.write_text(
        yaml.safe_dump(
            {
                "kafka": {
                    "client": {"ssl_certfile": str(server.cert), "ssl_keyfile": str(server.key)}
                }
            }
        )
    )
    assert "ssl_password" not in load_engine_settings(engine).kafka.client_settings()


def test_a_section_error_does_not_echo_the_section_and_its_secrets(tmp_path: Path) -> None:
    engine = tmp_path / "engine.yaml"
    engine.write_text(
        yaml.safe_dump({"redis": {"password": "hunter2", "ssl_cert_file": "client.pem"}})
    )
    with pytest.raises(ConfigError) as refused:
        load_engine_settings(engine)
    assert str(refused.value) == (
        f"{engine} (or its QUOTASTREAM_* override): redis: ssl_cert_file and ssl_key_file must be"
        " set together"
    )


def test_kafka_client_settings_are_typed_as_kafka_python_takes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """YAML gives flags and numbers, the environment text: kafka-python gets its own types
    either way ("false" as text would be true to it, "60000" would fail its comparisons)."""
    engine = tmp_path / "engine.yaml"
    client = {
        "request_timeout_ms": 60000,
        "ssl_check_hostname": False,
        "acks": "all",
        "sasl_plain_password": "hunter22",
    }
    engine.write_text(yaml.safe_dump({"kafka": {"client": client}}))
    assert load_engine_settings(engine).kafka.client_settings() == client
    engine.write_text(yaml.safe_dump({"kafka": {"client": {}}}))
    for name, value in client.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        monkeypatch.setenv(f"QUOTASTREAM_KAFKA__CLIENT__{name.upper()}", text)
    assert load_engine_settings(engine).kafka.client_settings() == client
    # Only text can be a secret to mask: masking "60000" would garble every log line with it.
    assert secrets_of(load_engine_settings(engine)) == ["hunter22"]


@pytest.mark.parametrize(
    ("client", "message"),
    [
        ({"request_timeout_ms": "soon"}, "client.request_timeout_ms must be a whole number"),
        ({"ssl_check_hostname": "nope"}, "client.ssl_check_hostname must be true or false"),
        ({"fetch_max_byts": 5}, "client.fetch_max_byts is not a setting of kafka-python's"),
    ],
)
def test_a_bad_kafka_client_setting_is_refused_naming_it_and_no_secret(
    tmp_path: Path, client: dict[str, object], message: str
) -> None:
    engine = tmp_path / "engine.yaml"
    secret = {"sasl_plain_password": "hunter22"}
    engine.write_text(yaml.safe_dump({"kafka": {"client": {**secret, **client}}}))
    with pytest.raises(ConfigError) as refused:
        load_engine_settings(engine)
    assert message in str(refused.value)
    assert "hunter22" not in str(refused.value)
