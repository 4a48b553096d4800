"""The engine's Prometheus metrics: their names, the bounded per-entity set, the exporter.

The names and labels below are the contract with the alerting rules and the dashboards
(``docs/metrics.md``); :data:`METRICS` lists every one with its type and labels.

Where the values come from:

* Each micro-batch's writer (:func:`streaming.sinks.write_batches`, on the executors) returns a
  small :data:`SUMMARY_SCHEMA` table besides writing Redis: the decision rows that could be
  exported (per Arrow batch, the ``top_k`` per quota by utilisation, every throttled one, and
  every one the driver tracks already), rejects by reason, requests by quota, timer counts per
  shard, remote log totals per partition, and the newest event time. :class:`BatchSummary`
  builds it.
* The driver folds it into a :class:`MetricsState` (plain Python, no Prometheus): each tracked
  entity's latest decision, and the exported set, the ``top_k`` per quota plus every entity
  throttled now. Entities that leave the set are forgotten, so their series disappear.
* Spark's progress events (:class:`ProgressListener`) give the batch duration, the rates and the
  input count.
* The Kafka source's outage clock on the driver comes in a status file
  (``streaming.source_status``), read at scrape time.
* The input backlog is measured at scrape time, outside the query: the events topics' end
  offsets (:class:`KafkaEnds`, a consumer of the exporter's own) minus the offsets Spark's progress
  last reported read. A query stuck inside a micro-batch reports no progress, and nor does an
  idle one; only the backlog tells them apart (the stalled-engine alert needs it).

:class:`EngineMetrics` owns a dedicated registry (not the process-global one) and serves it.
"""

from __future__ import annotations

import heapq
import json
import logging
import math
import tempfile
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from kafka import TopicPartition
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector

from quotastream.client import remaining_throttle_ms
from quotastream.outage import OutageStatus
from state.entities import parse_entity_key
from state.live_config import Mode
from state.quota_types import QuotaType
from streaming import stages
from streaming.kafka_clients import new_consumer, true_end_offsets
from streaming.offsets import Offsets, checkpoint_offsets, lost_offsets, records_read
from streaming.source_status import read_status

log = logging.getLogger(__name__)

# --- The contract: metric names (docs/metrics.md) -------------------------------------------
BYTE_RATE = "quotastream_byte_rate"
QUOTA_LIMIT = "quotastream_quota_limit"
QUOTA_UTILISATION = "quotastream_quota_utilisation_ratio"
THROTTLE_TIME = "quotastream_throttle_time_seconds"
THROTTLED_ENTITIES = "quotastream_throttled_entities"
REMOTE_LOG_SIZE = "quotastream_remote_log_size_bytes"
TIMERS_PENDING = "quotastream_timers_pending"
TIMERS_FIRED = "quotastream_timers_fired_total"
TIMERS_CANCELLED = "quotastream_timers_cancelled_total"
DEAD_LETTER_EVENTS = "quotastream_dead_letter_events_total"
INPUT_EVENTS = "quotastream_input_events_total"
QUOTA_REQUESTS = "quotastream_requests_total"
BATCH_DURATION = "quotastream_batch_duration_seconds"
INPUT_ROWS_PER_SECOND = "quotastream_input_rows_per_second"
PROCESSED_ROWS_PER_SECOND = "quotastream_processed_rows_per_second"
EVENT_LAG = "quotastream_event_lag_seconds"
CONFIG_VERSION = "quotastream_config_version"
LAST_BATCH_TIMESTAMP = "quotastream_last_batch_timestamp_seconds"
REDIS_WRITE_FAILURES = "quotastream_redis_write_failures_total"
SOURCE_DATA_LOSS = "quotastream_source_data_loss_total"
KAFKA_OUTAGE = "quotastream_kafka_outage_seconds"
KAFKA_OUTAGES = "quotastream_kafka_outages_total"
INPUT_BACKLOG = "quotastream_input_backlog_records"

#: Kafka's own names for the parts of an entity key (its metric tags, and the broker, topic and
#: partition of broker quotas), as labels: entity key part -> label. They repeat what ``entity``
#: says, so that ``sum by (user)`` works; they add no series (each is a function of ``entity``).
KAFKA_LABELS = {
    "user": "user",
    "client-id": "client_id",
    "broker": "broker",
    "topic": "topic",
    "partition": "partition",
}

