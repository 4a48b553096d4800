"""Apache Kafka brokers on free loopback ports: the embedded default's broker and the tests'.

The broker is Apache Kafka itself, run from the jars ``scripts/bootstrap`` copies from Maven
Central into ``.kafka/libs`` (the version is the one ``scripts/kafka/pom.xml`` pins; set
``QUOTASTREAM_KAFKA_LIBS`` to use jars elsewhere). Each node is a KRaft node in combined mode
(broker and controller in one JVM), its storage formatted with Kafka's own storage tool, its log
on disk in the node's working directory. One node is a quorum of its own (``--standalone``); a
cluster of several has a static voter set, one voter per node.

A node keeps its log across :meth:`KafkaNode.restart` (the same ports, the same log: a broker
back from a crash); a node started anew on the port of a stopped one (``start_kafka(port=...)``)
has an empty log, as a broker whose disk was lost.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from quotastream.clock import SYSTEM_CLOCK
from streaming.class_archive import dump_archive, listing_option, sharing_options
from streaming.services import (
    LOOPBACK,
    LocalService,
    MissingPackageError,
    ServiceError,
    TlsFiles,
    free_port,
    launch_server,
    wait_until_ready,
)

#: Where ``scripts/bootstrap`` puts the jars, beside the project's ``scripts/``.
_PROJECT_LIBS = Path(__file__).resolve().parents[1] / ".kafka" / "libs"
LIBS_VARIABLE = "QUOTASTREAM_KAFKA_LIBS"
#: What fetches the jars when they are missing.
FETCH_KAFKA = "scripts/bootstrap (it copies Apache Kafka's jars from Maven Central)"
#: The line a node logs once it serves clients (kafka.server.KafkaRaftServer, at INFO).
_STARTED = b"Kafka Server started"
_LOG_CONFIG = Path(__file__).with_name("kafka_log4j2.properties")

#: A small heap: a test broker holds little; the page cache holds the log.
DEFAULT_HEAP = "384m"

#: The Prometheus JMX exporter's rules for a broker (``conf/kafka/jmx-exporter.yaml``): what
#: ``quotastream brokers`` reads, and what the compose stack's brokers export.
JMX_EXPORTER_CONFIG = Path(__file__).resolve().parents[1] / "conf" / "kafka" / "jmx-exporter.yaml"


class MissingKafkaError(MissingPackageError):
    """Apache Kafka's jars are not where the project keeps them; the message says how to get
    them."""


def kafka_libs() -> Path:
    """The folder of Apache Kafka's jars (``QUOTASTREAM_KAFKA_LIBS``, else ``.kafka/libs``)."""
    libs = Path(os.environ.get(LIBS_VARIABLE) or _PROJECT_LIBS)
    if not any(libs.glob("kafka_2.13-*.jar")):
        raise MissingKafkaError(
            f"no Apache Kafka jars in {libs}: run {FETCH_KAFKA}, or set {LIBS_VARIABLE} to a "
            "folder of Kafka's jars"
        )
    return libs


def jmx_exporter_agent(libs: Path | None = None) -> Path:
    """The Prometheus JMX exporter's Java agent ``scripts/bootstrap`` put beside ``libs``."""
    agents = (libs or kafka_libs()).parent / "agents"
    found = sorted(agents.glob("jmx_prometheus_javaagent-*.jar"))
    if not found:
        raise MissingKafkaError(f"no JMX exporter agent in {agents}: run {FETCH_KAFKA}")
    return found[-1]


def kafka_version(libs: Path | None = None) -> str:
    """The Apache Kafka release in ``libs``, read from its broker jar's name."""
    jars = sorted((libs or kafka_libs()).glob("kafka_2.13-*.jar"))
    found = re.fullmatch(r"kafka_2\.13-(.+)\.jar", jars[-1].name) if jars else None
    if found is None:
        raise MissingKafkaError(f"no kafka_2.13 jar in {libs}")
    return found.group(1)


def class_archive(libs: Path) -> Path:
    """Where ``scripts/bootstrap --test-tools`` keeps the class-data archive of ``libs``' broker
    (:mod:`streaming.class_archive`)."""
    return libs.parent / "kafka.jsa"


