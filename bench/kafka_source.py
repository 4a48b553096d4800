"""Spark's own Kafka source against the engine's, side by side in one run (issue 29).

The engine reads Kafka with a Spark Python data source on kafka-python
(``streaming/engine/kafka_source.py``) that parses, validates, resolves and sums the records in
its read tasks, so raw payloads never cross into the JVM. Spark's own connector
(``spark-sql-kafka-0-10``) reads in the JVM; the engine's first stage would then run on its raw
records in ``mapInArrow``. This measures, on the same topics and machine, in one run:

* ``ceiling.kafka_python_consume_msgs_per_s``: one kafka-python consumer draining the
  single-event topic (the Python source's ceiling, as in ``bench/pipeline.py``);
* ``ceiling.spark_kafka_consume_msgs_per_s``: Spark's connector reading the same topic in a batch
  query that only sums the values' lengths (the JVM source's ceiling; ``local[2]``);
* ``python_source`` / ``spark_source``, for single-event and batched (500 events a message)
  topics: a streaming query (``Trigger.AvailableNow``, one micro-batch, a ``noop`` sink) that
  reads the topic and runs stage 1 (``streaming.engine.stages.staged_batches``): in the Python
  source's reads, or in ``mapInArrow`` over the connector's records. events/s = events / the
  batch's ``triggerExecution``; each is run ``--rounds`` times alternating the two sources after
  a warm-up of both, and the median is reported with every round.

Only stage 1 is measured: what follows it (shards, sink) is the same for either source.

The connector is not served on Maven Central for the pinned pyspark (4.3.0); 4.2.0 is, and
loads under it (``spark_kafka_connector`` in the result says which). ``scripts/kafka/pom.xml``'s
``spark-kafka`` execution fetches it into ``.kafka/spark-kafka`` on first use.

Prints one JSON object and appends it to bench/results/kafka_source.jsonl.

    python bench/kafka_source.py [--quick | --smoke] [--rounds 3]

``--smoke``: one round on ``bench/pipeline.py``'s smallest topics (``SMOKE``): what the test
suite runs to keep the script working; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
from pipeline import CONFIG, QUICK, SMOKE, Traffic, bare_consume, create_topic, publish
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import from_arrow_schema
from results import record  # bench/ is on sys.path when a script in it runs

from streaming.engine.job import local_spark, source_options
from streaming.engine.kafka_source import engine_source
from streaming.engine.settings import EngineSettings
from streaming.engine.shard_layout import ShardLayout
from streaming.engine.source_records import KafkaRecords
from streaming.engine.stages import STAGE_SCHEMA, StageSettings, staged_batches
from streaming.kafka_broker import start_kafka
from streaming.services import LocalService

REPO = Path(__file__).resolve().parent.parent
JARS = REPO / ".kafka" / "spark-kafka"
#: The connector's version (the newest Maven Central serves at or below the pinned pyspark).
CONNECTOR = "4.2.0"


def connector_jars() -> list[Path]:
    """The connector and what it needs, fetched by Maven on first use."""
    if not any(JARS.glob("spark-sql-kafka-0-10_2.13-*.jar")):
        partial_dir = JARS.with_name("spark-kafka.partial")
        subprocess.run(
            [
                "mvn",
                "-q",
                "-B",
                "-f",
                str(REPO / "scripts" / "kafka" / "pom.xml"),
                "dependency:copy@spark-kafka",
                f"-DoutputDirectory={partial_dir}",
            ],
            check=True,
        )
        partial_dir.rename(JARS)
    return sorted(JARS.glob("*.jar"))


def spark_session(jars: list[Path]) -> SparkSession:
    conf = {"spark.jars": ",".join(str(jar) for jar in jars)}
    return local_spark(EngineSettings.model_validate({"spark": {"conf": conf}}))


#: The engine's shards as its query on two cores spreads them.
LAYOUT = ShardLayout(EngineSettings().spark.shards, 2)


def stage_connector_records(
    batches: Iterator[pa.RecordBatch], stage: StageSettings
) -> Iterator[pa.RecordBatch]:
    """Stage 1 over the connector's records: each of its input partitions is one
    topic-partition range, in offset order."""
    for batch in batches:
        if not batch.num_rows:
            continue
        records = KafkaRecords(
            batch.column("topic")[0].as_py(),
            batch.column("partition")[0].as_py(),
            batch.column("offset").to_pylist(),
            batch.column("value").to_pylist(),
            0,
        )
        yield from staged_batches([records], stage, LAYOUT)


def connector_options(kafka: LocalService, topic: str) -> dict[str, str]:
    return {
        "kafka.bootstrap.servers": kafka.address,
        "subscribe": topic,
        "startingOffsets": "earliest",
    }


def connector_ceiling(spark: SparkSession, kafka: LocalService, topic: str, messages: int) -> int:
    """Messages/s of Spark's connector reading ``topic`` whole in one batch query."""
    frame = (
        spark.read.format("kafka")
        .options(**connector_options(kafka, topic))
        .load()
        .selectExpr("count(*) AS records", "sum(length(value)) AS bytes")
    )
    began = time.perf_counter()
    (row,) = frame.collect()
    elapsed = time.perf_counter() - began
    assert row["records"] == messages, row
    return round(messages / elapsed)