#: Labels of the per-entity series; a Kafka label the entity does not have is empty.
ENTITY_LABELS = ("quota", "entity", *KAFKA_LABELS.values())

#: Every metric: name -> (type, labels). Counters are named with their ``_total`` suffix as
#: exposed; a histogram also exposes ``_bucket``, ``_sum`` and ``_count``.
METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    BYTE_RATE: ("gauge", ENTITY_LABELS),
    QUOTA_LIMIT: ("gauge", ENTITY_LABELS),
    QUOTA_UTILISATION: ("gauge", ENTITY_LABELS),
    THROTTLE_TIME: ("gauge", ENTITY_LABELS),
    THROTTLED_ENTITIES: ("gauge", ("quota",)),
    REMOTE_LOG_SIZE: ("gauge", ("topic", "partition")),
    TIMERS_PENDING: ("gauge", ()),
    TIMERS_FIRED: ("counter", ()),
    TIMERS_CANCELLED: ("counter", ()),
    DEAD_LETTER_EVENTS: ("counter", ("reason",)),
    INPUT_EVENTS: ("counter", ()),
    QUOTA_REQUESTS: ("counter", ("quota",)),
    BATCH_DURATION: ("histogram", ()),
    INPUT_ROWS_PER_SECOND: ("gauge", ()),
    PROCESSED_ROWS_PER_SECOND: ("gauge", ()),
    EVENT_LAG: ("gauge", ()),
    CONFIG_VERSION: ("gauge", ()),
    LAST_BATCH_TIMESTAMP: ("gauge", ()),
    REDIS_WRITE_FAILURES: ("counter", ()),
    SOURCE_DATA_LOSS: ("counter", ("topic", "partition")),
    KAFKA_OUTAGE: ("gauge", ()),
    KAFKA_OUTAGES: ("counter", ()),
    INPUT_BACKLOG: ("gauge", ()),
}

#: The quota label's values.
QUOTAS = tuple(quota.value for quota in QuotaType)

#: Micro-batch durations (seconds): a 1 s trigger and its usual spread.
BATCH_DURATION_BUCKETS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)

_ENFORCED = Mode.ENFORCED.value


# --- Decisions and the exported set (pure) ---------------------------------------------------
@dataclass(frozen=True)
class EntityDecision:
    """The fields of one written decision that the per-entity series need."""

    quota: str
    entity: str
    rate: float
    limit: float | None  # None: unlimited
    throttle_ms: int
    until: int
    released_at: int | None
    mode: str
    ts: int

    @property
    def key(self) -> tuple[str, str]:
        return (self.quota, self.entity)

    @property
    def utilisation(self) -> float | None:
        """rate / limit; None when unlimited."""
        return utilisation(self.rate, self.limit)

    def throttle_ms_at(self, now_ms: int) -> int:
        """The enforced throttle remaining at ``now_ms`` (0 when released or not enforced)."""
        return remaining_throttle_ms(self.until, self.released_at, self.mode == _ENFORCED, now_ms)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> EntityDecision:
        limit = row.get("limit")
        return cls(
            quota=str(row["quota"]),
            entity=str(row["entity"]),
            rate=float(row["rate"]),
            limit=None if limit is None or not math.isfinite(limit) else float(limit),
            throttle_ms=int(row["throttle_ms"]),
            until=int(row["until"]),
            released_at=None if row.get("released_at") is None else int(row["released_at"]),
            mode=str(row["mode"]),
            ts=int(row["ts"]),
        )


def entity_labels(quota: str, entity: str) -> list[str]:
    """The values of :data:`ENTITY_LABELS` for one entity's series."""
    parts = parse_entity_key(entity)
    return [quota, entity, *(parts.get(part, "") for part in KAFKA_LABELS)]


def utilisation(rate: float, limit: float | None) -> float | None:
    """rate / limit; None when unlimited (no limit, NaN or infinite)."""
    if limit is None or not 0 < limit < math.inf:
        return None
    return rate / limit