def build_class_archive(libs: Path | None = None) -> Path:
    """Starts a broker once to list the classes a start loads, and archives them as
    :func:`class_archive`."""
    libs = libs or kafka_libs()
    archive = class_archive(libs)
    archive.unlink(missing_ok=True)  # the listing broker must load its classes itself
    with tempfile.TemporaryDirectory(prefix="quotastream-classes-") as work:
        listed = Path(work) / "classes.lst"
        # Inherited by the broker's JVM (and its storage tool's, which runs before it).
        os.environ[_JAVA_OPTIONS] = listing_option(listed)
        try:
            with start_kafka():
                pass
        finally:
            del os.environ[_JAVA_OPTIONS]
        return dump_archive(java(), listed, archive, f"{libs}/*", [_GARBAGE_COLLECTOR])


_JAVA_OPTIONS = "JAVA_TOOL_OPTIONS"
#: The brokers' collector (an archive is dumped with the collector it is used with).
_GARBAGE_COLLECTOR = "-XX:+UseSerialGC"


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    binary = Path(home) / "bin" / "java" if home else shutil.which("java")
    if binary is None or not Path(binary).is_file():
        raise ServiceError("no java on PATH: Apache Kafka 4 needs Java 17 (scripts/bootstrap)")
    return str(binary)


