"""Servers only the tests start, on free loopback ports (``streaming/services.py`` starts them):
a Spark standalone cluster; and the Apache Kafka release the project pins."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from kafka import KafkaAdminClient

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