def rank_key(rate: float, limit: float | None) -> tuple[float, float]:
    """Order of the top-k: utilisation first; unlimited entities after every limited one."""
    ratio = utilisation(rate, limit)
    return (-1.0 if ratio is None else ratio, rate)


def rank(decision: EntityDecision) -> tuple[float, float]:
    return rank_key(decision.rate, decision.limit)


def select(
    decisions: Iterable[EntityDecision], top_k: int, now_ms: int
) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(the top ``top_k`` per quota by :func:`rank`, the entities throttled at ``now_ms``)."""
    by_quota: dict[str, list[EntityDecision]] = {}
    throttled: set[tuple[str, str]] = set()
    for decision in decisions:
        by_quota.setdefault(decision.quota, []).append(decision)
        if decision.throttle_ms_at(now_ms) > 0:
            throttled.add(decision.key)
    top = {
        decision.key
        for group in by_quota.values()
        for decision in heapq.nlargest(top_k, group, key=rank)
    }
    return top, throttled


@dataclass
class MetricsState:
    """What the driver knows: the latest decision of each entity it exports or counts.

    Kept: the top ``top_k`` per quota and every entity throttled now (counted by
    ``quotastream_throttled_entities`` even when ``top_k`` is 0). An entity that leaves both is
    forgotten, and so are entities not decided again for ``keep_ms`` (their Redis keys expire
    then too), unless throttled.
    """

    top_k: int
    keep_ms: int | None = None
    entities: dict[tuple[str, str], EntityDecision] = field(default_factory=dict)
    seen_ms: dict[tuple[str, str], int] = field(default_factory=dict)
    top: set[tuple[str, str]] = field(default_factory=set)
    timers: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # per shard
    remote_log: dict[tuple[str, int], int] = field(default_factory=dict)

    def fold(self, decisions: Iterable[EntityDecision], now_ms: int) -> None:
        for decision in decisions:
            self.entities[decision.key] = decision
            self.seen_ms[decision.key] = now_ms
        if self.keep_ms is not None:
            horizon = now_ms - self.keep_ms
            for key in [k for k, seen in self.seen_ms.items() if seen < horizon]:
                if self.entities[key].throttle_ms_at(now_ms) == 0:
                    del self.entities[key], self.seen_ms[key]
        top, throttled = select(self.entities.values(), self.top_k, now_ms)
        keep = top | throttled
        for key in [k for k in self.entities if k not in keep]:
            del self.entities[key], self.seen_ms[key]
        self.top = top

    def exported(self, now_ms: int) -> list[EntityDecision]:
        """The per-entity series' decisions: the top-k and those throttled at ``now_ms``."""
        if self.top_k == 0:
            return []
        return [
            decision
            for key, decision in self.entities.items()
            if key in self.top or decision.throttle_ms_at(now_ms) > 0
        ]

    def throttled(self, now_ms: int) -> dict[str, int]:
        """Entities throttled at ``now_ms``, per quota (every quota present, 0 included)."""
        counts = dict.fromkeys(QUOTAS, 0)
        for decision in self.entities.values():
            if decision.throttle_ms_at(now_ms) > 0:
                counts[decision.quota] = counts.get(decision.quota, 0) + 1
        return counts

    def tracked(self) -> frozenset[str]:
        """The keys (:func:`tracking_key`) whose new decisions the writers must always return."""
        return frozenset(tracking_key(quota, entity) for quota, entity in self.entities)

    def fold_timers(self, shards: Mapping[int, tuple[int, int, int]]) -> tuple[int, int]:
        """New per-shard (pending, fired, cancelled); returns the (fired, cancelled) increase.

        A shard's fired and cancelled counts are cumulative since its state began; a first
        sight counts in full, a decrease (a new checkpoint) counts from zero.
        """
        fired = cancelled = 0
        for shard, counts in shards.items():
            _, old_fired, old_cancelled = self.timers.get(shard, (0, 0, 0))
            fired += counts[1] - old_fired if counts[1] >= old_fired else counts[1]
            cancelled += counts[2] - old_cancelled if counts[2] >= old_cancelled else counts[2]
            self.timers[shard] = counts
        return fired, cancelled

    def timers_pending(self) -> int:
        return sum(pending for pending, _, _ in self.timers.values())


