"""The whole pipeline on local Spark: Kafka -> engine -> Redis, with real servers (Apache Kafka,
Redis).

Prints one JSON object and appends it to bench/results/pipeline.jsonl:

* ``ceiling``: a bare kafka-python poll loop (one consumer, one core) over the single-event
  topic, measured in the same run: the rate the engine's reads are compared with;
* ``fixed_cost``: micro-batches of 4 events on a warm query (what every batch pays), with the
  medians of Spark's phases of them;
* ``single`` / ``batched``: a pre-loaded topic drained with Trigger.AvailableNow, in batches of
  ``maxOffsetsPerTrigger``; events/s = events / the sum of Spark's batch durations, with the
  batches' time breakdown (Spark's phases) so that a missed target says where the time goes;
* ``scale``: batches of 100k events over 10k .. 1M distinct active clients (and, with 1M held,
  over 10k of them: what holding the others costs a batch): batch time p50 and
  state bytes as the state grows;
* ``latency``: single-event messages published at a fixed rate carry their send time as ``ts``;
  Redis is polled and each new decision's ``decided_at`` (its newest event's send time) against
  the time it was seen gives event->Redis latency;
* ``stage_costs_one_process``: each piece of the path in one process without Spark.

    python bench/pipeline.py [--quick | --smoke] [--rate 10000] [--seconds 60]

``--smoke``: every measurement once on the smallest inputs, in well under a minute: what the
test suite runs (``tests/test_bench_smoke.py``) to keep the script working; its figures mean
nothing (``"smoke": true`` in the result).
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import redis
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from pyspark.sql.streaming.datasource import ReadMaxRows
from results import record  # bench/ is on sys.path when a script in it runs

from quotastream.client import decision_keys
from state.config import parse_quota_config
from state.core import QuotaCore
from state.events import EventBounds
from streaming.engine.job import local_spark, start_query
from streaming.engine.kafka_source import KafkaStreamReader
from streaming.engine.offsets import SourceOptions, records_read
from streaming.engine.settings import EngineSettings
from streaming.engine.shard_layout import ShardLayout
from streaming.engine.sinks import SinkSettings, write_batches
from streaming.engine.source_records import KafkaRecords
from streaming.engine.stages import (
    StageSettings,
    packed_by_shard,
    shard_rows,
    staged_batches,
    update_shard,
)
from streaming.kafka_broker import start_kafka
from streaming.services import LocalService, start_redis

CONFIG = parse_quota_config(
    {
        "clients": [{"user": "<default>", "producer_byte_rate": 1_000_000}],
        "brokers": {"<default>": {"remote.log.manager.copy.max.bytes.per.second": 50_000_000}},
    },
    "bench config",
)
PARTITIONS = 4
SHARDS = 8


class Traffic:
    """Events as agents send them: 90% produce over Pareto-popular clients, 10% segment uploads."""

    def __init__(self, seed: int, clients: int, popular: bool = True) -> None:
        self.rng = random.Random(seed)
        self.clients = clients
        self.popular = popular

    def event(self, ts: int) -> bytes:
        rng = self.rng
        if self.popular:
            client = min(int(rng.paretovariate(1.2)), self.clients) - 1
        else:
            client = rng.randrange(self.clients)
        if rng.random() < 0.9:
            return (
                f'{{"kind":"produce","user":"user-{client}","client_id":"client-{client}",'
                f'"broker":{rng.randrange(6)},"bytes":{rng.randrange(64_000)},"ts":{ts}}}'
            ).encode()
        return (
            f'{{"kind":"remote_copy","broker":{rng.randrange(6)},"topic":"t",'
            f'"partition":{rng.randrange(32)},"bytes":{rng.randrange(8_000_000)},"ts":{ts}}}'
        ).encode()

    def messages(self, events: int, per_message: int, now_ms: int) -> Iterator[bytes]:
        """``events`` events, ``per_message`` to a message (1: one JSON object each)."""
        for first in range(0, events, per_message):
            count = min(per_message, events - first)
            batch = [self.event(now_ms + (first + i) // 100) for i in range(count)]
            yield batch[0] if per_message == 1 else b"[" + b",".join(batch) + b"]"


def create_topic(kafka: LocalService, topic: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=kafka.address)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    admin.close()


def publish(kafka: LocalService, topic: str, messages: Iterator[bytes]) -> int:
    out = KafkaProducer(
        bootstrap_servers=kafka.address,
        linger_ms=20,
        batch_size=1_048_576,
        max_request_size=8_388_608,
        acks=1,
    )
    count = 0
    for count, message in enumerate(messages, 1):
        out.send(topic, message, partition=count % PARTITIONS)
    out.flush()
    out.close()
    return count


def settings(
    kafka: LocalService,
    redis_server: LocalService,
    topic: str,
    *,
    trigger_ms: int | None = None,
    max_offsets: int | None = None,
    shards: int = SHARDS,
) -> EngineSettings:
    spark: dict[str, Any] = {"shards": shards}
    if trigger_ms is not None:
        spark["trigger_ms"] = trigger_ms
    base = EngineSettings.model_validate({"redis": {"key_prefix": topic}, "spark": spark})
    return base.pointed_at(
        kafka.address,
        redis_server.host,
        redis_server.port,
        tempfile.mkdtemp(prefix="bench-checkpoint-"),
        topics=[topic],
        starting_offsets="earliest",
        max_offsets_per_trigger=max_offsets,
    )


def bare_consume(kafka: LocalService, topic: str) -> float:
    """Messages/s of one kafka-python consumer draining ``topic``: the client's own ceiling."""
    consumer = KafkaConsumer(bootstrap_servers=kafka.address, enable_auto_commit=False)
    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    end = sum(consumer.end_offsets(partitions).values())
    began = time.perf_counter()
    seen = 0
    while seen < end:
        for records in consumer.poll(timeout_ms=500, max_records=100_000).values():
            seen += len(records)
    elapsed = time.perf_counter() - began
    consumer.close()
    return seen / elapsed


