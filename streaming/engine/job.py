"""The streaming query: Kafka -> validate and resolve -> sharded quota state -> Redis.

::

    quotastream-kafka source (offsets in the checkpoint); each read task, on its executor,
      stages its records: validate, resolve entity, sum per (entity, sample) (staged_batches)
      and packs them per shard: one Arrow stream per staging and shard   (packed_by_shard)
      -> groupBy(shard).applyInPandasWithState: update_shard    one state value per shard,
                                                  its output rows packed as one Arrow stream
      -> foreachBatch: mapInArrow(write_packed) on the executors  -> Redis, dead-letter topic
                       (with metrics: a bounded summary back to the driver -> Prometheus)

A record crosses from Python into the JVM once, already summed: the source's rows are packed
usage sums and rejects, never raw payloads, and Spark never converts them row by row.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import astuple
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
import pyspark
from kafka import KafkaConsumer
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from state.config import QuotaConfig
from state.shard import ShardState
from streaming.class_archive import sharing_options
from streaming.engine.checkpoint_files import choose_file_manager
from streaming.engine.client_settings import settings_for
from streaming.engine.config_log import ConfigLog, ConfigSource
from streaming.engine.exporter import EngineMetrics
from streaming.engine.kafka_source import engine_source
from streaming.engine.settings import EngineSettings, KafkaSettings
from streaming.engine.sinks import WRITE_COUNTS, WRITE_SUMMARY, SinkSettings, write_packed
from streaming.engine.stages import (
    PACKED_SCHEMA,
    StageSettings,
    shard_rows,
    update_shard,
)
from streaming.engine.worker_heap import ALLOCATOR_ENV, freeze_imports

log = logging.getLogger(__name__)

STATE_SCHEMA = "tables binary, timers binary, remote_log binary, written binary"


def local_spark(settings: EngineSettings, app_name: str = "quotastream") -> SparkSession:
    """A Spark session for the engine; workers run this interpreter (where quotastream is).

    Quiet as shipped: the driver logs through ``streaming/engine/log4j2.properties`` (WARN, without
    the loggers that report a normal run and stop), no console progress bars, and the Python workers
    do not print pandas' FutureWarning about PySpark's own padding of applyInPandasWithState output
    (``pyspark/worker.py``; the engine's own frames avoid the deprecated case). A local master binds
    loopback: nothing outside this machine talks to it, and Spark warns otherwise.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if settings.spark.master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    conf = dict(settings.spark.conf)
    # Stopping a query whose foreachBatch is running overflowed the default thread stack.
    sharing = sharing_options(driver_class_archive())
    java_options = " ".join(["-Xss16m", f"-Dlog4j2.configurationFile={LOG4J_CONFIG}", *sharing])
    # Options of the operator's own come after the engine's, so theirs win.
    own_options = conf.pop("spark.driver.extraJavaOptions", "")
    builder: Any = (
        SparkSession.builder.master(settings.spark.master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # Streaming plans do not adapt; Spark warns for each query that asks them to.
        .config("spark.sql.adaptive.enabled", "false")
        # Each shard is one state value (a blob): a handful of large values, which the
        # in-memory store commits in a third of RocksDB's time (docs/streaming.md).
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
        )
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.extraJavaOptions", f"{java_options} {own_options}".strip())
        .config("spark.executorEnv.PYTHONWARNINGS", _NOT_OUR_WARNINGS)
    )
    for name, value in ALLOCATOR_ENV.items():
        builder = builder.config(f"spark.executorEnv.{name}", value)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark: SparkSession = builder.getOrCreate()
    return spark


def driver_class_archive() -> Path:
    """Where ``scripts/bootstrap --test-tools`` keeps the class-data archive of the driver's JVM
    (:mod:`streaming.class_archive`): in this environment, named by the pyspark release whose
    jars it holds."""
    return Path(sys.prefix) / f"spark-driver-{pyspark.__version__}.jsa"


#: The driver's log configuration that :func:`local_spark` passes to the JVM.
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")
#: PYTHONWARNINGS for the Python workers: a FutureWarning that PySpark's own worker code raises
#: at each applyInPandasWithState output (pandas deprecates its concatenation of an empty padding
#: frame); the engine's frames are not the cause, and the worker prints it once per process.
_NOT_OUR_WARNINGS = (
    "ignore:The behavior of DataFrame concatenation with empty or all-NA entries"
    ":FutureWarning:pyspark.worker"
)


def start_query(
    spark: SparkSession,
    settings: EngineSettings,
    config: QuotaConfig,
    *,
    available_now: bool = False,
    query_name: str = "quotastream",
    metrics: EngineMetrics | None = None,
    graceful_stop: GracefulStop | None = None,
) -> StreamingQuery:
    """Starts the query; with ``metrics``, each micro-batch and Spark's progress update them;
    with ``graceful_stop``, :meth:`GracefulStop.stop` can stop it between micro-batches.

    The exporter is not started here: :func:`streaming.commands.run.run` starts it once per process.
    """
    kafka = settings.kafka
    options = source_options(kafka)
    if metrics is not None:
        options["statusFile"] = str(metrics.source_status_file)
    # One read task and one state task per core: each costs a Python round trip per batch.
    cores = spark.sparkContext.defaultParallelism
    options["readTasks"] = str(cores)
    live_configs = None
    if kafka.config_topic is not None:
        _check_config_log(settings, config)
        live_configs = ConfigSource(
            config,
            kafka.bootstrap_servers,
            kafka.config_topic,
            kafka.client_settings(),
            max_outage_s=kafka.max_outage_s,
        )
    stage = StageSettings.of(settings, config, live_configs)
    # Shards wake up for their throttle timers in batches without data; a run that stops when
    # the input is read (available-now) must not wait for timers, so it runs none.
    spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", str(not available_now).lower())
    # Taken by a new checkpoint only; a restarted query keeps the count it began with, and the
    # shard layout spread over it (streaming/engine/shard_layout.py), which the source pins.
    state_tasks = settings.spark.state_tasks(cores)
    spark.conf.set("spark.sql.shuffle.partitions", str(state_tasks))
    options["shards"] = str(settings.spark.shards)
    options["stateTasks"] = str(state_tasks)
    choose_file_manager(spark, settings.spark.checkpoint, settings.spark.conf)
    source = engine_source(stage)
    spark.dataSource.register(source)
    staged = spark.readStream.format(source.name()).options(**options).load()
    decided = staged.groupBy("shard").applyInPandasWithState(
        partial(_update_group, stage=stage),
        outputStructType=from_arrow_schema(PACKED_SCHEMA),
        stateStructType=STATE_SCHEMA,
        outputMode="Update",
        timeoutConf=GroupStateTimeout.ProcessingTimeTimeout,
    )
    # The sink publishes the configuration decisions are made with, for agents.
    sink = SinkSettings.of(settings, live_configs or ConfigSource(config))
    writer = (
        decided.writeStream.queryName(query_name)
        .outputMode("update")
        .foreachBatch(
            partial(_write_batch, sink=sink, metrics=metrics, graceful_stop=graceful_stop)
        )
        .option("checkpointLocation", settings.spark.checkpoint)
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{settings.spark.trigger_ms} milliseconds")
    query = writer.start()
    if metrics is not None:
        metrics.attach(spark, str(query.id), event_topics=kafka.topics)
    return query


def source_options(kafka: KafkaSettings) -> dict[str, str]:
    """The Kafka source's options (``streaming/engine/offsets.py``), client settings as ``kafka.*``
    (``security_protocol`` -> ``kafka.security.protocol``); holds secrets: never log it."""
    options = {
        "kafka.bootstrap.servers": kafka.bootstrap_servers,
        "subscribe": ",".join(kafka.topics),
        "startingOffsets": kafka.starting_offsets,
        "failOnDataLoss": str(kafka.fail_on_data_loss).lower(),
        "maxOutageSeconds": repr(kafka.max_outage_s),
    }
    if kafka.max_offsets_per_trigger:
        options["maxOffsetsPerTrigger"] = str(kafka.max_offsets_per_trigger)
    if kafka.config_topic is not None:
        options["configTopic"] = kafka.config_topic
    for name, value in settings_for(KafkaConsumer, kafka.client_settings()).items():
        options[f"kafka.{name.replace('_', '.')}"] = str(value)
    return options


def _check_config_log(settings: EngineSettings, config: QuotaConfig) -> None:
    """Creates the configuration log if needed and reports changes it cannot apply."""
    kafka = settings.kafka
    assert kafka.config_topic is not None
    config_log = ConfigLog(kafka.bootstrap_servers, kafka.config_topic, kafka.client_settings())
    try:
        config_log.ensure_topic()
        live = config_log.current(config)
    finally:
        config_log.close()
    log.info("live configuration: version %d from %s", live.version, kafka.config_topic)
    for skipped in live.skipped:
        log.warning("config version %d is skipped: %s", skipped.version, skipped.reason)


def _update_group(
    key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: GroupState, stage: StageSettings
) -> Iterator[pd.DataFrame]:
    freeze_imports()
    packed = [] if state.hasTimedOut else [blob for frame in frames for blob in frame["rows"]]
    rows = shard_rows(packed)
    # The batch's time, kept in the checkpoint: a replayed batch fires the same timers.
    now_ms = int(state.getCurrentProcessingTimeMs())
    previous = ShardState(*state.get) if state.exists else None
    update = update_shard(previous, rows, stage, int(key[0]), now_ms)
    if update.state is not None:
        state.update(astuple(update.state))
    if update.wake_at_ms is not None:
        state.setTimeoutDuration(max(update.wake_at_ms - now_ms, 1))
    yield update.packed()


def _write_batch(
    batch: DataFrame,
    batch_id: int,
    sink: SinkSettings,
    metrics: EngineMetrics | None = None,
    graceful_stop: GracefulStop | None = None,
) -> None:
    if graceful_stop is None:
        _write(batch, batch_id, sink, metrics)
        return
    with graceful_stop.batch(batch):
        _write(batch, batch_id, sink, metrics)


def _write(
    batch: DataFrame, batch_id: int, sink: SinkSettings, metrics: EngineMetrics | None
) -> None:
    # Written from the executors; only the counts (or the bounded metrics summary, at most
    # top_k rows per quota and Arrow batch plus the tracked entities) come back to the driver.
    if metrics is None:
        batch.mapInArrow(
            partial(write_packed, settings=sink), from_arrow_schema(WRITE_COUNTS)
        ).collect()
        return
    written = batch.mapInArrow(
        partial(write_packed, settings=sink, summary=metrics.request()),
        from_arrow_schema(WRITE_SUMMARY),
    ).collect()
    try:
        metrics.record_batch(row.asDict() for row in written)
    except Exception:  # the batch is written: a metrics bug must not fail the query
        log.exception("batch %d: could not record its metrics", batch_id)


class GracefulStop:
    """Stops a query between micro-batches, not inside one.

    ``StreamingQuery.stop()`` cancels the running batch's job and interrupts the query's thread:
    its tasks are killed, the Python callback that waits for them fails with the JVM's
    ``InterruptedException`` (logged with both stack traces), and the work is lost. A batch's
    work all runs inside its foreachBatch callback (the plan is lazy until the write collects
    it), which runs here, in the driver's Python: so :meth:`stop` waits until no callback runs,
    then until the query sleeps, and only then calls ``stop()``, whose interrupt ends a sleep
    quietly (an interrupt during the batch's checkpoint writes, which follow the callback, makes
    Hadoop log a stack trace). It sleeps either until its next trigger, or, if the next batch
    started, in that batch's callback: a callback that starts after the stop was asked for does
    not start its job but sleeps in the JVM, on the query's own thread (PySpark runs a callback's
    JVM calls on the thread that called it). Were the JVM calls not pinned so, that sleep ends by
    itself and the batch runs as usual: slower to stop, never wrong.
    """

    #: How long a callback that starts during a stop waits for the interrupt.
    HOLD_MS = 10_000

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._writing = False
        self._holding = False
        self._stopping = False

    @contextlib.contextmanager
    def batch(self, batch: DataFrame) -> Iterator[None]:
        with self._changed:
            self._holding = self._stopping
        if self._holding:  # not a write yet: the stop need not wait for it
            jvm: Any = batch.sparkSession.sparkContext._jvm
            try:
                jvm.java.lang.Thread.sleep(self.HOLD_MS)
            finally:
                self._holding = False
        with self._changed:
            self._writing = True
        try:
            yield
        finally:
            with self._changed:
                self._writing = False
                self._changed.notify_all()

    def stop(self, query: StreamingQuery, timeout_s: float = 30.0) -> None:
        """Waits up to ``timeout_s`` for the running batch to be written, then stops the query.

        After the timeout it stops the query inside the batch, as ``stop()`` alone would (the
        batch is then replayed from the checkpoint on the next start).
        """
        deadline = time.monotonic() + timeout_s
        with self._changed:
            self._stopping = True
            while self._writing and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(left)
        while time.monotonic() < deadline and not self._asleep(query):
            time.sleep(0.02)
        with _quiet_interrupted_callbacks():
            query.stop()

    def _asleep(self, query: StreamingQuery) -> bool:
        """Waiting for its next trigger, or holding in a callback.

        Not while its sources start ("Initializing sources", no trigger active yet): stopped
        then, Spark closes the Python source's runner while that still waits for its first
        call, and the runner prints a traceback writing its error to the closed socket."""
        status = query.status
        started = status["message"] != "Initializing sources"
        return self._holding or (started and not status["isTriggerActive"])


class _InterruptedCallback(logging.Filter):
    """Drops py4j's error report of a Python callback that ``stop()`` interrupted."""

    def filter(self, record: logging.LogRecord) -> bool:
        failure = record.exc_info[1] if record.exc_info else None
        return "java.lang.InterruptedException" not in str(failure)


@contextlib.contextmanager
def _quiet_interrupted_callbacks() -> Iterator[None]:
    # py4j logs every exception of a callback at ERROR, with the Python and Java stack traces;
    # an interrupt during a stop is how Spark stops a query, not an error.
    logger = logging.getLogger("py4j.clientserver")
    quiet = _InterruptedCallback()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)