def tracking_key(quota: str, entity: str) -> str:
    return f"{quota}\x00{entity}"


# --- What a writer returns (executors) -------------------------------------------------------
SUMMARY = "summary"
DECISION = "decision"
REJECTS = "rejects"
REQUESTS = "requests"
TIMERS = "timers"
REMOTE_LOG = "remote_log"

#: The output of :func:`streaming.sinks.write_batches` when asked for a summary: one ``summary``
#: row per Arrow batch written, then its kept decisions, rejects by reason, requests by quota,
#: timer counts and remote log totals (``kind`` tells which columns are set).
SUMMARY_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("decisions", pa.int64()),  # summary: decisions written
        ("rejects", pa.int64()),  # summary: rejects written; rejects: count of the reason
        ("requests", pa.int64()),  # requests: the quota's requests (events' count)
        ("written_at", pa.int64()),  # summary: wall clock at write (ms)
        ("newest_ts", pa.int64()),  # summary: newest event time of a new decision
        ("config_version", pa.int64()),  # summary: highest configuration version decided
        ("redis_failures", pa.int64()),  # summary: failed Redis attempts before the write
        ("quota", pa.string()),
        ("entity", pa.string()),
        ("rate", pa.float64()),
        ("limit", pa.float64()),
        ("throttle_ms", pa.int64()),
        ("until", pa.int64()),
        ("released_at", pa.int64()),
        ("mode", pa.string()),
        ("ts", pa.int64()),
        ("reason", pa.string()),
        ("shard", pa.int32()),
        ("timers_pending", pa.int64()),
        ("timers_fired", pa.int64()),
        ("timers_cancelled", pa.int64()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("remote_log_bytes", pa.int64()),
    ]
)


@dataclass(frozen=True)
class SummaryRequest:
    """What the driver asks of each writer: how many per quota, and which entities always."""

    top_k: int
    tracked: frozenset[str] = frozenset()