def new_cluster_id() -> str:
    """A cluster id as Kafka's ``random-uuid`` prints it: 16 random bytes, URL-safe base64
    without padding, never starting with a dash (the tools would read it as an option)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


@dataclass(frozen=True)
class ScramUser:
    name: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class Security:
    """The client listener's security: TLS (the broker's own, from PEM files), SASL/SCRAM-SHA-512
    users created at format time, and Kafka's ACL authorizer with its super users.

    The listener between the nodes (and the controllers') stays plaintext on loopback; with the
    authorizer on, its anonymous principal is a super user, as a broker's own traffic must be
    allowed. Clients never reach it: they are told only the client listener's address.

    ``client_certificates``: the listener asks every client for a certificate signed by the CA
    of ``tls`` and refuses the handshake without one (``ssl.client.auth=required``). On a
    SASL_SSL listener this is mutual TLS beneath SASL (KIP-684): the principal is still the
    SASL user's.
    """

    tls: TlsFiles | None = None
    scram_users: tuple[ScramUser, ...] = ()
    super_users: tuple[str, ...] = ()
    authorizer: bool = False
    client_certificates: bool = False

    def __post_init__(self) -> None:
        if self.client_certificates and self.tls is None:
            raise ValueError("client certificates need TLS (Security.tls)")

    @property
    def protocol(self) -> str:
        sasl = bool(self.scram_users)
        if self.tls is not None:
            return "SASL_SSL" if sasl else "SSL"
        return "SASL_PLAINTEXT" if sasl else "PLAINTEXT"

    def properties(self, keystore: Path) -> dict[str, str]:
        """The node's settings for the client listener; ``keystore``: where :meth:`write_keystore`
        put the listener's key and certificate."""
        settings: dict[str, str] = {}
        if self.tls is not None:
            # PEM files straight from disk (KIP-651); the key is an unencrypted PKCS#8 key.
            settings |= {
                "listener.name.client.ssl.keystore.type": "PEM",
                "listener.name.client.ssl.keystore.location": str(keystore),
                "listener.name.client.ssl.truststore.type": "PEM",
                "listener.name.client.ssl.truststore.location": str(self.tls.ca),
            }
            if self.client_certificates:
                # Listener-prefixed: the only form a SASL_SSL listener honours (KIP-684).
                settings["listener.name.client.ssl.client.auth"] = "required"
        if self.scram_users:
            settings |= {
                "listener.name.client.sasl.enabled.mechanisms": "SCRAM-SHA-512",
                "listener.name.client.scram-sha-512.sasl.jaas.config": (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                ),
            }
        if self.authorizer:
            internal = ("User:ANONYMOUS",)
            settings |= {
                "authorizer.class.name": (
                    "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
                ),
                "super.users": ";".join((*internal, *self.super_users)),
                "allow.everyone.if.no.acl.found": "false",
            }
        return settings

    def write_keystore(self, keystore: Path) -> None:
        """Kafka's PEM key store is one file: the key, then the certificate chain."""
        if self.tls is not None:
            keystore.write_bytes(self.tls.key.read_bytes() + self.tls.cert.read_bytes())


PLAINTEXT = Security()


@dataclass
class KafkaNode(LocalService):
    """One KRaft node (broker and controller) of a local cluster."""

    node_id: int = 1
    controller_port: int = 0
    version: str = ""
    config: Path = field(default=Path(), repr=False)
    heap: str = DEFAULT_HEAP
    #: Where the node's JMX exporter serves ``/metrics`` (None: no exporter attached).
    metrics_port: int | None = None
    _handed_over: bool = field(default=False, repr=False)

    @property
    def metrics_url(self) -> str:
        if self.metrics_port is None:
            raise ServiceError(f"node {self.node_id} was started without a metrics exporter")
        return f"http://{LOOPBACK}:{self.metrics_port}/metrics"

    @property
    def log_dir(self) -> Path:
        return self.workdir / "log"

    def restart(self, timeout: float = 60.0) -> KafkaNode:
        """Started again on the same ports with the same log (stopped first if it runs): a
        broker back from a crash or a restart. This object is the stopped one; the returned
        one runs."""
        self.stop(keep_log=True)
        self._handed_over = True
        process = _launch_node(self.config, self.workdir, self.heap, self.metrics_port)
        node = dataclasses.replace(self, process=process, _stopped=False, _handed_over=False)
        _wait_for_nodes([node], timeout)
        return node

    def stop(self, timeout: float = 10.0, *, keep_log: bool = False) -> None:
        """Stops the node (SIGTERM: Kafka's controlled shutdown; SIGKILL past ``timeout``).
        ``keep_log``: its working directory stays, for :meth:`restart`. Once restarted, the
        directory is the running node's: stopping this object again leaves it alone."""
        if keep_log or self._handed_over:
            self._stop_process(timeout)
        else:
            super().stop(timeout)


@dataclass
class KafkaCluster:
    """Several KRaft nodes that form one cluster (each a voter of its metadata quorum)."""

    nodes: list[KafkaNode]

    @property
    def address(self) -> str:
        """The bootstrap servers: every node, as clients are given them."""
        return ",".join(node.address for node in self.nodes)

    def stop(self) -> None:
        """Ends every node at once and removes their logs. Not one by one: the last nodes of a
        quorum that lost its majority would each wait out a controlled shutdown that cannot
        finish."""
        for node in self.nodes:
            if node.process.poll() is None:
                node.process.kill()
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> KafkaCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_kafka(
    *,
    port: int | None = None,
    security: Security = PLAINTEXT,
    properties: Mapping[str, str] | None = None,
    heap: str = DEFAULT_HEAP,
    timeout: float = 60.0,
) -> KafkaNode:
    """One Apache Kafka node (a cluster of its own) on a free loopback port, or on ``port`` (a
    broker started anew where clients expect it: its log is empty). ``properties`` are added to
    (and override) the node's configuration."""
    attempts = 1 if port is not None else _PORT_ATTEMPTS
    for attempt in range(1, attempts + 1):
        try:
            [node] = _start_nodes(
                [port or free_port()],
                security,
                dict(properties or {}),
                heap,
                timeout,
                standalone=True,
            )
        except _PortTakenError:
            if attempt == attempts:
                raise
            continue
        return node
    raise AssertionError("unreachable: the last attempt returns or raises")


def start_kafka_cluster(
    size: int = 3,
    *,
    security: Security = PLAINTEXT,
    properties: Mapping[str, str] | None = None,
    heap: str = DEFAULT_HEAP,
    timeout: float = 90.0,
    metrics_exporter: bool = False,
) -> KafkaCluster:
    """``size`` Apache Kafka nodes forming one cluster, node ids 1..size, each a broker and a
    voter of the metadata quorum; internal topics replicated to all of them (at most 3); no
    automatic move of leaders back to their preferred replicas.
    ``metrics_exporter``: each node runs the Prometheus JMX exporter as a Java agent, with
    ``conf/kafka/jmx-exporter.yaml`` (its ``metrics_url``)."""
    replicated = {
        name: str(min(size, 3))
        for name in (
            "offsets.topic.replication.factor",
            "transaction.state.log.replication.factor",
            "share.coordinator.state.topic.replication.factor",
            "default.replication.factor",
        )
    }
    # Leadership moves only when a node stops or is asked to: the controller would otherwise
    # move each partition back to its preferred replica up to leader.imbalance.check.interval
    # (5 min) after a node restarts, at a moment no test can know (a tiered partition's new
    # leader then uploads from its own segment boundaries, changing what retention deletes).
    stable_leaders = {"auto.leader.rebalance.enable": "false"}
    ports: list[int] = []
    for _ in range(size):
        ports.append(free_port(avoid=ports))
    nodes = _start_nodes(
        ports,
        security,
        replicated | stable_leaders | dict(properties or {}),
        heap,
        timeout,
        standalone=False,
        metrics_exporter=metrics_exporter,
    )
    return KafkaCluster(nodes)


def tiered_storage_properties(
    store: Path, *, task_interval_ms: int = 500, metadata_partitions: int = 5
) -> dict[str, str]:
    """Node properties for tiered storage on Kafka's own ``LocalTieredStorage`` (the test
    classifier jars ``scripts/kafka/pom.xml`` fetches), with the segments of every node in
    ``store`` (a new leader reads what an earlier one uploaded), and the topic-based remote log
    metadata manager on the inter-broker listener. Kafka's tasks (copy, expiration, retention)
    run every ``task_interval_ms`` instead of every 30 s and 5 minutes, so that a segment rolled
    is uploaded, and one expired deleted, within a second or two. ``__remote_log_metadata`` gets
    ``metadata_partitions`` partitions (Kafka's default is 50, each one a consumer's and a
    producer's work on every node)."""
    rlmm = "rlmm.config.remote.log.metadata"
    return {
        "remote.log.storage.system.enable": "true",
        "remote.log.storage.manager.class.name": (
            "org.apache.kafka.server.log.remote.storage.LocalTieredStorage"
        ),
        "remote.log.metadata.manager.listener.name": "INTERNAL",
        "rsm.config.dir": str(store),
        "rsm.config.delete.on.close": "false",
        f"{rlmm}.topic.num.partitions": str(metadata_partitions),
        f"{rlmm}.initialization.retry.interval.ms": "300",
        "remote.log.manager.task.interval.ms": str(task_interval_ms),
        "log.retention.check.interval.ms": str(task_interval_ms),
        "log.initial.task.delay.ms": str(task_interval_ms),
    }


#: Free ports tried for a node: another process may take a port between its choice and the bind.
_PORT_ATTEMPTS = 3


class _PortTakenError(ServiceError):
    pass


#: What every local node is configured with, besides its listeners: small and quick to start.
_NODE_DEFAULTS: Mapping[str, str] = {
    "process.roles": "broker,controller",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "INTERNAL",
    "num.partitions": "1",
    "offsets.topic.replication.factor": "1",
    # One partition: a new group's coordinator is ready at once, not after 50 partitions load.
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    # The cleaner's buffer is 128 MiB by default, allocated at start: the least it takes.
    "log.cleaner.dedupe.buffer.size": str(2 * 1024 * 1024),
    "num.network.threads": "2",
    "num.io.threads": "2",
    "num.recovery.threads.per.data.dir": "1",
    "background.threads": "2",
}


def _start_nodes(
    ports: Sequence[int],
    security: Security,
    properties: dict[str, str],
    heap: str,
    timeout: float,
    *,
    standalone: bool,
    metrics_exporter: bool = False,
) -> list[KafkaNode]:
    libs = kafka_libs()
    version = kafka_version(libs)
    cluster_id = new_cluster_id()
    chosen = list(ports)
    for _ in range((3 if metrics_exporter else 2) * len(ports)):
        chosen.append(free_port(avoid=chosen))
    count = len(ports)
    internal_ports, controller_ports = chosen[count : 2 * count], chosen[2 * count : 3 * count]
    metrics_ports: list[int | None] = list(chosen[3 * count :]) or [None] * count
    voters = ",".join(
        f"{node_id}@{LOOPBACK}:{controller}"
        for node_id, controller in enumerate(controller_ports, start=1)
    )
    quorum = (
        {"controller.quorum.bootstrap.servers": f"{LOOPBACK}:{controller_ports[0]}"}
        if standalone
        else {"controller.quorum.voters": voters}
    )
    prepared = []
    for node_id, (port, internal, controller) in enumerate(
        zip(ports, internal_ports, controller_ports, strict=True), start=1
    ):
        workdir = Path(tempfile.mkdtemp(prefix=f"quotastream-kafka-{node_id}-"))
        config, keystore = workdir / "server.properties", workdir / "client-listener.pem"
        settings = {
            **_NODE_DEFAULTS,
            "node.id": str(node_id),
            "log.dirs": str(workdir / "log"),
            "listeners": (
                f"CLIENT://{LOOPBACK}:{port},INTERNAL://{LOOPBACK}:{internal},"
                f"CONTROLLER://{LOOPBACK}:{controller}"
            ),
            "advertised.listeners": f"CLIENT://{LOOPBACK}:{port},INTERNAL://{LOOPBACK}:{internal}",
            "listener.security.protocol.map": (
                f"CLIENT:{security.protocol},INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT"
            ),
            **quorum,
            **security.properties(keystore),
            **properties,
        }
        security.write_keystore(keystore)
        config.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        prepared.append((node_id, port, controller, workdir, config))
    _format(libs, [config for *_, config in prepared], cluster_id, security.scram_users, standalone)
    nodes = []
    for (node_id, port, controller, workdir, config), metrics_port in zip(
        prepared, metrics_ports, strict=True
    ):
        process = _launch_node(config, workdir, heap, metrics_port)
        nodes.append(
            KafkaNode(
                "kafka",
                LOOPBACK,
                port,
                process,
                workdir,
                workdir / "kafka.log",
                node_id=node_id,
                controller_port=controller,
                version=version,
                config=config,
                heap=heap,
                metrics_port=metrics_port,
            )
        )
    try:
        _wait_for_nodes(nodes, timeout)
    except BaseException:
        for node in nodes:
            node.stop()
        raise
    return nodes


def _format(
    libs: Path,
    configs: Sequence[Path],
    cluster_id: str,
    users: Sequence[ScramUser],
    standalone: bool,
) -> None:
    """Kafka's storage tool formats each node's log directory (and creates SCRAM users), all
    nodes at once: each format starts a JVM (~3 s on two cores), and one after another they
    were ~10 s of a 3-node cluster's ~27 s start."""
    command = [*_java_command(libs, "kafka.tools.StorageTool", heap="128m", quick_exit=True)]
    command += ["format", "--cluster-id", cluster_id, "--ignore-formatted"]
    if standalone:
        command.append("--standalone")
    for user in users:
        command += ["--add-scram", f"SCRAM-SHA-512=[name={user.name},password={user.password}]"]
    tools = [
        subprocess.Popen(
            [*command, "--config", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for config in configs
    ]
    outputs = [(tool.communicate()[0], tool.returncode) for tool in tools]
    for output, returncode in outputs:
        if returncode != 0:
            # The command line holds SCRAM passwords: only the tool's own output is reported.
            raise ServiceError(f"kafka storage format failed: {output}".strip())


def _java_command(
    libs: Path,
    main_class: str,
    heap: str,
    agents: Sequence[str] = (),
    *,
    quick_exit: bool = False,
) -> list[str]:
    """``quick_exit``: a tool that runs for a moment, spent starting the JVM, which the
    optimising compiler (C2) only slows."""
    return [
        java(),
        f"-Xmx{heap}",
        _GARBAGE_COLLECTOR,
        *sharing_options(class_archive(libs)),
        *(["-XX:TieredStopAtLevel=1"] if quick_exit else []),
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={_LOG_CONFIG}",
        *agents,
        "-cp",
        f"{libs}/*",
        main_class,
    ]


def _launch_node(
    config: Path, workdir: Path, heap: str, metrics_port: int | None
) -> subprocess.Popen[bytes]:
    log_path = workdir / "kafka.log"
    if log_path.exists():
        log_path.rename(workdir / f"kafka.{SYSTEM_CLOCK.wall_ms()}.log")
    libs = kafka_libs()
    agents = (
        []
        if metrics_port is None
        else [
            f"-javaagent:{jmx_exporter_agent(libs)}={LOOPBACK}:{metrics_port}:{JMX_EXPORTER_CONFIG}"
        ]
    )
    return launch_server(
        [*_java_command(libs, "kafka.Kafka", heap, agents), str(config)], workdir, log_path
    )


def _wait_for_nodes(nodes: Sequence[KafkaNode], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for node in nodes:
        try:
            wait_until_ready(
                node, lambda _port, log_path: _STARTED in log_path.read_bytes(), deadline
            )
        except ServiceError as error:
            if b"Address already in use" in node.log_path.read_bytes():
                raise _PortTakenError(str(error)) from error
            raise