def one_stage1_batch(
    spark: SparkSession, kafka: LocalService, topic: str, source: str, stage: StageSettings
) -> int:
    """Milliseconds of the one micro-batch that reads ``topic`` whole and runs stage 1."""
    checkpoint = tempfile.mkdtemp(prefix="bench-source-")
    if source == "python":
        settings = EngineSettings().pointed_at(
            kafka.address, "127.0.0.1", 6379, checkpoint, topics=[topic],
            starting_offsets="earliest", config_topic=None,
        )  # fmt: skip
        # As start_query reads: one read task per core.
        options = source_options(settings.kafka) | {
            "readTasks": str(spark.sparkContext.defaultParallelism)
        }
        reader = engine_source(stage)
        spark.dataSource.register(reader)
        frame = spark.readStream.format(reader.name()).options(**options).load()
    else:
        frame = (
            spark.readStream.format("kafka")
            .options(**connector_options(kafka, topic))
            .load()
            .mapInArrow(
                partial(stage_connector_records, stage=stage), from_arrow_schema(STAGE_SCHEMA)
            )
        )
    query = (
        frame.writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"the {source} source's query failed: {query.exception()}")
    (progress,) = [p for p in query.recentProgress if p["numInputRows"] > 0]
    return int(progress["durationMs"]["triggerExecution"])


def compare(
    spark: SparkSession,
    kafka: LocalService,
    topic: str,
    *,
    events: int,
    rounds: int,
    stage: StageSettings,
    warm_up: bool = True,
) -> dict[str, Any]:
    """Both sources over ``topic``, alternating, after one warm-up each (unless not
    ``warm_up``: a smoke run measures nothing)."""
    for source in ("python", "spark") if warm_up else ():
        one_stage1_batch(spark, kafka, topic, source, stage)
    times: dict[str, list[int]] = {"python": [], "spark": []}
    for _ in range(rounds):
        for source in ("python", "spark"):
            times[source].append(one_stage1_batch(spark, kafka, topic, source, stage))
    result: dict[str, Any] = {"events": events}
    for source, measured in times.items():
        result[f"{source}_source"] = {
            "events_per_s": round(events / (statistics.median(measured) / 1000)),
            "batch_ms": measured,
        }
    result["spark_over_python"] = round(
        result["spark_source"]["events_per_s"] / result["python_source"]["events_per_s"], 2
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller topics, one round")
    size.add_argument("--smoke", action="store_true", help="the smallest run: checks it works")
    parser.add_argument("--rounds", type=int, help="measured rounds per source (default 3)")
    parser.add_argument("--per-message", type=int, default=500, help="batched: events/message")
    args = parser.parse_args()
    if args.smoke or args.quick:
        work = SMOKE if args.smoke else QUICK
        single_events, batched_events = work.single_events, work.batched_events
    else:
        single_events, batched_events = 1_000_000, 5_000_000
    rounds = args.rounds or (1 if args.quick or args.smoke else 3)
    jars = connector_jars()
    now = int(time.time() * 1000)
    with start_kafka() as kafka:
        create_topic(kafka, "single")
        publish(kafka, "single", Traffic(1, 10_000).messages(single_events, 1, now))
        create_topic(kafka, "batched")
        batched_messages = publish(
            kafka, "batched", Traffic(2, 10_000).messages(batched_events, args.per_message, now)
        )
        result: dict[str, Any] = {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()} {os.cpu_count()} cpu, local[2]",
            "quick": args.quick,
            "smoke": args.smoke,
            "spark_kafka_connector": f"spark-sql-kafka-0-10_2.13:{CONNECTOR}",
        }
        spark = spark_session(jars)
        result["pyspark"] = spark.version
        stage = StageSettings.of(EngineSettings(), CONFIG)  # as the engine's query stages
        try:
            connector_ceiling(spark, kafka, "single", single_events)  # the JVM's warm-up
            result["ceiling"] = {
                "kafka_python_consume_msgs_per_s": round(bare_consume(kafka, "single")),
                "spark_kafka_consume_msgs_per_s": connector_ceiling(
                    spark, kafka, "single", single_events
                ),
                "spark_kafka_consume_batched_msgs_per_s": connector_ceiling(
                    spark, kafka, "batched", batched_messages
                ),
            }
            for kind, events in (("single", single_events), ("batched", batched_events)):
                result[kind] = compare(
                    spark,
                    kafka,
                    kind,
                    events=events,
                    rounds=rounds,
                    stage=stage,
                    warm_up=not args.smoke,
                )
        finally:
            spark.stop()
    ceiling = result["ceiling"]
    for kind, source, key in (
        ("single", "python_source", "kafka_python_consume_msgs_per_s"),
        ("single", "spark_source", "spark_kafka_consume_msgs_per_s"),
    ):
        measured = result[kind][source]
        measured["ratio_to_ceiling"] = round(measured["events_per_s"] / ceiling[key], 2)
    record("kafka_source", result)


if __name__ == "__main__":
    main()