class BatchSummary:
    """Accumulates one written Arrow batch's summary; bounded by the request, not the batch."""

    def __init__(self, request: SummaryRequest, written_at: int) -> None:
        self._request = request
        self._written_at = written_at
        self._kept: list[Mapping[str, Any]] = []
        self._candidates: dict[str, list[tuple[tuple[float, float], int, Mapping[str, Any]]]] = {}
        self._rejects: Tally[str] = Tally()
        self._requests: Tally[str] = Tally()
        self._rows: list[dict[str, Any]] = []
        self.decisions = 0
        self._newest_ts: int | None = None
        self._config_version: int | None = None
        #: Failed Redis attempts before this batch was written (set by the writer).
        self.redis_failures = 0

    def add_other(self, row: Mapping[str, Any]) -> None:
        """A written row that is not a decision: a reject, requests, timer counts or remote log
        sizes."""
        row_type = row["row_type"]
        if row_type == stages.REJECT:
            self._rejects[str(row["reason"])] += 1
        elif row_type == stages.REQUESTS:
            self._requests[str(row["quota"])] += int(row["requests"])
        elif row_type == stages.TIMERS:
            self.timers(
                int(row["shard"]),
                int(row["timers_pending"]),
                int(row["timers_fired"]),
                int(row["timers_cancelled"]),
            )
        elif row_type == stages.REMOTE_LOG:
            document = row["remote_log"]
            total = 0 if document is None else int(json.loads(document)["total"])
            self.remote_log(str(row["topic"]), int(row["partition"]), total)

    def decisions_of(self, decisions: pa.RecordBatch) -> None:
        """Decision rows, column by column: a batch may hold every entity of a shard. Kept:
        the throttled, the tracked, and the top ``top_k`` per quota of the rest by
        :func:`rank_key` (ties: the later row)."""
        count = decisions.num_rows
        if not count:
            return
        self.decisions += count
        ts = decisions.column("ts").to_numpy(zero_copy_only=False)
        fresh = pc.is_null(decisions.column("notice")).to_numpy(zero_copy_only=False)
        if fresh.any():  # a release repeats an old decision's event time: not counted
            newest = int(ts[fresh].max())
            self._newest_ts = newest if self._newest_ts is None else max(self._newest_ts, newest)
        version = pc.max(decisions.column("config_version")).as_py()
        if version is not None:
            self._config_version = max(version, self._config_version or version)
        quota = decisions.column("quota").to_numpy(zero_copy_only=False)
        entity = decisions.column("entity").to_numpy(zero_copy_only=False)
        until = decisions.column("until").to_numpy(zero_copy_only=False)
        pending = pc.is_null(decisions.column("released_at")).to_numpy(zero_copy_only=False)
        enforced = pc.equal(decisions.column("mode"), _ENFORCED).to_numpy(zero_copy_only=False)
        keep = pending & enforced & (until > self._written_at)  # throttled at the write
        tracked = self._request.tracked
        if tracked:
            keep |= np.fromiter(
                (tracking_key(q, e) in tracked for q, e in zip(quota, entity, strict=True)),
                dtype=np.bool_,
                count=count,
            )
        self._kept += decisions.take(np.flatnonzero(keep)).to_pylist()
        if self._request.top_k <= 0:
            return
        rate = decisions.column("rate").to_numpy(zero_copy_only=False)
        limit = decisions.column("limit").fill_null(np.nan).to_numpy(zero_copy_only=False)
        limited = (limit > 0) & (limit < np.inf)
        ratio = np.where(limited, rate / np.where(limited, limit, 1.0), -1.0)
        rest = np.flatnonzero(~keep)
        first = self.decisions - count  # rows are numbered across the writer's batches
        for name in np.unique(quota[rest]):
            rows = rest[quota[rest] == name]
            # Highest (ratio, rate, position) first.
            order = np.lexsort((rows, rate[rows], ratio[rows]))[::-1][: self._request.top_k]
            best = decisions.take(rows[order]).to_pylist()
            heap = self._candidates.setdefault(str(name), [])
            for position, row in zip(rows[order].tolist(), best, strict=True):
                item = ((float(ratio[position]), float(rate[position])), first + position, row)
                if len(heap) < self._request.top_k:
                    heapq.heappush(heap, item)
                elif item[:2] > heap[0][:2]:
                    heapq.heapreplace(heap, item)

    def timers(self, shard: int, pending: int, fired: int, cancelled: int) -> None:
        self._rows.append(
            {
                "kind": TIMERS,
                "shard": shard,
                "timers_pending": pending,
                "timers_fired": fired,
                "timers_cancelled": cancelled,
            }
        )

    def remote_log(self, topic: str, partition: int, total: int) -> None:
        self._rows.append(
            {"kind": REMOTE_LOG, "topic": topic, "partition": partition, "remote_log_bytes": total}
        )

    def rows(self) -> list[dict[str, Any]]:
        summary = {
            "kind": SUMMARY,
            "decisions": self.decisions,
            "rejects": sum(self._rejects.values()),
            "written_at": self._written_at,
            "newest_ts": self._newest_ts,
            "config_version": self._config_version,
            "redis_failures": self.redis_failures,
        }
        candidates = [row for heap in self._candidates.values() for _, _, row in heap]
        decisions = [_decision_fields(row) for row in [*self._kept, *candidates]]
        rejects = [
            {"kind": REJECTS, "reason": reason, "rejects": count}
            for reason, count in self._rejects.items()
        ]
        requests = [
            {"kind": REQUESTS, "quota": quota, "requests": count}
            for quota, count in self._requests.items()
        ]
        return [summary, *decisions, *rejects, *requests, *self._rows]

    def batch(self) -> pa.RecordBatch:
        return pa.RecordBatch.from_pylist(self.rows(), schema=SUMMARY_SCHEMA)


def _decision_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    decision = EntityDecision.from_row(row)
    return {
        "kind": DECISION,
        "quota": decision.quota,
        "entity": decision.entity,
        "rate": decision.rate,
        "limit": decision.limit,
        "throttle_ms": decision.throttle_ms,
        "until": decision.until,
        "released_at": decision.released_at,
        "mode": decision.mode,
        "ts": decision.ts,
    }


