"""What the benchmarks read about the processes on the machine (Linux ``/proc``): memory, CPU
time, and which of this process's descendants is the broker, Spark's JVM, its Python workers or
Redis. A process may end while it is read: its figures are then 0."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def rss_mb(pid: int) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0  # gone meanwhile
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User and system CPU a process has used, 0 once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    return [int(child) for child in found.stdout.split()]


def descendants(pid: int) -> list[int]:
    direct = children(pid)
    return direct + [grandchild for child in direct for grandchild in descendants(child)]


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


#: How :func:`descendants_by_party` tells this process's descendants apart, first match wins.
PARTY_OF_COMMAND: tuple[tuple[str, str], ...] = (
    ("kafka.Kafka", "broker"),
    ("SparkSubmit", "spark_jvm"),  # before "pyspark": the JVM's arguments name pyspark-shell
    ("pyspark", "python_workers"),
    ("redis-server", "redis"),
    ("valkey", "redis"),
)


def descendants_by_party() -> dict[str, list[int]]:
    """This process's descendants by what they are: the broker, Spark's JVM, its Python workers
    (and their daemon), Redis; every party named, with no process if none runs."""
    parties: dict[str, list[int]] = {party: [] for _, party in PARTY_OF_COMMAND}
    for pid in descendants(os.getpid()):
        command = command_of(pid)
        party = next((party for mark, party in PARTY_OF_COMMAND if mark in command), None)
        if party:
            parties[party].append(pid)
    return parties
