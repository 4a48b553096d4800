"""An engine run against real servers: its settings and files, the events published to it, the
command."""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import redis
import yaml
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from quotastream.client import decision_keys
from streaming.engine.settings import EngineSettings
from streaming.kafka_broker import KafkaCluster
from streaming.services import LocalService
from tests.support.checkpoint import committed_batches, planned_batches
from tests.support.factories import MIXED_QUOTAS


def engine_settings(
    kafka: LocalService | KafkaCluster,
    redis_server: LocalService,
    tmp_path: Path,
    topic: str,
    shuffle_partitions: int = 2,
) -> EngineSettings:
    # The events carry fixed timestamps from 2023: no bounds relative to the wall clock.
    base = EngineSettings.model_validate(
        {
            "events": {"max_past_ms": None, "max_future_ms": None},
            # Decisions outlive the test: keys expire ``keep_ms`` after their batch's time
            # (docs/redis.md), which a slow machine's batches can take most of.
            "redis": {"key_prefix": topic, "keep_ms": 3_600_000},
            "spark": {"shards": 4, "shuffle_partitions": shuffle_partitions},
        }
    )
    return base.pointed_at(
        kafka.address,
        redis_server.host,
        redis_server.port,
        str(tmp_path / "checkpoint"),
        topics=[topic],
        starting_offsets="earliest",
        dead_letter_topic=f"{topic}.dead-letter",
        config_topic=f"{topic}.config",
    )


def publish(
    kafka: LocalService | KafkaCluster,
    topic: str,
    values: list[bytes],
    partitions: int = 3,
    create: bool = True,
    replicas: int = 1,
) -> None:
    """``values`` round-robin over the topic's partitions, each acknowledged by every in-sync
    replica; ``create``: the topic is created first, with ``partitions`` and ``replicas``."""
    if create:
        admin = KafkaAdminClient(bootstrap_servers=kafka.address)
        admin.create_topics([NewTopic(topic, partitions, replicas)])
        admin.close()
    producer = KafkaProducer(bootstrap_servers=kafka.address, linger_ms=10, acks="all")
    for i, value in enumerate(values):
        producer.send(topic, value, partition=i % partitions)
    producer.flush()
    producer.close()


class SteadyTraffic(threading.Thread):
    """Publishes one event every 100 ms, stamped with the wall clock, until stopped; counts the
    events the broker acknowledged (:attr:`acked`, final once stopped)."""

    def __init__(self, kafka: LocalService, topic: str, event: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self._producer = KafkaProducer(bootstrap_servers=kafka.address)
        self._topic, self._event = topic, event
        self._stop_requested = threading.Event()
        self._acks = itertools.count()
        self.acked = 0

    def run(self) -> None:
        while not self._stop_requested.wait(0.1):
            event = {**self._event, "ts": int(time.time() * 1000)}
            sent = self._producer.send(self._topic, json.dumps(event).encode())
            sent.add_callback(lambda _: next(self._acks))

    def stop(self) -> None:
        if self._stop_requested.is_set():
            return
        self._stop_requested.set()
        self.join()
        self._producer.close()  # flushes: every callback has run
        self.acked = next(self._acks)


def engine_file(
    tmp_path: Path,
    topic: str,
    bootstrap_servers: str,
    redis_settings: dict[str, Any],
    kafka: dict[str, Any] | None = None,
    spark: dict[str, Any] | None = None,
    metrics: dict[str, Any] | None = None,
) -> Path:
    """An engine file reading ``topic`` from the start, with the mixed test quotas."""
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(yaml.safe_dump(MIXED_QUOTAS))
    engine = tmp_path / "engine.yaml"
    engine.write_text(
        yaml.safe_dump(
            {
                "quotas": str(quotas),
                # The events carry fixed timestamps from 2023: no bounds relative to the clock.
                "events": {"max_past_ms": None, "max_future_ms": None},
                "kafka": {
                    "bootstrap_servers": bootstrap_servers,
                    "topics": [topic],
                    "starting_offsets": "earliest",
                    "config_topic": f"{topic}.config",
                    "dead_letter_topic": f"{topic}.dead-letter",
                    **(kafka or {}),
                },
                "redis": redis_settings,
                "spark": {"checkpoint": str(tmp_path / "checkpoint"), "shards": 4, **(spark or {})},
                "metrics": metrics or {"enabled": False},
            }
        )
    )
    return engine


def quotastream(*args: str) -> list[str]:
    return [str(Path(sys.executable).with_name("quotastream")), *args]


def commits(checkpoint: Path) -> int:
    """Micro-batches committed (the checkpoint's commit log)."""
    return len(committed_batches(checkpoint))


def stored_decisions(client: redis.Redis, prefix: str) -> dict[str, dict[str, Any]]:
    stored: dict[str, dict[str, Any]] = {}
    for raw_key in decision_keys(client, prefix):
        raw = client.get(raw_key)
        assert isinstance(raw, bytes)
        stored[raw_key.decode()] = json.loads(raw)
    return stored


def batches_needed(checkpoint: Path, topic: str, records: int) -> int | None:
    """The id of the micro-batch that reads up to ``records`` records of ``topic`` (planned)."""
    for batch in planned_batches(checkpoint):
        if batch.read_of(topic) >= records:
            return batch.batch_id
    return None
