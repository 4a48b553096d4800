"""The engine's Prometheus exporter, on the driver: a registry of its own, served over HTTP.

Where the values come from:

* Each micro-batch's writers return a bounded summary of what they wrote
  (:mod:`streaming.engine.batch_summary`); :meth:`EngineMetrics.record_batch` folds it into the
  exported set (:mod:`streaming.engine.exported_entities`) and the counters.
* Spark's progress events (a listener, :meth:`EngineMetrics.attach`) give the batch duration, the
  rates and the input count.
* The Kafka source's outage clock on the driver comes in a status file
  (``streaming.engine.source_status``), read at scrape time.
* The input backlog is measured at scrape time, outside the query: the events topics' end
  offsets (:class:`KafkaEnds`, a consumer of the exporter's own) minus the offsets Spark's progress
  last reported read. A query stuck inside a micro-batch reports no progress, and nor does an
  idle one; only the backlog tells them apart (the stalled-engine alert needs it).

The names and labels are :mod:`streaming.engine.metric_names`.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from kafka import TopicPartition
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector

from quotastream.clock import SYSTEM_CLOCK, Clock
from quotastream.outage import OutageStatus
from streaming.engine.batch_summary import BatchReport, SummaryRequest
from streaming.engine.exported_entities import ExportedEntities
from streaming.engine.kafka_clients import end_offsets, new_consumer
from streaming.engine.metric_names import (
    BATCH_DURATION,
    BATCH_DURATION_BUCKETS,
    BYTE_RATE,
    CONFIG_VERSION,
    DEAD_LETTER_EVENTS,
    DECISIONS,
    ENTITY_LABELS,
    EVENT_LAG,
    INPUT_BACKLOG,
    INPUT_EVENTS,
    KAFKA_OUTAGE,
    KAFKA_OUTAGES,
    LAST_BATCH_TIMESTAMP,
    METRICS,
    PROCESSED_RECORDS_PER_SECOND,
    QUOTA_LIMIT,
    QUOTA_REQUESTS,
    QUOTA_UTILISATION,
    QUOTAS,
    REDIS_WRITE_FAILURES,
    REMOTE_LOG_SIZE,
    SOURCE_DATA_LOSS,
    THROTTLE_TIME,
    THROTTLED_ENTITIES,
    TIMERS_CANCELLED,
    TIMERS_FIRED,
    TIMERS_PENDING,
    entity_labels,
)
from streaming.engine.offsets import Offsets, checkpoint_offsets, lost_offsets, records_read
from streaming.engine.source_status import read_status

log = logging.getLogger(__name__)


class EngineMetrics:
    """The engine's metrics in a registry of their own, and the exporter serving them."""

    def __init__(
        self,
        top_k: int = 100,
        *,
        host: str = "127.0.0.1",
        port: int = 9464,
        keep_ms: int | None = None,
        clock: Clock = SYSTEM_CLOCK,
        input_ends: Callable[[], Offsets] | None = None,
    ) -> None:
        self.host, self.port = host, port
        self.clock = clock
        #: The events topics' end offsets, asked at scrape time (None: no backlog series).
        self.input_ends = input_ends
        #: The event partitions' next offsets, as of the last progress that reported them.
        self.read_offsets: Offsets = {}
        self.registry = CollectorRegistry(auto_describe=True)
        self.state = ExportedEntities(top_k, keep_ms)
        self._lock = threading.Lock()
        self._server: Any = None
        self._status_dir = tempfile.TemporaryDirectory(prefix="quotastream-metrics-")
        #: Where the query's Kafka source reports its outage clock (``start_query`` passes it).
        self.source_status_file = Path(self._status_dir.name) / "kafka-source.json"
        #: Topics whose records count as input (``attach``); None: every topic of the source.
        self.event_topics: Collection[str] | None = None
        declare = partial(_declared, self.registry)
        self.remote_log_size = declare(
            Gauge, REMOTE_LOG_SIZE, "Remote log size of a partition (Kafka RemoteLogSizeBytes)"
        )
        self.timers_pending = declare(Gauge, TIMERS_PENDING, "Pending throttle timers, all shards")
        self.timers_fired = declare(Counter, TIMERS_FIRED, "Throttle timers fired")
        self.timers_cancelled = declare(Counter, TIMERS_CANCELLED, "Throttle timers cancelled")
        self.dead_letter = declare(Counter, DEAD_LETTER_EVENTS, "Rejected events, by reason")
        self.input_events = declare(Counter, INPUT_EVENTS, "Kafka records read")
        self.requests = declare(
            Counter,
            QUOTA_REQUESTS,
            "Requests the accepted events stood for (their count), by quota",
        )
        for quota in QUOTAS:  # each quota's series from 0, so that rate() sees its first batch
            self.requests.labels(quota=quota)
        self.batch_duration = declare(
            Histogram,
            BATCH_DURATION,
            "Micro-batch trigger execution time",
            buckets=BATCH_DURATION_BUCKETS,
        )
        self.processed_rate = declare(
            Gauge,
            PROCESSED_RECORDS_PER_SECOND,
            "Kafka records the last batch read, per second of its run",
        )
        self.event_lag = declare(
            Gauge,
            EVENT_LAG,
            "Wall clock at write minus the newest event time decided in the last batch",
        )
        self.config_version = declare(
            Gauge, CONFIG_VERSION, "Live configuration version of the newest decision"
        )
        self.last_batch = declare(Gauge, LAST_BATCH_TIMESTAMP, "When the last micro-batch finished")
        self.redis_write_failures = declare(
            Counter, REDIS_WRITE_FAILURES, "Failed Redis write attempts (retried with backoff)"
        )
        self.decisions = declare(
            Counter,
            DECISIONS,
            "Decisions made, by whether Redis needed them (written) or they answer as its key did",
        )
        for written in ("true", "false"):
            self.decisions.labels(written=written)
        self.source_data_loss = declare(
            Counter,
            SOURCE_DATA_LOSS,
            "Times a partition's log restarted below the offsets read (failOnDataLoss=false)",
        )
        registry = self.registry
        registry.register(_EntityCollector(self))
        registry.register(_KafkaOutageCollector(self))
        registry.register(_BacklogCollector(self))

    @classmethod
    def from_settings(
        cls, settings: Any, keep_ms: int | None = None, kafka: Any = None
    ) -> EngineMetrics:
        """From ``EngineSettings.metrics`` (a :class:`streaming.engine.settings.MetricsSettings`);
        with ``kafka`` (``EngineSettings.kafka``) the input backlog is measured too."""
        input_ends = None
        if kafka is not None:
            input_ends = KafkaEnds(kafka.bootstrap_servers, kafka.client_settings(), kafka.topics)
        return cls(
            settings.top_k,
            host=settings.host,
            port=settings.port,
            keep_ms=keep_ms,
            input_ends=input_ends,
        )

    # -- the exporter --
    def serve(self) -> int:
        """Starts the HTTP exporter (a daemon thread); returns its port (port 0: a free one)."""
        server, _ = start_http_server(self.port, addr=self.host, registry=self.registry)
        self._server = server
        self.port = int(server.server_port)
        return self.port

    @property
    def bound_address(self) -> tuple[str, int] | None:
        """(address, port) the exporter listens on; None when not serving."""
        if self._server is None:
            return None
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if isinstance(self.input_ends, KafkaEnds):
            self.input_ends.close()
        self._status_dir.cleanup()

    def scrape(self) -> str:
        """The exposition text, as /metrics serves it."""
        return generate_latest(self.registry).decode()

    # -- inputs --
    def request(self) -> SummaryRequest:
        with self._lock:
            return SummaryRequest(self.state.top_k, self.state.tracked())

    def record_batch(self, rows: Iterable[Mapping[str, Any]], now_ms: int | None = None) -> None:
        """Folds one micro-batch's writer summaries in."""
        report = BatchReport.from_rows(rows)
        now = self.clock.wall_ms() if now_ms is None else now_ms
        with self._lock:
            self.state.fold(report.decisions, now)
            fired, cancelled = self.state.fold_timers(report.timers)
            pending = self.state.timers_pending()
        self.timers_fired.inc(fired)
        self.timers_cancelled.inc(cancelled)
        if report.timers:
            self.timers_pending.set(pending)
        for reason, count in report.rejects.items():
            self.dead_letter.labels(reason=reason).inc(count)
        for quota, count in report.requests.items():
            self.requests.labels(quota=quota).inc(count)
        for (topic, partition), total in report.remote_log.items():
            self.remote_log_size.labels(topic=topic, partition=str(partition)).set(total)
        lag = report.event_lag_s
        if lag is not None:
            self.event_lag.set(lag)
        if report.config_version is not None:
            self.config_version.set(report.config_version)
        self.redis_write_failures.inc(report.redis_failures)
        self.decisions.labels(written="true").inc(report.decisions_written)
        self.decisions.labels(written="false").inc(report.decisions_made - report.decisions_written)

    def record_progress(self, progress: Mapping[str, Any]) -> None:
        """One ``StreamingQueryProgress`` (its JSON form: a dict)."""
        duration_ms = (progress.get("durationMs") or {}).get("triggerExecution")
        if duration_ms is not None:
            self.batch_duration.observe(duration_ms / 1000)
        # Spark's input rows are the source's packs of staged rows, not Kafka records.
        records = sum(
            records_read(source.get("startOffset"), source.get("endOffset"), self.event_topics)
            for source in progress.get("sources") or ()
        )
        self.input_events.inc(records)
        if duration_ms:
            self.processed_rate.set(records / (duration_ms / 1000))
        with self._lock:
            for source in progress.get("sources") or ():
                read = checkpoint_offsets(source.get("endOffset")) or {}
                self.read_offsets.update(
                    (tp, offset)
                    for tp, offset in read.items()
                    if self.event_topics is None or tp[0] in self.event_topics
                )
        for source in progress.get("sources") or ():
            for loss in lost_offsets(source.get("startOffset"), source.get("endOffset")):
                log.warning(
                    "%s-%d: the log restarted at %d below offset %d; records may be lost",
                    loss.topic,
                    loss.partition,
                    loss.end,
                    loss.start,
                )
                self.source_data_loss.labels(topic=loss.topic, partition=str(loss.partition)).inc()
        started = progress.get("timestamp")
        if started is not None:
            began = datetime.fromisoformat(str(started).replace("Z", "+00:00")).timestamp()
            self.last_batch.set(began + (duration_ms or 0) / 1000)
        else:
            self.last_batch.set(self.clock.wall_ms() / 1000)

    def attach(self, spark: Any, query_id: str, event_topics: Collection[str] | None = None) -> Any:
        """Registers a :class:`ProgressListener` for one query; returns it (to remove it).
        ``event_topics``: the topics whose records count as input (not the configuration log)."""
        self.event_topics = event_topics
        listener = _listener(self, query_id)
        spark.streams.addListener(listener)
        return listener

    def entity_series(self, now_ms: int) -> Iterator[Metric]:
        with self._lock:
            exported = self.state.exported(now_ms)
            throttled = self.state.throttled(now_ms)
        rate = GaugeMetricFamily(
            BYTE_RATE, "Bytes/s over Kafka's window (Kafka byte-rate)", labels=ENTITY_LABELS
        )
        limit = GaugeMetricFamily(QUOTA_LIMIT, "Quota, bytes/s", labels=ENTITY_LABELS)
        ratio = GaugeMetricFamily(QUOTA_UTILISATION, "rate / limit", labels=ENTITY_LABELS)
        throttle = GaugeMetricFamily(
            THROTTLE_TIME,
            "Remaining enforced throttle (Kafka throttle-time), seconds",
            labels=ENTITY_LABELS,
        )
        for decision in exported:
            labels = entity_labels(decision.quota, decision.entity)
            rate.add_metric(labels, decision.rate)
            throttle.add_metric(labels, decision.throttle_ms_at(now_ms) / 1000)
            share = decision.utilisation
            if decision.limit is not None and share is not None:
                limit.add_metric(labels, decision.limit)
                ratio.add_metric(labels, share)
        counts = GaugeMetricFamily(
            THROTTLED_ENTITIES, "Entities throttled now (enforced)", labels=["quota"]
        )
        for quota, count in throttled.items():
            counts.add_metric([quota], count)
        yield from (rate, limit, ratio, throttle, counts)