@dataclass
class BatchReport:
    """A micro-batch's summaries from every writer, merged on the driver."""

    decisions: list[EntityDecision] = field(default_factory=list)
    decisions_written: int = 0
    rejects: Tally[str] = field(default_factory=Tally)
    requests: Tally[str] = field(default_factory=Tally)
    timers: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    remote_log: dict[tuple[str, int], int] = field(default_factory=dict)
    written_at: int | None = None
    newest_ts: int | None = None
    config_version: int | None = None
    redis_failures: int = 0

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> BatchReport:
        report = cls()
        for row in rows:
            kind = row["kind"]
            if kind == DECISION:
                report.decisions.append(EntityDecision.from_row(row))
            elif kind == SUMMARY:
                report.decisions_written += int(row["decisions"])
                report.written_at = _max(report.written_at, row["written_at"])
                report.newest_ts = _max(report.newest_ts, row["newest_ts"])
                report.config_version = _max(report.config_version, row["config_version"])
                report.redis_failures += int(row["redis_failures"] or 0)
            elif kind == REJECTS:
                report.rejects[str(row["reason"])] += int(row["rejects"])
            elif kind == REQUESTS:
                report.requests[str(row["quota"])] += int(row["requests"])
            elif kind == TIMERS:
                report.timers[int(row["shard"])] = (
                    int(row["timers_pending"]),
                    int(row["timers_fired"]),
                    int(row["timers_cancelled"]),
                )
            elif kind == REMOTE_LOG:
                key = (str(row["topic"]), int(row["partition"]))
                report.remote_log[key] = int(row["remote_log_bytes"])
        # Several writers may return one entity (tracked in two Arrow batches): latest wins.
        report.decisions.sort(key=lambda decision: decision.ts)
        return report

    @property
    def event_lag_s(self) -> float | None:
        if self.written_at is None or self.newest_ts is None:
            return None
        return (self.written_at - self.newest_ts) / 1000


def _max(current: int | None, value: Any) -> int | None:
    if value is None:
        return current
    return int(value) if current is None else max(current, int(value))


