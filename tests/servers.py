"""Servers only the tests start, on free loopback ports (``streaming/services.py`` starts them):
a Spark standalone cluster; and the Apache Kafka release the project pins. And what tests of
running servers share: a ``quotastream`` command in a process of its own, a broker's exported
metrics, a topic's records, a condition waited for."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from subprocess import STDOUT, Popen
from typing import Any, TypeVar
from urllib.request import urlopen
from xml.etree import ElementTree

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from prometheus_client.parser import text_string_to_metric_families

from streaming.kafka_broker import KafkaNode
from streaming.services import (
    LOOPBACK,
    LocalService,
    ServiceError,
    log_says,
    start_server,
)


@dataclass
class SparkCluster:
    """A Spark standalone cluster on loopback: a Master and its Workers (pyspark's own jars)."""

    master: LocalService
    workers: list[LocalService]

    @property
    def url(self) -> str:
        return f"spark://{self.master.address}"

    def stop(self) -> None:
        for service in [*self.workers, self.master]:
            service.stop(timeout=10.0)

    def __enter__(self) -> SparkCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_spark_cluster(workers: int = 2, cores: int = 1, memory: str = "1g") -> SparkCluster:
    """A Master and ``workers`` Workers started with ``spark-class``, as an operator would
    without a cluster manager; each Worker offers ``cores`` cores and ``memory``."""
    spark_class = Path(sys.executable).with_name("spark-class")
    if not spark_class.is_file():
        raise ServiceError(f"no spark-class beside {sys.executable}: is pyspark installed?")
    environment = _spark_environment()

    def daemon(name: str, main_class: str, ready: bytes, *args: str) -> LocalService:
        return start_server(
            name,
            lambda port, workdir: [
                str(spark_class),
                f"org.apache.spark.deploy.{main_class}",
                *args,
                *("--host", LOOPBACK, "--port", str(port), "--webui-port", "0"),
                *(["--work-dir", str(workdir / "work")] if main_class.startswith("worker") else []),
            ],
            ready=log_says(ready),
            environment=environment,
            timeout=120.0,
        )

    master = daemon("spark-master", "master.Master", b"I have been elected leader")

    def start_worker() -> LocalService:
        return daemon(
            "spark-worker",
            "worker.Worker",
            b"Successfully registered with master",
            f"spark://{master.address}",
            *("--cores", str(cores), "--memory", memory),
        )

    started: list[LocalService] = []
    try:
        while len(started) < workers:
            started.append(start_worker())
    except ServiceError:
        for service in [*started, master]:
            service.stop()
        raise
    return SparkCluster(master, started)


def _spark_environment() -> dict[str, str]:
    import pyspark  # noqa: PLC0415 - only a cluster needs to find Spark's jars

    return {
        **os.environ,
        # spark-class otherwise asks the system's python3, which may not have pyspark.
        "SPARK_HOME": str(Path(pyspark.__file__).parent),
        "SPARK_LOCAL_IP": LOOPBACK,
        "SPARK_LOCAL_HOSTNAME": LOOPBACK,
        "SPARK_DAEMON_MEMORY": "256m",
        # The REST submission server listens on a fixed port (6066) otherwise.
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        "PYSPARK_PYTHON": sys.executable,
    }


def pinned_kafka_version() -> str:
    """The Apache Kafka release ``scripts/kafka/pom.xml`` pins: what scripts/bootstrap fetches,
    the tests and the embedded default run, and docker-compose.yml deploys."""
    pom = Path(__file__).resolve().parent.parent / "scripts" / "kafka" / "pom.xml"
    namespace = {"maven": "http://maven.apache.org/POM/4.0.0"}
    found = ElementTree.parse(pom).find("maven:properties/maven:kafka.version", namespace)
    version = None if found is None else found.text
    assert version, f"no kafka.version property in {pom}"
    return version


def wait_until_in_sync(
    bootstrap_servers: str, topics: list[str], timeout_s: float = 120, **client: Any
) -> None:
    """Until every partition of ``topics`` has a leader and all its replicas in sync: a topic
    just created, or a node just restarted, is served by every broker only then. ``client``:
    kafka-python settings (security)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, **client)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            described = admin.describe_topics(topics)
            # A topic the answering broker does not know yet has an error and no partitions.
            unknown = [t["name"] for t in described if t["error_code"] or not t["partitions"]]
            lagging = [
                (t["name"], p["partition_index"])
                for t in described
                for p in t["partitions"]
                if p["leader_id"] < 0 or sorted(p["isr_nodes"]) != sorted(p["replica_nodes"])
            ]
            if not unknown and not lagging:
                return
            assert time.monotonic() < deadline, f"unknown: {unknown}; out of sync: {lagging}"
            time.sleep(0.2)
    finally:
        admin.close()


def wait_until_registered(bootstrap_servers: str, brokers: int, timeout_s: float = 60) -> None:
    """Until ``brokers`` brokers are registered and unfenced, the controller among them: each node
    reports it started before the quorum has unfenced every one, and kafka-python's admin client
    refuses a request to a controller whose address it does not know yet
    (``UnknownBrokerIdError``)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            cluster = admin.describe_cluster()
            serving = {b["broker_id"] for b in cluster["brokers"] if not b["is_fenced"]}
            if len(serving) == brokers and cluster["controller_id"] in serving:
                return
            assert time.monotonic() < deadline, f"registered and unfenced: {sorted(serving)}"
            time.sleep(0.2)
    finally:
        admin.close()


ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


def start_command(
    args: Sequence[str], output: Path, ready: str, timeout_s: float = 60
) -> Popen[bytes]:
    """``quotastream ARGS`` in a process of its own, its output appended to ``output``, once
    that output says ``ready``; fails with the output's end if it exits or times out first."""
    with output.open("ab") as sink:
        process = Popen(
            [sys.executable, "-m", "streaming.commands.cli", *args],
            cwd=ROOT,
            stdout=sink,
            stderr=STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    deadline = time.monotonic() + timeout_s
    while ready not in output.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            tail = output.read_text(errors="replace")[-2000:]
            raise AssertionError(
                f"quotastream {args[0]} not {ready!r} (exit {process.poll()}): {tail}"
            )
        time.sleep(0.05)
    return process


def until(condition: Callable[[], T | None], timeout_s: float, what: str) -> T:
    """Polls ``condition`` until it returns something true, and returns it; fails naming
    ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.2)
    return result


def broker_metric(node: KafkaNode, metric: str, **labels: str) -> float | None:
    """A sample of a broker's JMX exporter: ``metric`` with exactly ``labels`` (None: absent)."""
    with urlopen(node.metrics_url, timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == metric and sample.labels == labels:
                return float(sample.value)
    return None


def topic_records(address: str, topic: str) -> list[ConsumerRecord]:
    """Every record ``topic`` holds now, partition by partition, in offset order."""
    consumer = KafkaConsumer(bootstrap_servers=address, enable_auto_commit=False)
    try:
        assigned = [
            TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        consumer.assign(assigned)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(assigned)
        records: dict[TopicPartition, list[ConsumerRecord]] = {tp: [] for tp in assigned}
        while any(consumer.position(tp) < ends[tp] for tp in assigned):
            for tp, polled in consumer.poll(timeout_ms=500).items():
                records[tp] += [r for r in polled if r.offset < ends[tp]]
        return [record for tp in assigned for record in records[tp]]
    finally:
        consumer.close()