_Instrument = TypeVar("_Instrument", Gauge, Counter, Histogram)


def _declared(
    registry: CollectorRegistry,
    kind: type[_Instrument],
    name: str,
    documentation: str,
    **options: Any,
) -> _Instrument:
    """One of the exporter's own metrics, with the type and labels :data:`METRICS` gives it."""
    declared_kind, labels = METRICS[name]
    if kind.__name__.lower() != declared_kind:
        raise TypeError(f"{name} is a {declared_kind} in METRICS, not a {kind.__name__}")
    return kind(name, documentation, labels, registry=registry, **options)


class _EntityCollector(Collector):
    """The per-entity series and the throttled counts, computed at scrape time."""

    def __init__(self, metrics: EngineMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return list(self._metrics.entity_series(self._metrics.clock.wall_ms()))

    def describe(self) -> Iterable[Metric]:
        names = (BYTE_RATE, QUOTA_LIMIT, QUOTA_UTILISATION, THROTTLE_TIME, THROTTLED_ENTITIES)
        return [GaugeMetricFamily(name, "", labels=METRICS[name][1]) for name in names]


class _KafkaOutageCollector(Collector):
    """The source's outage clock, from its status file (no file yet: no outage so far)."""

    def __init__(self, metrics: EngineMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        status = read_status(self._metrics.source_status_file) or OutageStatus(None, 0, 0)
        now_ms = self._metrics.clock.wall_ms()
        lasted = 0.0 if status.since_ms is None else max((now_ms - status.since_ms) / 1000, 0.0)
        outage = GaugeMetricFamily(
            KAFKA_OUTAGE,
            "How long the Kafka source has found the brokers unreachable (0: they answer)",
            value=lasted,
        )
        outages = CounterMetricFamily(
            KAFKA_OUTAGES,
            "Kafka outages the source has waited out or is waiting out",
            value=status.outages,
        )
        return [outage, outages]

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(KAFKA_OUTAGE, ""), CounterMetricFamily(KAFKA_OUTAGES, "")]


class _BacklogCollector(Collector):
    """Records in the events topics the query has not read yet: end offsets now, asked of Kafka,
    minus the offsets last read. Absent until a progress reports offsets read, and while Kafka
    does not answer (``quotastream_kafka_outage_seconds`` covers that)."""

    def __init__(self, metrics: EngineMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        metrics = self._metrics
        with metrics._lock:
            read = dict(metrics.read_offsets)
        if metrics.input_ends is None or not read:
            return []
        try:
            ends = metrics.input_ends()
        except Exception as error:  # a scrape answers what it can; the source reports outages
            log.debug("input backlog not measured: %s", error)
            return []
        backlog = sum(max(end - read.get(tp, 0), 0) for tp, end in ends.items())
        return [
            GaugeMetricFamily(
                INPUT_BACKLOG,
                "Records in the events topics not read yet (end offsets minus offsets read)",
                value=backlog,
            )
        ]

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(INPUT_BACKLOG, "")]


class KafkaEnds:
    """The events topics' end offsets, asked of Kafka with a consumer of the exporter's own.

    Outside the query on purpose: a query stuck in a micro-batch polls nothing, so only a
    separate reader sees input arriving meanwhile. One request per scrape, each bounded by
    ``timeout_ms``; scrapes are serialised (one consumer is not thread-safe).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        client: Mapping[str, Any],
        topics: Collection[str],
        timeout_ms: int = 2_000,
    ) -> None:
        self._bootstrap_servers = bootstrap_servers
        self._client = dict(client)
        self._topics = list(topics)
        self._timeout_ms = timeout_ms
        self._consumer: Any = None
        self._lock = threading.Lock()

    def __call__(self) -> Offsets:
        with self._lock:
            if self._consumer is None:
                self._consumer = new_consumer(
                    self._bootstrap_servers, self._client, self._timeout_ms
                )
            partitions = [
                TopicPartition(topic, partition)
                for topic in self._topics
                for partition in sorted(self._consumer.partitions_for_topic(topic) or ())
            ]
            return end_offsets(self._consumer, partitions, self._timeout_ms)

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None


def _listener(metrics: EngineMetrics, query_id: str) -> Any:
    # Imported here: the executors load this module for BatchSummary, without the listener.
    from pyspark.sql.streaming.listener import (  # noqa: PLC0415
        QueryIdleEvent,
        QueryProgressEvent,
        QueryStartedEvent,
        QueryTerminatedEvent,
        StreamingQueryListener,
    )

    class ProgressListener(StreamingQueryListener):
        """Spark's progress of one query into the batch metrics (on Spark's listener bus)."""

        def onQueryStarted(self, event: QueryStartedEvent) -> None:  # noqa: N802
            pass

        def onQueryProgress(self, event: QueryProgressEvent) -> None:  # noqa: N802
            progress = event.progress
            if str(progress.id) != query_id:
                return
            try:
                metrics.record_progress(progress)  # a dict since PySpark 4
            except Exception:  # a metrics bug must not disturb the listener bus
                log.exception("could not record a progress event")

        def onQueryIdle(self, event: QueryIdleEvent) -> None:  # noqa: N802
            pass

        def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:  # noqa: N802
            pass

    return ProgressListener()
