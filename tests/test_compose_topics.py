"""docker-compose's init step creates the topics the shipped engine settings name, and the
configuration topic exactly as the engine requires it (one definition:
``streaming/engine/config_log.py``).

A configuration topic made any other way is refused by the engine at start (exit 2), and
``restart: unless-stopped`` would repeat that forever: this test is what keeps
``docker compose up`` from looping.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from streaming.engine.config_log import kafka_topics_options
from streaming.engine.settings import load_engine_settings
from tests.servers import pinned_kafka_version

ROOT = Path(__file__).resolve().parent.parent

#: Options of ``kafka-topics.sh --create`` that say where and how, not what the topic is.
_PLACEMENT = {
    "--bootstrap-server": 1,
    "--create": 0,
    "--if-not-exists": 0,
    "--replication-factor": 1,
}


def _created_topics() -> dict[str, list[str]]:
    """Each topic the init step creates, with the options that shape it (placement left out);
    a ``for topic in ...`` loop is expanded."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    # Compose interpolates ``$`` itself: the shell sees ``$$`` as ``$``.
    script = "\n".join(compose["services"]["kafka-init"]["command"]).replace("$$", "$")
    lines = script.replace("\\\n", " ").splitlines()
    created: dict[str, list[str]] = {}
    loop_topics: list[str] = []
    for line in lines:
        words = shlex.split(line, comments=True)
        if words[:3] == ["for", "topic", "in"]:
            loop_topics = [word.rstrip(";") for word in words[3:] if word not in ("do", ";")]
        if not words or not words[0].endswith("kafka-topics.sh"):
            continue
        options: list[str] = []
        topic = ""
        rest = iter(words[1:])
        for word in rest:
            if word == "--topic":
                topic = next(rest)
            elif word in _PLACEMENT:
                for _ in range(_PLACEMENT[word]):
                    next(rest)
            else:
                options.append(word)
        for name in loop_topics if topic == "$topic" else [topic]:
            created[name] = options
    return created


def test_the_init_step_creates_the_configuration_topic_as_the_engine_requires() -> None:
    settings = load_engine_settings(ROOT / "conf" / "engine.yaml")
    created = _created_topics()
    assert settings.kafka.config_topic is not None
    assert created[settings.kafka.config_topic] == kafka_topics_options()


def test_the_init_step_creates_every_topic_the_engine_names() -> None:
    kafka = load_engine_settings(ROOT / "conf" / "engine.yaml").kafka
    named = {*kafka.topics, kafka.dead_letter_topic, kafka.config_topic}
    assert named - {None} <= set(_created_topics())


def test_the_options_name_one_partition_and_no_deletion() -> None:
    options = kafka_topics_options()
    assert options[options.index("--partitions") + 1] == "1"
    configs = dict(
        options[i + 1].split("=", 1) for i, word in enumerate(options) if word == "--config"
    )
    assert configs["retention.ms"] == "-1"
    assert configs["retention.bytes"] == "-1"
    assert configs["cleanup.policy"] == "delete"


def test_compose_deploys_the_kafka_release_the_tests_run() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    images = {
        name: service["image"]
        for name, service in compose["services"].items()
        if service.get("image", "").startswith("apache/kafka:")
    }
    assert set(images) == {"kafka", "kafka-init"}
    assert set(images.values()) == {f"apache/kafka:{pinned_kafka_version()}"}


def _pom_property(name: str) -> str:
    pom = (ROOT / "scripts" / "kafka" / "pom.xml").read_text()
    match = re.search(rf"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", pom)
    assert match is not None, name
    return match.group(1)


