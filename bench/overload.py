"""Overload: twice the rate the query is allowed to sustain, then silence, on local Spark.

The query reads at most ``--cap`` messages per micro-batch (``maxOffsetsPerTrigger``) every
trigger (1 s), so it sustains ``cap x events_per_message`` events/s; traffic is offered at twice
that for ``--seconds``, then stops. Sampled every ``--sample-s`` (5 s): the records each batch
read (bounded by the cap), the backlog (the topic's end minus what the query has read), the
exporter's ``quotastream_event_lag_seconds``, and the memory of the driver JVM and the Python
workers. Prints one JSON object and appends it to bench/results/overload.jsonl.

    python bench/overload.py [--cap 100] [--events-per-message 100] [--seconds 120] [--sample-s 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from pipeline import CONFIG, PARTITIONS, Traffic, create_topic
from pipeline import settings as engine_settings
from processes import descendants_by_party, rss_mb
from results import record  # bench/ is on sys.path when a script in it runs

from streaming.engine.exporter import EngineMetrics
from streaming.engine.job import local_spark, start_query
from streaming.engine.metric_names import EVENT_LAG
from streaming.engine.offsets import records_read
from streaming.kafka_broker import start_kafka
from streaming.services import LocalService, start_redis

TOPIC = "overload"


def offer(
    kafka: LocalService,
    per_s: int,
    per_message: int,
    seconds: float,
    traffic: Callable[[int, int, int], Iterator[bytes]] | None = None,
) -> threading.Thread:
    """Publishes ``per_s`` messages/s of ``per_message`` events each for ``seconds``; the
    messages are ``traffic(events, per_message, now_ms)``'s (by default :class:`Traffic`'s over
    10k clients)."""

    def run() -> None:
        messages = traffic or Traffic(seed=9, clients=10_000).messages
        # Batched as a high-throughput client would: with kafka-python's 16 KiB batches, a
        # message of 500 events (~47 KB) went in a batch of its own, and the producer and the
        # broker used ~0.1 core more each at 100k events/s (bench/keep_up.py).
        out = KafkaProducer(
            bootstrap_servers=kafka.address, linger_ms=100, batch_size=1_048_576, acks=1
        )
        began = time.monotonic()
        sent = 0
        while (elapsed := time.monotonic() - began) < seconds:
            now = int(time.time() * 1000)
            due = (int(elapsed * per_s) - sent) * per_message
            for message in messages(due, per_message, now):
                out.send(TOPIC, message, partition=sent % PARTITIONS)
                sent += 1
            time.sleep(0.02)
        out.flush()
        out.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def topic_end(kafka: LocalService) -> int:
    consumer = KafkaConsumer(bootstrap_servers=kafka.address)
    partitions = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    end: int = sum(consumer.end_offsets(partitions).values())
    consumer.close()
    return end


def read_so_far(query: Any) -> int:
    """The records of the topic the query has read (its last batch's end offsets)."""
    progress = query.lastProgress
    if not progress:
        return 0
    return records_read(None, progress["sources"][0]["endOffset"], [TOPIC])


def scrape(port: int, name: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


def memory() -> dict[str, int]:
    """Resident memory of Spark's JVM and of its Python workers."""
    parties = descendants_by_party()
    return {
        "jvm_mb": round(sum(rss_mb(pid) for pid in parties["spark_jvm"])),
        "python_workers_mb": round(sum(rss_mb(pid) for pid in parties["python_workers"])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=int, default=100, help="messages per micro-batch")
    parser.add_argument("--events-per-message", type=int, default=100)
    parser.add_argument("--seconds", type=int, default=120)
    parser.add_argument("--sample-s", type=float, default=5.0, help="seconds between samples")
    args = parser.parse_args()
    per_message = args.events_per_message
    sustained = args.cap * per_message  # events/s: one capped batch per 1 s trigger
    with start_kafka() as kafka, start_redis() as redis_server:
        create_topic(kafka, TOPIC)
        settings = engine_settings(
            kafka, redis_server, TOPIC, trigger_ms=1000, max_offsets=args.cap
        )
        spark = local_spark(settings)
        metrics = EngineMetrics(port=0)
        port = metrics.serve()
        query = start_query(spark, settings, CONFIG, metrics=metrics)
        began = time.monotonic()
        load = offer(kafka, 2 * args.cap, per_message, args.seconds)
        samples: list[dict[str, Any]] = []
        caught_up_s = None
        try:
            while time.monotonic() - began < args.seconds * 4:
                time.sleep(args.sample_s)
                if not query.isActive:
                    raise RuntimeError(f"the query stopped: {query.exception()}")
                batches = [
                    records_read(
                        p["sources"][0]["startOffset"], p["sources"][0]["endOffset"], [TOPIC]
                    )
                    for p in query.recentProgress
                ]
                backlog = topic_end(kafka) - read_so_far(query)
                samples.append(
                    {
                        "t_s": round(time.monotonic() - began),
                        "offering": load.is_alive(),
                        "backlog_messages": backlog,
                        "largest_batch_messages": max(batches, default=0),
                        "event_lag_s": scrape(port, EVENT_LAG),
                        **memory(),
                    }
                )
                print(samples[-1], flush=True)
                if not load.is_alive() and backlog == 0:
                    caught_up_s = samples[-1]["t_s"] - args.seconds
                    break
        finally:
            query.stop()
            metrics.close()
            spark.stop()
    offering = [s for s in samples if s["offering"]]
    # A run shorter than a sample (a smoke run on a busy machine) has only samples after it.
    steady = offering[len(offering) // 4 :] or samples
    record(
        "overload",
        {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()} {os.cpu_count()} cpu, local[2]",
            "sustained_events_per_s": sustained,
            "offered_events_per_s": 2 * sustained,
            "offered_seconds": args.seconds,
            "cap_messages_per_batch": args.cap,
            "largest_batch_messages": max(s["largest_batch_messages"] for s in samples),
            "peak_backlog_messages": max(s["backlog_messages"] for s in samples),
            "peak_event_lag_s": max(s["event_lag_s"] or 0 for s in samples),
            "jvm_mb": {"early": steady[0]["jvm_mb"], "late": steady[-1]["jvm_mb"]},
            "python_workers_mb": {
                "early": steady[0]["python_workers_mb"],
                "late": steady[-1]["python_workers_mb"],
            },
            "caught_up_s_after_offer": caught_up_s,
            "samples": samples,
        },
    )


if __name__ == "__main__":
    main()
