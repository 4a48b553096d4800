"""Killing the driver mid-stream loses no byte and counts none twice (restart from checkpoint)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from quotastream.client import decision_keys
from state.config import load_quota_config
from streaming.services import LocalService, start_kafka, start_redis
from tests.expected import by_key, final_decisions
from tests.factories import MIXED_QUOTAS, mixed_payloads


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[LocalService, LocalService]]:
    with start_kafka() as kafka, start_redis() as redis_server:
        yield kafka, redis_server


def engine_file(tmp_path: Path, kafka: LocalService, redis_server: LocalService) -> Path:
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
                    "bootstrap_servers": kafka.address,
                    "topics": ["restart"],
                    "starting_offsets": "earliest",
                    "max_offsets_per_trigger": 400,
                },
                "redis": {
                    "host": redis_server.host,
                    "port": redis_server.port,
                    "key_prefix": "restart",
                },
                "spark": {
                    "checkpoint": str(tmp_path / "checkpoint"),
                    "shards": 4,
                    "trigger_ms": 200,
                },
            }
        )
    )
    return engine


def quotastream(*args: str) -> list[str]:
    return [str(Path(sys.executable).with_name("quotastream")), *args]


def commits(checkpoint: Path) -> int:
    folder = checkpoint / "commits"
    return len([p for p in folder.iterdir() if p.name.isdigit()]) if folder.exists() else 0


def java_processes() -> set[int]:
    found = subprocess.run(["pgrep", "-f", "java"], capture_output=True, text=True, check=False)
    return {int(pid) for pid in found.stdout.split()}


def test_kill_minus_nine_mid_stream_then_restart_matches_a_batch_recomputation(
    servers: tuple[LocalService, LocalService], tmp_path: Path
) -> None:
    kafka, redis_server = servers
    # All within 5 s of event time, so every byte is still in the final windows.
    values = mixed_payloads(11, 6000, users=20, span_ms=5000)
    admin = KafkaAdminClient(bootstrap_servers=kafka.address)
    admin.create_topics([NewTopic("restart", 3, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=kafka.address, linger_ms=10)
    for i, value in enumerate(values):
        producer.send("restart", value, partition=i % 3)
    producer.flush()
    producer.close()
    engine = engine_file(tmp_path, kafka, redis_server)
    checkpoint = tmp_path / "checkpoint"

    javas_before = java_processes()
    first = subprocess.Popen(
        quotastream("run", "--engine-config", str(engine), "--no-simulate"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 180
    while commits(checkpoint) < 3 and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.2)
    done_before_kill = commits(checkpoint)
    assert 3 <= done_before_kill < 6000 // 400, "the kill must land mid-stream"
    os.kill(first.pid, signal.SIGKILL)
    first.wait(30)
    # Its JVM follows the Python driver down; the restart must not share the checkpoint with it.
    deadline = time.monotonic() + 60
    while java_processes() - javas_before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not java_processes() - javas_before

    second = subprocess.run(
        quotastream("run", "--engine-config", str(engine), "--available-now"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert commits(checkpoint) > done_before_kill

    config = load_quota_config(tmp_path / "quotas.yaml")
    expected = {
        f"restart:{quota}:{entity}": row
        for (quota, entity), row in by_key(final_decisions(values, config)).items()
    }
    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    stored: dict[str, dict[str, Any]] = {}
    for raw_key in decision_keys(client, "restart"):
        raw = client.get(raw_key)
        assert isinstance(raw, bytes)
        stored[raw_key.decode()] = json.loads(raw)
    assert stored.keys() == expected.keys()
    for key, want in expected.items():
        assert stored[key]["rate"] == pytest.approx(want["rate"]), key
        assert stored[key]["throttle_ms"] == want["throttle_ms"], key