def test_the_broker_and_the_brokers_agent_use_the_jars_the_init_step_fetches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docker-compose's kafka-jars step copies the pom's `agents` and `tiered` items into one
    volume; the broker's JMX agent and tiered-storage class path, and `quotastream brokers`'
    schema jar, name files of those versions there, and the agent's settings are valid."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    kafka, exporter = _pom_property("kafka.version"), _pom_property("jmx.exporter.version")
    script = "\n".join(services["kafka-jars"]["command"])
    assert "dependency:copy@agents -DoutputDirectory=/jars/agents" in script
    assert "dependency:copy@tiered -DoutputDirectory=/jars/tiered" in script
    mounted = "/opt/quotastream-jars"
    assert f"kafka-jars:{mounted}:ro" in services["kafka"]["volumes"]
    assert f"kafka-jars:{mounted}:ro" in services["brokers"]["volumes"]
    broker = services["kafka"]["environment"]
    assert f"{mounted}/agents/jmx_prometheus_javaagent-{exporter}.jar=9404:" in broker["KAFKA_OPTS"]
    assert broker["KAFKA_REMOTE_LOG_STORAGE_MANAGER_CLASS_PATH"].split(":") == [
        f"{mounted}/tiered/kafka-storage-{kafka}-test.jar",
        f"{mounted}/tiered/kafka-clients-{kafka}-test.jar",
    ]
    agent = services["brokers"]["environment"]
    jar = "QUOTASTREAM_BROKERS__REMOTE_LOG_METADATA__KAFKA_STORAGE_JAR"
    assert agent[jar] == f"{mounted}/tiered/kafka-storage-{kafka}.jar"
    # The agent's settings, as the container reads them (the jar made to exist here).
    (tmp_path / "kafka-storage.jar").write_bytes(b"")
    for name, value in {**agent, jar: str(tmp_path / "kafka-storage.jar")}.items():
        monkeypatch.setenv(name, str(value))
    settings = load_engine_settings(ROOT / "conf" / "engine.yaml")
    assert settings.brokers.remote_log_metadata.enabled
    assert settings.brokers.actuator.enabled
    assert settings.brokers.broker_metrics.endpoints == {1: "http://kafka:9404/metrics"}
    assert settings.brokers.cluster.bootstrap_servers == "kafka:9092"
    scrape = yaml.safe_load((ROOT / "conf" / "prometheus" / "prometheus.yml").read_text())
    targets = {
        t
        for job in scrape["scrape_configs"]
        for c in job.get("static_configs", [])
        for t in c["targets"]
    }
    assert {f"brokers:{settings.brokers.metrics.port}", "kafka:9404"} <= targets


#: A JMX exporter agent's argument: ``=[HOST:]PORT:CONFIG``.
_EXPORTER_ARGUMENT = re.compile(r"-javaagent:\S*jmx_prometheus_javaagent-[\d.]+\.jar=([^\s\"]+)")


def exporter_binds(text: str) -> list[str]:
    """Where each JMX exporter agent in ``text`` listens: ``HOST:PORT``, or ``*:PORT`` for a
    bare port (every interface)."""
    binds = []
    for argument in _EXPORTER_ARGUMENT.findall(text):
        address = argument.split(":")[:-1]  # the configuration file last
        binds.append(":".join(address) if len(address) == 2 else f"*:{address[0]}")
    return binds


def test_the_jmx_exporter_examples_bind_the_one_address_their_scrapers_reach() -> None:
    """The exporter answers anyone, unauthenticated, with the broker's topics, log sizes and
    traffic (docs/deployment.md says why): every example for a real broker binds one address,
    the same in both guides. Only the compose broker binds every interface of its container, and
    no port publishes its exporter beyond the compose network."""
    examples = {
        page: exporter_binds((ROOT / "docs" / page).read_text())
        for page in ("deployment.md", "brokers.md")
    }
    assert examples == {"deployment.md": ["BROKER_HOST:9404"], "brokers.md": ["BROKER_HOST:9404"]}
    kafka = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["kafka"]
    assert exporter_binds(kafka["environment"]["KAFKA_OPTS"]) == ["*:9404"]
    assert not [port for port in kafka.get("ports", []) if str(port).endswith(":9404")]
