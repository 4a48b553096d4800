"""Which Spark state store the engine should use: the same workloads on each, in one run.

A shard is one state row of three blobs (``state/shard.py``), rewritten each micro-batch that
touches it. This measures, with real servers (Apache Kafka, Redis) on local[2]:

* ``tiny_batch_ms``: the fixed cost of a micro-batch of 4 events on a warm query (the median of
  ``bench/pipeline.py``'s fixed-cost rounds), where the state store's commit is a large part;
* ``batch_ms_p50`` at ``--clients`` active clients, batches of 100k events (``pipeline.scale``),
  where each commit writes every touched shard's blobs.

Variants: the HDFS-backed store, RocksDB, and RocksDB with changelog checkpointing (only the
changes are uploaded at a commit). After a warm-up query, rounds run every variant, each round
starting with the next one, so a noisy machine slows each alike; the result is one JSON line in
bench/results/state_store.jsonl.

    python bench/state_store.py [--rounds 3] [--clients 100000] [--smoke]

``--smoke``: one round on ``bench/pipeline.py``'s smallest workload (``SMOKE``): what the test
suite runs to keep the script working; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from datetime import UTC, datetime
from typing import Any

from pipeline import (  # bench/ is on sys.path when a script in it runs
    FULL,
    SMOKE,
    fixed_cost,
    scale,
)
from results import record

from streaming.engine.job import local_spark
from streaming.engine.settings import EngineSettings
from streaming.kafka_broker import start_kafka
from streaming.services import start_redis

_PROVIDER = "spark.sql.streaming.stateStore.providerClass"
_CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
_STATE = "org.apache.spark.sql.execution.streaming.state"
VARIANTS: dict[str, dict[str, str]] = {
    "hdfs": {_PROVIDER: f"{_STATE}.HDFSBackedStateStoreProvider", _CHANGELOG: "false"},
    "rocksdb": {_PROVIDER: f"{_STATE}.RocksDBStateStoreProvider", _CHANGELOG: "false"},
    "rocksdb_changelog": {_PROVIDER: f"{_STATE}.RocksDBStateStoreProvider", _CHANGELOG: "true"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the variants")
    parser.add_argument("--clients", type=int, default=100_000, help="active clients")
    parser.add_argument("--smoke", action="store_true", help="the smallest run: checks it works")
    args = parser.parse_args()
    work = SMOKE if args.smoke else FULL
    rounds = 1 if args.smoke else args.rounds
    clients = work.scales[0][0] if args.smoke else args.clients
    tiny_batches = {"batches": work.tiny_batches, "startup_batches": work.tiny_startup_batches}
    tiny: dict[str, list[float]] = {name: [] for name in VARIANTS}
    batch: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with start_kafka() as kafka, start_redis() as redis_server:
        spark = local_spark(EngineSettings())
        try:
            # The session's first queries start the JVM's and the workers' warm-up: not counted
            # (a smoke run counts nothing).
            if not args.smoke:
                fixed_cost(spark, kafka, redis_server, topic="warm-up", **tiny_batches)
            names = list(VARIANTS)
            for round_ in range(rounds):
                # Each round starts with another variant: none always runs first.
                for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                    conf = VARIANTS[name]
                    # Read when a query starts (and kept in its new checkpoint).
                    for key, value in conf.items():
                        spark.conf.set(key, value)
                    # Topics of its own per run: each reads the same kind of events afresh.
                    run = f"{name}-{round_}"
                    costs = fixed_cost(
                        spark, kafka, redis_server, topic=f"tiny-{run}", **tiny_batches
                    )
                    tiny[name].append(costs["tiny_batch_ms"])
                    scaled = scale(
                        spark,
                        kafka,
                        redis_server,
                        clients,
                        500,
                        topic=run,
                        batch_events=work.scale_batch_events,
                        batches=work.scale_batches,
                    )
                    batch[name].append(scaled["batch_ms_p50"])
                    print(name, tiny[name][-1], batch[name][-1], flush=True)
        finally:
            spark.stop()
    result: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, local[2]",
        "smoke": args.smoke,
        "active_clients": clients,
        "variants": {
            name: {
                "tiny_batch_ms": statistics.median(tiny[name]),
                "tiny_batch_ms_all": tiny[name],
                "batch_ms_p50": statistics.median(batch[name]),
                "batch_ms_all": batch[name],
            }
            for name in VARIANTS
        },
    }
    baseline = result["variants"]["hdfs"]
    for variant in result["variants"].values():
        variant["tiny_batch_vs_hdfs"] = round(
            variant["tiny_batch_ms"] / baseline["tiny_batch_ms"], 2
        )
        variant["batch_vs_hdfs"] = round(variant["batch_ms_p50"] / baseline["batch_ms_p50"], 2)
    record("state_store", result)


if __name__ == "__main__":
    main()
