"""The whole pipeline on local Spark: Kafka -> engine -> Redis, with real servers.

Two measurements, written as one JSON line to bench/results/pipeline.jsonl:

* **throughput**: a topic pre-loaded with N events is drained with Trigger.AvailableNow;
  events/s = input rows / the sum of micro-batch durations (Spark's own progress), plus each
  batch's time breakdown, so a missed target says where the time goes;
* **latency**: events published at a fixed rate carry their send time as ``ts``; Redis is polled
  and each new decision's ``decided_at`` (its newest event's send time) against the time it was
  seen gives event->Redis latency (p50, p99).

    python bench/pipeline.py [--events 300000] [--rate 10000] [--seconds 60]
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

import pandas as pd
import pyarrow as pa
import redis
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from pyspark.sql.streaming.datasource import ReadAllAvailable
from results import record  # bench/ is on sys.path when a script in it runs

from quotastream.client import decision_keys
from state.config import parse_quota_config
from state.events import EventBounds
from streaming.job import local_spark, start_query
from streaming.kafka_source import KafkaStreamReader
from streaming.offsets import SourceOptions
from streaming.services import LocalService, start_kafka, start_redis
from streaming.settings import EngineSettings
from streaming.sinks import SinkSettings, write_batches
from streaming.stages import DECISION_SCHEMA, StageSettings, update_shard, usage_batches

CONFIG = parse_quota_config(
    {
        "clients": [{"user": "<default>", "producer_byte_rate": 1_000_000}],
        "brokers": {"<default>": {"remote.log.manager.copy.max.bytes.per.second": 50_000_000}},
    },
    "bench config",
)
PARTITIONS = 4


def event(rng: random.Random, ts: int, clients: int) -> bytes:
    client = min(int(rng.paretovariate(1.2)), clients) - 1
    if rng.random() < 0.9:
        body: dict[str, Any] = {
            "kind": "produce",
            "user": f"user-{client % 500}",
            "client_id": f"client-{client}",
            "broker": rng.randrange(6),
            "bytes": rng.randrange(64_000),
            "ts": ts,
        }
    else:
        body = {
            "kind": "remote_copy",
            "broker": rng.randrange(6),
            "topic": "t",
            "partition": rng.randrange(32),
            "bytes": rng.randrange(8_000_000),
            "ts": ts,
        }
    return json.dumps(body).encode()


def producer(kafka: LocalService) -> KafkaProducer:
    return KafkaProducer(bootstrap_servers=kafka.address, linger_ms=20, batch_size=262_144, acks=1)


def settings(
    kafka: LocalService,
    redis_server: LocalService,
    topic: str,
    trigger_ms: int,
    max_offsets: int | None = None,
) -> EngineSettings:
    base = EngineSettings.model_validate(
        {"redis": {"key_prefix": topic}, "spark": {"shards": 8, "trigger_ms": trigger_ms}}
    )
    return base.pointed_at(
        kafka.address,
        redis_server.host,
        redis_server.port,
        tempfile.mkdtemp(prefix="bench-checkpoint-"),
        topics=[topic],
        starting_offsets="earliest",
        max_offsets_per_trigger=max_offsets,
    )


def preload(kafka: LocalService, topic: str, count: int, clients: int, seed: int) -> float:
    """Publishes ``count`` events to a new topic; returns the seconds it took."""
    create_topic(kafka, topic)
    rng = random.Random(seed)
    started = time.perf_counter()
    out = producer(kafka)
    now = int(time.time() * 1000)
    for i in range(count):
        out.send(topic, event(rng, now + i // 100, clients), partition=i % PARTITIONS)
    out.flush()
    out.close()
    return time.perf_counter() - started


def create_topic(kafka: LocalService, topic: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=kafka.address)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    admin.close()


def throughput(
    spark: Any, kafka: LocalService, redis_server: LocalService, count: int, clients: int
) -> dict[str, Any]:
    topic = "throughput"
    load_s = preload(kafka, topic, count, clients, seed=1)
    query = start_query(
        spark,
        settings(kafka, redis_server, topic, 0, max_offsets=50_000),
        CONFIG,
        available_now=True,
    )
    query.awaitTermination()
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    rows = sum(p["numInputRows"] for p in progress)
    batch_ms = sum(p["durationMs"]["triggerExecution"] for p in progress)
    breakdown: dict[str, int] = {}
    for p in progress:
        for phase, ms in p["durationMs"].items():
            breakdown[phase] = breakdown.get(phase, 0) + ms
    warm = progress[1:]
    warm_rows = sum(p["numInputRows"] for p in warm)
    warm_ms = sum(p["durationMs"]["triggerExecution"] for p in warm)
    return {
        "events": rows,
        "batches": len(progress),
        "events_per_s": round(rows / (batch_ms / 1000)),
        "events_per_s_after_first_batch": round(warm_rows / (warm_ms / 1000)) if warm else None,
        "batch_ms_breakdown": breakdown,
        "producer_events_per_s": round(count / load_s),
    }


def latency(
    spark: Any,
    kafka: LocalService,
    redis_server: LocalService,
    *,
    rate: int,
    seconds: int,
    clients: int,
) -> dict[str, Any]:
    topic = "latency"
    create_topic(kafka, topic)
    query = start_query(spark, settings(kafka, redis_server, topic, 200), CONFIG)
    stop = threading.Event()
    sent = [0]

    def publish() -> None:
        rng = random.Random(2)
        out = producer(kafka)
        begin = time.time()
        while not stop.is_set() and time.time() - begin < seconds:
            due = int((time.time() - begin) * rate)
            while sent[0] < due:
                out.send(
                    topic,
                    event(rng, int(time.time() * 1000), clients),
                    partition=sent[0] % PARTITIONS,
                )
                sent[0] += 1
            time.sleep(0.005)
        out.flush()
        out.close()

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    seen: dict[bytes, int] = {}
    samples: list[int] = []
    warmup_until = time.time() + 20  # Spark's first batches start Python workers
    while thread.is_alive():
        keys = decision_keys(client, topic)
        values = client.mget(keys) if keys else []
        assert isinstance(values, list)
        observed = int(time.time() * 1000)
        for key, raw in zip(keys, values, strict=True):
            if raw is None:
                continue
            decided_at = json.loads(raw)["decided_at"]
            if seen.get(key) != decided_at:
                seen[key] = decided_at
                if time.time() > warmup_until:
                    samples.append(observed - decided_at)
        time.sleep(0.05)
    stop.set()
    query.stop()
    samples.sort()
    return {
        "offered_events_per_s": rate,
        "published": sent[0],
        "observations": len(samples),
        "p50_ms": samples[len(samples) // 2] if samples else None,
        "p99_ms": samples[int(len(samples) * 0.99)] if samples else None,
        "mean_ms": round(statistics.fmean(samples)) if samples else None,
    }


def stage_costs(
    kafka: LocalService, redis_server: LocalService, count: int, clients: int
) -> dict[str, int]:
    """Events/s of each piece of the pipeline run in one process, without Spark: where the
    per-event time goes (Spark adds scheduling, Arrow transfers and state commits on top)."""
    topic = "stage-costs"
    preload(kafka, topic, count, clients, seed=3)
    source = KafkaStreamReader(
        SourceOptions.parse(
            {
                "kafka.bootstrap.servers": kafka.address,
                "subscribe": topic,
                "startingOffsets": "earliest",
            }
        )
    )
    start = source.initialOffset()
    end = source.latestOffset(start, ReadAllAvailable())
    timings: dict[str, float] = {}
    began = time.perf_counter()
    batches = [batch for part in source.partitions(start, end) for batch in source.read(part)]
    timings["kafka_read"] = time.perf_counter() - began
    stage = StageSettings(CONFIG, EventBounds(), 65_536, shards=8)
    began = time.perf_counter()
    staged = pa.Table.from_batches(list(usage_batches(iter(batches), stage))).to_pandas()
    timings["stage1_validate_resolve_sum"] = time.perf_counter() - began
    began = time.perf_counter()
    now = stage.now_ms()
    decided = [
        update_shard(None, rows, stage, int(shard), now).rows
        for shard, rows in staged.groupby("shard")
    ]
    timings["stage2_state_update"] = time.perf_counter() - began
    decisions = pa.RecordBatch.from_pandas(
        pd.concat(decided, ignore_index=True), schema=DECISION_SCHEMA, preserve_index=False
    )
    began = time.perf_counter()
    list(write_batches(iter([decisions]), SinkSettings.local(redis_server.host, redis_server.port)))
    timings["redis_sink"] = time.perf_counter() - began
    source.stop()
    events = sum(batch.num_rows for batch in batches)
    return {f"{name}_events_per_s": round(events / seconds) for name, seconds in timings.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--seconds", type=int, default=60)
    args = parser.parse_args()
    with start_kafka() as kafka, start_redis() as redis_server:
        spark = local_spark(EngineSettings())
        try:
            result = {
                "when": datetime.now(UTC).isoformat(timespec="seconds"),
                "machine": f"{platform.machine()} {os.cpu_count()} cpu, local[2]",
                "stage_costs_one_process": stage_costs(kafka, redis_server, 100_000, args.clients),
                "throughput": throughput(spark, kafka, redis_server, args.events, args.clients),
                "latency": latency(
                    spark,
                    kafka,
                    redis_server,
                    rate=args.rate,
                    seconds=args.seconds,
                    clients=args.clients,
                ),
            }
        finally:
            spark.stop()
    record("pipeline", result)


if __name__ == "__main__":
    main()