def drain(spark: Any, settings: EngineSettings) -> list[dict[str, Any]]:
    """Runs an available-now query over the whole topic; its batches' progress."""
    query = start_query(spark, settings, CONFIG, available_now=True)
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"the query failed: {query.exception()}")
    return [p for p in query.recentProgress if p["numInputRows"] > 0]


def throughput(
    spark: Any,
    kafka: LocalService,
    redis_server: LocalService,
    topic: str,
    *,
    events: int,
    per_message: int,
    events_per_batch: int,
) -> dict[str, Any]:
    progress = drain(
        spark,
        settings(kafka, redis_server, topic, max_offsets=events_per_batch // per_message),
    )
    messages = sum(_messages_read(p) for p in progress)
    batch_ms = sum(p["durationMs"]["triggerExecution"] for p in progress)
    breakdown: dict[str, int] = {}
    for p in progress:
        for phase, ms in p["durationMs"].items():
            breakdown[phase] = breakdown.get(phase, 0) + ms
    return {
        "events": events,
        "events_per_message": per_message,
        "messages": messages,
        "batches": len(progress),
        "events_per_s": round(events / (batch_ms / 1000)),
        # The query's first batch also starts its Python runners and state stores.
        "events_per_s_after_first_batch": _after_first(progress, per_message),
        "batch_ms": [p["durationMs"]["triggerExecution"] for p in progress],
        "batch_ms_breakdown": breakdown,
    }


def _messages_read(progress: dict[str, Any]) -> int:
    """Kafka records a batch read (Spark's input rows are the source's packs of them)."""
    source = progress["sources"][0]
    return records_read(source["startOffset"], source["endOffset"])


def _after_first(progress: list[dict[str, Any]], per_message: int) -> int | None:
    later = progress[1:]
    if not later:
        return None
    messages = sum(_messages_read(p) for p in later)
    seconds = float(sum(p["durationMs"]["triggerExecution"] for p in later)) / 1000
    return round(messages * per_message / seconds)


def scale_messages(
    clients: int,
    per_message: int,
    now: int,
    batch_events: int,
    batches: int,
    *,
    touched: int | None = None,
) -> tuple[Iterator[bytes], Iterator[bytes]]:
    """Every client active once (the state holds them all), then ``batches`` of
    ``batch_events`` events over random clients (of the first ``touched`` only, if given)."""
    everyone = (
        b"["
        + b",".join(
            f'{{"kind":"produce","user":"u{c}","client_id":"c","broker":1,"bytes":100,"ts":{now}}}'.encode()
            for c in range(first, min(first + per_message, clients))
        )
        + b"]"
        for first in range(0, clients, per_message)
    )
    rng = random.Random(clients)
    work = (
        b"["
        + b",".join(
            f'{{"kind":"produce","user":"u{rng.randrange(touched or clients)}","client_id":"c",'
            f'"broker":1,"bytes":100,"ts":{now + 1000}}}'.encode()
            for _ in range(per_message)
        )
        + b"]"
        for _ in range(batch_events * batches // per_message)
    )
    return everyone, work


def scale(
    spark: Any,
    kafka: LocalService,
    redis_server: LocalService,
    clients: int,
    per_message: int,
    *,
    shards: int = SHARDS,
    topic: str | None = None,
    touched: int | None = None,
    batch_events: int = 100_000,
    batches: int = 5,
) -> dict[str, Any]:
    """How a batch's cost and the state grow with the clients held, and where a batch's time
    goes (each piece once more in one process, on the same events): ``batches`` batches of
    ``batch_events`` events. With ``touched``, the batches' events come from that many of the
    clients only: what holding the others costs."""
    topic = topic or f"scale-{clients}-{shards}-{touched}"
    create_topic(kafka, topic)
    now = int(time.time() * 1000)
    everyone, work = scale_messages(
        clients, per_message, now, batch_events, batches, touched=touched
    )
    publish(kafka, topic, everyone)
    publish(kafka, topic, work)
    query = start_query(
        spark,
        settings(
            kafka, redis_server, topic, max_offsets=batch_events // per_message, shards=shards
        ),
        CONFIG,
        available_now=True,
    )
    query.awaitTermination()
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    last = progress[-batches:]
    state = progress[-1]["stateOperators"][0]
    everyone, work = scale_messages(clients, per_message, now, batch_events, 1, touched=touched)
    return {
        "active_clients": clients,
        "touched_clients": min(touched or clients, clients),
        "shards": shards,
        "batch_ms_p50": statistics.median(p["durationMs"]["triggerExecution"] for p in last),
        "state_bytes": state["memoryUsedBytes"],
        "state_bytes_per_client": round(state["memoryUsedBytes"] / clients, 1),
        "state_rows": state["numRowsTotal"],
        "one_batch_one_process_ms": piece_costs(
            [list(everyone)], list(work), redis_server, shards, now + 1000
        ),
    }


def running_query(spark: Any, kafka: LocalService, redis_server: LocalService, topic: str) -> Any:
    create_topic(kafka, topic)
    return start_query(spark, settings(kafka, redis_server, topic), CONFIG)


#: Tiny batches a fixed-cost run sends, and how many of them its query's start-up slows.
TINY_BATCHES = 14
TINY_STARTUP_BATCHES = 6


def fixed_cost(
    spark: Any,
    kafka: LocalService,
    redis_server: LocalService,
    topic: str = "tiny",
    *,
    batches: int = TINY_BATCHES,
    startup_batches: int = TINY_STARTUP_BATCHES,
) -> dict[str, Any]:
    """``batches`` micro-batches of 4 events each on a running (warm) query.

    A query's first batches run slower while it starts: the first (~9 s) starts the Python
    workers, and in four runs of 8-20 batches (2026-11-29) the next four took 0.71-1.43 s
    (median 1.07 s) and those after them 0.57-1.01 s (median 0.69 s). The median is of the
    batches after the first ``startup_batches``."""
    query = running_query(spark, kafka, redis_server, topic)
    traffic = Traffic(seed=5, clients=100)
    phases: list[dict[str, int]] = []
    try:
        for round_ in range(batches):
            now = int(time.time() * 1000)
            publish(kafka, topic, traffic.messages(4, 1, now))
            batch = wait_for(partial(_batches_after, query, round_), timeout_s=60)
            phases.append(batch[0]["durationMs"])
    finally:
        query.stop()
    warm = phases[startup_batches:]
    return {
        "tiny_batch_ms": statistics.median(p["triggerExecution"] for p in warm),
        "tiny_batch_ms_all": [p["triggerExecution"] for p in phases],
        # Spark's phases of a batch (medians): addBatch runs the tasks; walCommit and
        # commitOffsets write the offset and commit logs.
        "tiny_batch_phases_ms": {
            name: statistics.median(p.get(name, 0) for p in warm) for name in warm[0]
        },
    }


def _batches_with_data(query: Any) -> list[dict[str, Any]]:
    return [p for p in query.recentProgress if p["numInputRows"] > 0]


def _batches_after(query: Any, count: int) -> list[dict[str, Any]]:
    return _batches_with_data(query)[count:]


def wait_for(found: Callable[[], list[Any]], timeout_s: float) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = found()
        if result:
            return result
        time.sleep(0.05)
    raise TimeoutError(f"nothing after {timeout_s} s")


def latency(
    spark: Any, kafka: LocalService, redis_server: LocalService, *, rate: int, seconds: int
) -> dict[str, Any]:
    topic = "latency"
    query = running_query(spark, kafka, redis_server, topic)
    # A first batch with data starts the query's Python workers and state: measured from after it.
    publish(kafka, topic, Traffic(seed=3, clients=10).messages(4, 1, int(time.time() * 1000)))
    wait_for(partial(_batches_after, query, 0), timeout_s=120)
    measured_from = int(time.time() * 1000)
    stop = threading.Event()
    sent = [0]

    def publish_at_rate() -> None:
        traffic = Traffic(seed=2, clients=10_000)
        out = KafkaProducer(bootstrap_servers=kafka.address, linger_ms=5, acks=1)
        begin = time.time()
        while not stop.is_set() and time.time() - begin < seconds:
            due = int((time.time() - begin) * rate)
            while sent[0] < due:
                out.send(topic, traffic.event(int(time.time() * 1000)), partition=sent[0] % 4)
                sent[0] += 1
            time.sleep(0.005)
        out.flush()
        out.close()

    thread = threading.Thread(target=publish_at_rate, daemon=True)
    thread.start()
    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    seen: dict[bytes, int] = {}
    samples: list[int] = []
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
                if decided_at >= measured_from:
                    samples.append(observed - decided_at)
        time.sleep(0.05)
    stop.set()
    batch_ms = [p["durationMs"]["triggerExecution"] for p in _batches_with_data(query)[1:]]
    query.stop()
    samples.sort()
    return {
        "offered_events_per_s": rate,
        "published": sent[0],
        "observations": len(samples),
        "p50_ms": samples[len(samples) // 2] if samples else None,
        "p99_ms": samples[int(len(samples) * 0.99)] if samples else None,
        "mean_ms": round(statistics.fmean(samples)) if samples else None,
        # None: no batch after the first ended within the run (a short one on a busy machine).
        "batch_ms_p50": statistics.median(batch_ms) if batch_ms else None,
        "batch_ms_max": max(batch_ms, default=None),
    }


def stage_costs(kafka: LocalService, redis_server: LocalService, topic: str) -> dict[str, int]:
    """Events/s of each piece of the path in one process, without Spark: where the time goes
    (Spark adds scheduling, Arrow transfers and state commits on top)."""
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
    end = source.latestOffset(start, ReadMaxRows(100_000))
    began = time.perf_counter()
    chunks = [
        chunk for part in source.partitions(start, end) for chunk in source.records(part.value)
    ]
    costs = {"kafka_read_ms": round((time.perf_counter() - began) * 1000)}
    source.stop()
    values: list[bytes] = [value or b"" for chunk in chunks for value in chunk.values]
    costs |= piece_costs([], values, redis_server, SHARDS, int(time.time() * 1000))
    return {
        f"{name.removesuffix('_ms')}_msgs_per_s": round(len(values) / ms * 1000)
        for name, ms in costs.items()
        if name != "state_restore_encode_ms"
    }


def piece_costs(
    before: list[list[bytes]],
    batch: list[bytes],
    redis_server: LocalService,
    shards: int,
    now: int,
) -> dict[str, int]:
    """Milliseconds of each piece of one micro-batch of ``batch`` messages, in one process and
    without Spark, after the batches ``before`` built the state: stage 1 (validate, resolve,
    sum, pack per shard), stage 2 (unpacking and the shards' steps, of which restoring and
    encoding the state is the part that grows with every entity held) and the Redis sink."""
    stage = StageSettings(CONFIG, EventBounds(), 65_536)
    # As a query on two cores spreads them.
    layout = ShardLayout(shards, 2)
    states: dict[int, Any] = {}

    def stage1(messages: list[bytes]) -> list[pa.RecordBatch]:
        records = KafkaRecords("bench", 0, list(range(len(messages))), list(messages), 0)
        return list(packed_by_shard(staged_batches([records], stage, layout)))

    def stage2(packs: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
        decisions = []
        for by_shard in packs:  # one read: one pack per shard
            shards = by_shard.column("shard").to_pylist()
            for shard, packed in zip(shards, by_shard.column("rows").to_pylist(), strict=True):
                update = update_shard(states.get(shard), shard_rows([packed]), stage, shard, now)
                states[shard] = update.state
                decisions.extend(update.batches)
        return decisions

    for messages in before:
        stage2(stage1(messages))
    timings: dict[str, float] = {}
    began = time.perf_counter()
    packs = stage1(batch)
    timings["stage1_validate_resolve_sum"] = time.perf_counter() - began
    began = time.perf_counter()
    decisions = stage2(packs)
    timings["stage2_state_update"] = time.perf_counter() - began
    began = time.perf_counter()
    for state in states.values():
        if state is not None:
            QuotaCore.restore(CONFIG, state.tables, touched={}).encode_state()
    timings["state_restore_encode"] = time.perf_counter() - began
    began = time.perf_counter()
    list(write_batches(iter(decisions), SinkSettings.local(redis_server.host, redis_server.port)))
    timings["redis_sink"] = time.perf_counter() - began
    made = [batch.filter(pc.equal(batch.column("row_type"), "decision")) for batch in decisions]
    return {f"{name}_ms": round(seconds * 1000) for name, seconds in timings.items()} | {
        "decisions_made": sum(batch.num_rows for batch in made),
        "decisions_written": sum(pc.sum(batch.column("write")).as_py() or 0 for batch in made),
    }


@dataclass(frozen=True)
class Workload:
    """How much each measurement runs."""

    single_events: int
    batched_events: int
    #: ``maxOffsetsPerTrigger`` of the throughput runs, in events.
    single_batch_events: int
    batched_batch_events: int
    latency_s: int
    #: (clients held, clients the batches touch): the last pair against the first shows what
    #: holding 1M clients costs a batch that touches 10k of them.
    scales: list[tuple[int, int | None]]
    scale_batch_events: int = 100_000
    scale_batches: int = 5
    tiny_batches: int = TINY_BATCHES
    tiny_startup_batches: int = TINY_STARTUP_BATCHES


FULL = Workload(
    single_events=1_200_000,
    batched_events=6_000_000,
    single_batch_events=400_000,
    batched_batch_events=2_000_000,
    latency_s=60,
    scales=[(10_000, None), (100_000, None), (1_000_000, None), (1_000_000, 10_000)],
)
QUICK = Workload(
    single_events=400_000,
    batched_events=2_000_000,
    single_batch_events=400_000,
    batched_batch_events=2_000_000,
    latency_s=20,
    scales=[(10_000, None), (100_000, None)],
)
SMOKE = Workload(
    single_events=2_000,
    batched_events=10_000,
    single_batch_events=1_000,
    batched_batch_events=5_000,
    latency_s=3,
    scales=[(1_000, None)],
    scale_batch_events=1_000,
    scale_batches=2,
    tiny_batches=2,
    tiny_startup_batches=1,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="a run under 3 minutes")
    size.add_argument("--smoke", action="store_true", help="the smallest run: checks it works")
    parser.add_argument("--rate", type=int, default=10_000, help="latency: events/s offered")
    parser.add_argument("--seconds", type=int, help="latency: how long (default 60, quick 20)")
    parser.add_argument("--per-message", type=int, default=500, help="batched: events/message")
    args = parser.parse_args()
    quick = args.quick
    work = SMOKE if args.smoke else QUICK if quick else FULL
    single_events, batched_events = work.single_events, work.batched_events
    seconds = args.seconds or work.latency_s
    now = int(time.time() * 1000)
    with start_kafka() as kafka, start_redis() as redis_server:
        create_topic(kafka, "single")
        publish(kafka, "single", Traffic(1, 10_000).messages(single_events, 1, now))
        create_topic(kafka, "batched")
        publish(
            kafka, "batched", Traffic(2, 10_000).messages(batched_events, args.per_message, now)
        )
        result: dict[str, Any] = {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()} {os.cpu_count()} cpu, local[2]",
            "quick": quick,
            "smoke": args.smoke,
            "ceiling": {"kafka_python_consume_msgs_per_s": round(bare_consume(kafka, "single"))},
            "stage_costs_one_process": stage_costs(kafka, redis_server, "single"),
        }
        spark = local_spark(EngineSettings())
        try:
            result["fixed_cost"] = fixed_cost(
                spark,
                kafka,
                redis_server,
                batches=work.tiny_batches,
                startup_batches=work.tiny_startup_batches,
            )
            result["single"] = throughput(
                spark,
                kafka,
                redis_server,
                "single",
                events=single_events,
                per_message=1,
                events_per_batch=work.single_batch_events,
            )
            result["batched"] = throughput(
                spark,
                kafka,
                redis_server,
                "batched",
                events=batched_events,
                per_message=args.per_message,
                events_per_batch=work.batched_batch_events,
            )
            # Before scale: its million keys would slow the latency probe's scans of Redis.
            result["latency"] = latency(spark, kafka, redis_server, rate=args.rate, seconds=seconds)
            result["scale"] = [
                scale(
                    spark,
                    kafka,
                    redis_server,
                    clients,
                    args.per_message,
                    touched=touched,
                    batch_events=work.scale_batch_events,
                    batches=work.scale_batches,
                )
                for clients, touched in work.scales
            ]
        finally:
            spark.stop()
    ceiling = result["ceiling"]["kafka_python_consume_msgs_per_s"]
    result["single"]["ratio_to_ceiling"] = round(result["single"]["events_per_s"] / ceiling, 2)
    record("pipeline", result)


if __name__ == "__main__":
    main()
