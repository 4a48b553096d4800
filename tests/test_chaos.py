"""Chaos: the driver killed with SIGKILL at random points, again and again, loses no byte and
counts none twice; every entity's window and decision equal a batch recomputation.

Modelled on PySpark's own stateful chaos test (``test_pandas_grouped_map_with_state.py``): the
query restarts from its checkpoint after each kill, and the end result is checked against the
same events computed in one batch by the replay core.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from pyspark.sql import SparkSession

from quotastream.client import decision_keys
from state.config import QuotaConfig, load_quota_config
from state.core import QuotaCore
from state.events import parse_events
from streaming.services import LocalService, start_spark_cluster
from tests.expected import by_key, final_decisions, replayed, window_state
from tests.factories import MIXED_QUOTAS, mixed_payloads

KILLS = 10
SEED = int(os.environ.get("QUOTASTREAM_CHAOS_SEED", "20261122"))


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


def chaos_engine_file(
    tmp_path: Path, kafka: LocalService, redis_server: LocalService, topic: str, **spark: Any
) -> Path:
    """200 records a micro-batch, one every 200 ms: many batches to kill the driver in."""
    return engine_file(
        tmp_path,
        topic,
        kafka.address,
        {"host": redis_server.host, "port": redis_server.port, "key_prefix": topic},
        kafka={"max_offsets_per_trigger": 200},
        spark={"trigger_ms": 200, **spark},
    )


def publish(kafka: LocalService, topic: str, values: list[bytes]) -> None:
    admin = KafkaAdminClient(bootstrap_servers=kafka.address)
    admin.create_topics([NewTopic(topic, 3, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=kafka.address, linger_ms=10)
    for i, value in enumerate(values):
        producer.send(topic, value, partition=i % 3)
    producer.flush()
    producer.close()


def quotastream(*args: str) -> list[str]:
    return [str(Path(sys.executable).with_name("quotastream")), *args]


def commits(checkpoint: Path) -> int:
    """Micro-batches committed (the checkpoint's commit log)."""
    folder = checkpoint / "commits"
    return len([p for p in folder.iterdir() if p.name.isdigit()]) if folder.exists() else 0


def descendants(pid: int) -> set[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    children = {int(child) for child in found.stdout.split()}
    return children.union(*(descendants(child) for child in children))


def alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if Path(f"/proc/{pid}").exists()}


@dataclass
class Kill:
    during: str  # "start-up" or "stream"
    batches_before: int
    #: From the restart to its first committed micro-batch (None: killed before one).
    recovery_s: float | None


def kill_driver(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the Python driver; its JVM and Python workers follow it down."""
    family = descendants(process.pid)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(30)
    deadline = time.monotonic() + 60
    while alive(family) and time.monotonic() < deadline:
        time.sleep(0.1)
    # A survivor writing to the checkpoint would make the restart's result meaningless.
    assert not alive(family), f"processes outlived the killed driver: {alive(family)}"


def run_with_kills(engine: Path, checkpoint: Path, rng: random.Random) -> list[Kill]:
    kills: list[Kill] = []
    while len(kills) < KILLS:
        before = commits(checkpoint)
        # Every fourth kill lands while the driver starts: session, query start, first batch.
        during_start_up = len(kills) % 4 == 3
        started = time.monotonic()
        driver = subprocess.Popen(
            quotastream("run", "--engine-config", str(engine), "--no-simulate"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if during_start_up:
            time.sleep(rng.uniform(2.0, 12.0))
            recovered = commits(checkpoint) > before
            kills.append(Kill("start-up", before, None if not recovered else 0.0))
        else:
            deadline = started + 180
            while commits(checkpoint) <= before and time.monotonic() < deadline:
                assert driver.poll() is None, "the restarted driver exited"
                time.sleep(0.05)
            recovery = time.monotonic() - started
            assert commits(checkpoint) > before, "no micro-batch within 180 s of the restart"
            # Then a random point of a later micro-batch: planning, state, writes or commit.
            target = commits(checkpoint) + rng.randrange(3)
            while commits(checkpoint) < target and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 0.8))
            kills.append(Kill("stream", before, recovery))
        assert driver.poll() is None, "the driver ended before it was killed"
        kill_driver(driver)
    return kills


def checkpoint_cores(spark: SparkSession, checkpoint: Path, config: QuotaConfig) -> list[QuotaCore]:
    """Each shard's rolling windows as the checkpoint holds them (Spark's state reader)."""
    rows = spark.read.format("statestore").load(str(checkpoint)).collect()
    return [QuotaCore.restore(config, bytes(row["value"]["groupState"]["tables"])) for row in rows]


def stored_decisions(client: redis.Redis, prefix: str) -> dict[str, dict[str, Any]]:
    stored: dict[str, dict[str, Any]] = {}
    for raw_key in decision_keys(client, prefix):
        raw = client.get(raw_key)
        assert isinstance(raw, bytes)
        stored[raw_key.decode()] = json.loads(raw)
    return stored


def assert_matches_batch_recomputation(
    spark: SparkSession,
    checkpoint: Path,
    redis_server: LocalService,
    prefix: str,
    values: list[bytes],
    config: QuotaConfig,
) -> None:
    core, _ = replayed(values, config)
    expected_windows = window_state([core])
    windows = window_state(checkpoint_cores(spark, checkpoint, config))
    assert windows == expected_windows
    # Every event lies within the final windows: each client byte is there exactly once.
    events = parse_events(values).accepted
    for kind in ("produce", "fetch"):
        kept = sum(
            nbytes
            for (table, _), (_, samples) in windows.items()
            if table == kind
            for nbytes, _ in samples.values()
        )
        assert kept == events.loc[events["kind"] == kind, "bytes"].sum() > 0

    expected = {
        f"{prefix}:{quota}:{entity}": row
        for (quota, entity), row in by_key(final_decisions(values, config)).items()
    }
    stored = stored_decisions(redis.Redis(host=redis_server.host, port=redis_server.port), prefix)
    assert stored.keys() == expected.keys()
    for key, want in expected.items():
        assert stored[key]["rate"] == pytest.approx(want["rate"]), key
        assert stored[key]["throttle_ms"] == want["throttle_ms"], key


def test_ten_sigkills_of_the_driver_lose_nothing_and_count_nothing_twice(
    spark: SparkSession, kafka: LocalService, redis_server: LocalService, tmp_path: Path
) -> None:
    topic = "chaos"
    # All within 5 s of event time, so every byte is still in the final windows.
    values = mixed_payloads(11, 6000, users=20, span_ms=5000)
    publish(kafka, topic, values)
    engine = chaos_engine_file(tmp_path, kafka, redis_server, topic)
    checkpoint = tmp_path / "checkpoint"
    rng = random.Random(SEED)

    kills = run_with_kills(engine, checkpoint, rng)
    final = subprocess.run(
        quotastream("run", "--engine-config", str(engine), "--available-now"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert final.returncode == 0, final.stderr[-3000:]
    recoveries = [k.recovery_s for k in kills if k.during == "stream" and k.recovery_s]
    print(
        f"seed {SEED}: {len(kills)} kills ("
        + ", ".join(f"{k.during} after batch {k.batches_before}" for k in kills)
        + f"); recovery to the first batch {min(recoveries):.1f}-{max(recoveries):.1f} s; "
        f"{commits(checkpoint)} batches in all"
    )
    assert len(kills) >= KILLS
    assert sum(k.during == "start-up" for k in kills) == KILLS // 4
    config = load_quota_config(tmp_path / "quotas.yaml")
    assert_matches_batch_recomputation(spark, checkpoint, redis_server, topic, values, config)


def batches_needed(checkpoint: Path, topic: str, records: int) -> int | None:
    """The id of the micro-batch that reads up to ``records`` records of ``topic`` (planned)."""
    folder = checkpoint / "offsets"
    for path in sorted(
        folder.iterdir() if folder.exists() else [],
        key=lambda p: int(p.name) if p.name.isdigit() else -1,
    ):
        if not path.name.isdigit():
            continue
        offsets = json.loads(path.read_text().splitlines()[-1])
        if sum(int(o) for o in offsets.get(topic, {}).values()) >= records:
            return int(path.name)
    return None


def test_a_standalone_cluster_loses_a_worker_mid_stream_and_loses_no_byte(
    spark: SparkSession, kafka: LocalService, redis_server: LocalService, tmp_path: Path
) -> None:
    topic = "cluster"
    values = mixed_payloads(17, 6000, users=20, span_ms=5000)
    publish(kafka, topic, values)
    with start_spark_cluster(workers=2, cores=1, memory="1g") as cluster:
        engine = chaos_engine_file(
            tmp_path,
            kafka,
            redis_server,
            topic,
            master=cluster.url,
            conf={
                "spark.executor.cores": "1",
                "spark.executor.memory": "512m",
                "spark.cores.max": "2",
                "spark.driver.host": "127.0.0.1",
            },
        )
        checkpoint = tmp_path / "checkpoint"
        log = (tmp_path / "driver.log").open("wb")
        driver = subprocess.Popen(
            quotastream("run", "--engine-config", str(engine), "--no-simulate"),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 300
            while commits(checkpoint) < 4:
                assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "no micro-batches on the cluster"
                time.sleep(0.1)
            # Mid-stream: one Worker (and with it its executor) is gone for good.
            before_kill = commits(checkpoint)
            victim = cluster.workers[0]
            victim.process.kill()
            killed_at = time.monotonic()
            victim.stop()
            while commits(checkpoint) == before_kill:
                assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "no micro-batch after the worker was lost"
                time.sleep(0.05)
            resumed_s = time.monotonic() - killed_at
            while (last := batches_needed(checkpoint, topic, len(values))) is None or commits(
                checkpoint
            ) <= last:
                assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the cluster did not read every record"
                time.sleep(0.1)
        finally:
            driver.send_signal(signal.SIGTERM)
            driver.wait(60)
            log.close()
        assert driver.returncode == 0, (tmp_path / "driver.log").read_text()[-3000:]
    driver_log = (tmp_path / "driver.log").read_text()
    assert "Lost executor" in driver_log  # the kill did take an executor away
    print(f"worker killed after batch {before_kill}; next batch {resumed_s:.1f} s later")
    config = load_quota_config(tmp_path / "quotas.yaml")
    assert_matches_batch_recomputation(spark, checkpoint, redis_server, topic, values, config)