# --- Prometheus (driver) ---------------------------------------------------------------------
class EngineMetrics:
    """The engine's metrics in a registry of their own, and the exporter serving them."""

    def __init__(
        self,
        top_k: int = 100,
        *,
        host: str = "127.0.0.1",
        port: int = 9464,
        keep_ms: int | None = None,
        clock: Callable[[], float] = time.time,
        input_ends: Callable[[], Offsets] | None = None,
    ) -> None:
        self.host, self.port = host, port
        self.clock = clock
        #: The events topics' end offsets, asked at scrape time (None: no backlog series).
        self.input_ends = input_ends
        #: The event partitions' next offsets, as of the last progress that reported them.
        self.read_offsets: Offsets = {}
        self.registry = CollectorRegistry(auto_describe=True)
        self.state = MetricsState(top_k, keep_ms)
        self._lock = threading.Lock()
        self._server: Any = None
        self._status_dir = tempfile.TemporaryDirectory(prefix="quotastream-metrics-")
        #: Where the query's Kafka source reports its outage clock (``start_query`` passes it).
        self.source_status_file = Path(self._status_dir.name) / "kafka-source.json"
        #: Topics whose records count as input (``attach``); None: every topic of the source.
        self.event_topics: Collection[str] | None = None
        registry = self.registry
        self.remote_log_size = Gauge(
            REMOTE_LOG_SIZE,
            "Remote log size of a partition (Kafka RemoteLogSizeBytes)",
            ["topic", "partition"],
            registry=registry,
        )
        self.timers_pending = Gauge(
            TIMERS_PENDING, "Pending throttle timers, all shards", registry=registry
        )
        self.timers_fired = Counter(TIMERS_FIRED, "Throttle timers fired", registry=registry)
        self.timers_cancelled = Counter(
            TIMERS_CANCELLED, "Throttle timers cancelled", registry=registry
        )
        self.dead_letter = Counter(
            DEAD_LETTER_EVENTS, "Rejected events, by reason", ["reason"], registry=registry
        )
        self.input_events = Counter(INPUT_EVENTS, "Kafka records read", registry=registry)
        self.requests = Counter(
            QUOTA_REQUESTS,
            "Requests the accepted events stood for (their count), by quota",
            ["quota"],
            registry=registry,
        )
        for quota in QUOTAS:  # each quota's series from 0, so that rate() sees its first batch
            self.requests.labels(quota=quota)
        self.batch_duration = Histogram(
            BATCH_DURATION,
            "Micro-batch trigger execution time",
            buckets=BATCH_DURATION_BUCKETS,
            registry=registry,
        )
        self.input_rate = Gauge(
            INPUT_ROWS_PER_SECOND, "Input rows per second, last batch", registry=registry
        )
        self.processed_rate = Gauge(
            PROCESSED_ROWS_PER_SECOND, "Processed rows per second, last batch", registry=registry
        )
        self.event_lag = Gauge(
            EVENT_LAG,
            "Wall clock at write minus the newest event time decided in the last batch",
            registry=registry,
        )
        self.config_version = Gauge(
            CONFIG_VERSION, "Live configuration version of the newest decision", registry=registry
        )
        self.last_batch = Gauge(
            LAST_BATCH_TIMESTAMP, "When the last micro-batch finished", registry=registry
        )
        self.redis_write_failures = Counter(
            REDIS_WRITE_FAILURES,
            "Failed Redis write attempts (retried with backoff)",
            registry=registry,
        )
        self.source_data_loss = Counter(
            SOURCE_DATA_LOSS,
            "Times a partition's log restarted below the offsets read (failOnDataLoss=false)",
            ["topic", "partition"],
            registry=registry,
        )
        registry.register(_EntityCollector(self))
        registry.register(_KafkaOutageCollector(self))
        registry.register(_BacklogCollector(self))

    @classmethod
    def from_settings(
        cls, settings: Any, keep_ms: int | None = None, kafka: Any = None
    ) -> EngineMetrics:
        """From ``EngineSettings.metrics`` (a :class:`streaming.settings.MetricsSettings`); with
        ``kafka`` (``EngineSettings.kafka``) the input backlog is measured too."""
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
        now = int(self.clock() * 1000) if now_ms is None else now_ms
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

    def record_progress(self, progress: Mapping[str, Any]) -> None:
        """One ``StreamingQueryProgress`` (its JSON form: a dict)."""
        duration_ms = (progress.get("durationMs") or {}).get("triggerExecution")
        if duration_ms is not None:
            self.batch_duration.observe(duration_ms / 1000)
        # Spark's input rows are the source's staged rows (sums, rejects), not Kafka records.
        self.input_events.inc(
            sum(
                records_read(source.get("startOffset"), source.get("endOffset"), self.event_topics)
                for source in progress.get("sources") or ()
            )
        )
        with self._lock:
            for source in progress.get("sources") or ():
                read = checkpoint_offsets(source.get("endOffset")) or {}
                self.read_offsets.update(
                    (tp, offset)
                    for tp, offset in read.items()
                    if self.event_topics is None or tp[0] in self.event_topics
                )
        self.input_rate.set(_finite(progress.get("inputRowsPerSecond")))
        self.processed_rate.set(_finite(progress.get("processedRowsPerSecond")))
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
            self.last_batch.set(self.clock())

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


def _finite(value: Any) -> float:
    number = float(value or 0.0)
    return number if math.isfinite(number) else 0.0


class _EntityCollector(Collector):
    """The per-entity series and the throttled counts, computed at scrape time."""

    def __init__(self, metrics: EngineMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return list(self._metrics.entity_series(int(self._metrics.clock() * 1000)))

    def describe(self) -> Iterable[Metric]:
        names = (BYTE_RATE, QUOTA_LIMIT, QUOTA_UTILISATION, THROTTLE_TIME, THROTTLED_ENTITIES)
        return [GaugeMetricFamily(name, "", labels=METRICS[name][1]) for name in names]


class _KafkaOutageCollector(Collector):
    """The source's outage clock, from its status file (no file yet: no outage so far)."""

    def __init__(self, metrics: EngineMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        status = read_status(self._metrics.source_status_file) or OutageStatus(None, 0, 0)
        now = self._metrics.clock()
        lasted = 0.0 if status.since_ms is None else max(now - status.since_ms / 1000, 0.0)
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
            return true_end_offsets(self._consumer, partitions, self._timeout_ms)

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
