"""Soak: the engine under a steady offered load for a long run, its memory and batches sampled.

Real servers (Apache Kafka, Redis), local Spark, the engine's own query. A producer offers
``--rate`` events/s from ``--active`` clients; every ``--churn-s`` seconds a fresh set of clients
takes over, so entities keep arriving and going idle: with ``events.max_past_ms`` at 2 minutes
the state must stay bounded by the active entities, not grow with every entity ever seen.

Every ``--sample-s`` seconds it records the resident memory of the driver JVM, of the Python
workers and of this (driver) process, Spark's state-store size and the micro-batch durations.
The result, with a first-vs-last comparison per quantity, is one JSON line appended to
bench/results/soak.jsonl.

    python bench/soak.py [--minutes 30] [--rate 2000] [--active 500]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import tempfile
import threading
import time
from datetime import UTC, datetime
from typing import Any

from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from processes import descendants_by_party, rss_mb
from results import record  # bench/ is on sys.path when a script in it runs

from state.config import parse_quota_config
from streaming.engine.job import local_spark, start_query
from streaming.engine.offsets import records_read
from streaming.engine.settings import EngineSettings
from streaming.kafka_broker import start_kafka
from streaming.services import start_redis

TOPIC = "soak"


class OfferedLoad(threading.Thread):
    """``rate`` produce/fetch events per second from the current set of ``active`` clients."""

    def __init__(self, bootstrap: str, rate: int, active: int, churn_s: float) -> None:
        super().__init__(daemon=True)
        self._producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
        self._rate, self._active, self._churn_s = rate, active, churn_s
        self._stopping = threading.Event()
        self.sent = 0

    def run(self) -> None:
        rng = random.Random(7)
        began = time.time()
        tick = 0.1
        while not self._stopping.is_set():
            now = time.time()
            generation = int((now - began) // self._churn_s)
            for _ in range(int(self._rate * tick)):
                event = {
                    "kind": "produce" if rng.random() < 0.7 else "fetch",
                    "user": f"g{generation}-u{rng.randrange(self._active)}",
                    "client_id": "app",
                    "broker": rng.randrange(3),
                    "bytes": rng.randrange(100, 5000),
                    "ts": int(now * 1000),
                }
                self._producer.send(TOPIC, json.dumps(event).encode())
                self.sent += 1
            self._stopping.wait(max(now + tick - time.time(), 0))
        self._producer.close()

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=10)


def sample(query: Any, began: float, after_batch: int) -> dict[str, Any]:
    """Memory now, and the micro-batches since ``after_batch``."""
    me = os.getpid()
    parties = descendants_by_party()
    jvm, workers = parties["spark_jvm"], parties["python_workers"]
    progress = [p for p in query.recentProgress if p["batchId"] > after_batch]
    state = progress[-1]["stateOperators"][0] if progress and progress[-1]["stateOperators"] else {}
    return {
        "t_s": round(time.monotonic() - began),
        "driver_jvm_mb": round(sum(rss_mb(pid) for pid in jvm)),
        "python_workers_mb": round(sum(rss_mb(pid) for pid in workers)),
        "python_workers": len(workers),
        "driver_python_mb": round(rss_mb(me)),
        "state_memory_bytes": state.get("memoryUsedBytes"),
        "batch_ms": [p["durationMs"].get("triggerExecution") for p in progress],
        # Kafka records read (Spark's input rows are the source's packs of them).
        "input_records": sum(
            records_read(p["sources"][0]["startOffset"], p["sources"][0]["endOffset"])
            for p in progress
        ),
        "last_batch": progress[-1]["batchId"] if progress else after_batch,
    }


def window_mean(
    samples: list[dict[str, Any]], key: str, first: bool, fraction: float = 1 / 6
) -> float:
    count = max(int(len(samples) * fraction), 1)
    part = samples[:count] if first else samples[-count:]
    values = [s[key] for s in part if s[key] is not None]
    return round(statistics.fmean(values), 1) if values else 0.0


def batch_stats(
    samples: list[dict[str, Any]], first: bool, fraction: float = 1 / 6
) -> dict[str, float]:
    count = max(int(len(samples) * fraction), 1)
    part = samples[:count] if first else samples[-count:]
    durations = sorted(ms for s in part for ms in s["batch_ms"] if ms is not None)
    if not durations:
        return {}
    return {
        "p50_ms": durations[len(durations) // 2],
        "p95_ms": durations[int(len(durations) * 0.95)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--active", type=int, default=500)
    parser.add_argument("--churn-s", type=float, default=180)
    parser.add_argument("--sample-s", type=float, default=30)
    args = parser.parse_args()
    config = parse_quota_config(
        {
            "clients": [
                {"user": "<default>", "producer_byte_rate": 20_000, "consumer_byte_rate": 40_000}
            ]
        },
        "soak",
    )
    with start_kafka() as kafka, start_redis() as redis_server:
        admin = KafkaAdminClient(bootstrap_servers=kafka.address)
        admin.create_topics([NewTopic(TOPIC, 3, 1)])
        admin.close()
        settings = EngineSettings.model_validate(
            {"events": {"max_past_ms": 120_000}, "metrics": {"enabled": False}}
        ).pointed_at(
            kafka.address,
            redis_server.host,
            redis_server.port,
            tempfile.mkdtemp(prefix="quotastream-soak-"),
            topics=[TOPIC],
            config_topic=f"{TOPIC}.config",
        )
        spark = local_spark(settings)
        query = start_query(spark, settings, config)
        load = OfferedLoad(kafka.address, args.rate, args.active, args.churn_s)
        load.start()
        began = time.monotonic()
        samples: list[dict[str, Any]] = []
        try:
            while time.monotonic() - began < args.minutes * 60:
                time.sleep(args.sample_s)
                if not query.isActive:
                    raise RuntimeError(f"the query stopped: {query.exception()}")
                after = samples[-1]["last_batch"] if samples else -1
                samples.append(sample(query, began, after))
                print(json.dumps(samples[-1]), flush=True)
        finally:
            load.stop()
            query.stop()
            spark.stop()
    # The first sixth is warm-up; compare the second sixth with the last.
    steady = samples[len(samples) // 6 :]
    summary: dict[str, dict[str, Any]] = {
        key: {"early": window_mean(steady, key, True), "late": window_mean(steady, key, False)}
        for key in ("driver_jvm_mb", "python_workers_mb", "driver_python_mb", "state_memory_bytes")
    }
    summary["batch"] = {"early": batch_stats(steady, True), "late": batch_stats(steady, False)}
    record(
        "soak",
        {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()} {os.cpu_count()} cpu, {settings.spark.master}",
            "minutes": args.minutes,
            "offered_events_per_s": args.rate,
            "active_clients": args.active,
            "churn_s": args.churn_s,
            "events_sent": load.sent,
            "distinct_clients": args.active * (int(args.minutes * 60 // args.churn_s) + 1),
            "summary": summary,
            "samples": samples,
        },
    )


if __name__ == "__main__":
    main()
