"""What a micro-batch's writers tell the driver's metrics: a bounded summary of what they wrote.

Each writer (:func:`streaming.engine.sinks.write_batches`, on the executors) returns, when the
driver asks (:class:`SummaryRequest`), a small :data:`SUMMARY_SCHEMA` table besides writing Redis:
the decisions that could be exported (per Arrow batch, the ``top_k`` per quota by rank, every one
throttled at the write, and every one the driver tracks already), rejects by reason, requests by
quota, timer counts per shard, remote log totals per partition, and the newest event time. A kept
decision travels as the very value written to Redis, so the driver reads it as an agent does
(:mod:`quotastream.redis_contract`). :class:`BatchReport` merges the writers' tables on the driver.
"""

from __future__ import annotations

import heapq
from collections import Counter as Tally
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from quotastream.redis_contract import Decision, decode_decision
from state.live_config import Mode
from streaming.engine import stages
from streaming.engine.decision_values import decision_values

# The kinds of summary row (``kind`` tells which columns are set).
SUMMARY = "summary"
DECISION = "decision"
REJECTS = "rejects"
REQUESTS = "requests"
TIMERS = "timers"
REMOTE_LOG = "remote_log"

#: The output of :func:`streaming.engine.sinks.write_batches` when asked for a summary: one
#: ``summary`` row per Arrow batch written, then its kept decisions, rejects by reason, requests by
#: quota, timer counts and remote log totals.
SUMMARY_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("decisions", pa.int64()),  # summary: decisions written
        ("decided", pa.int64()),  # summary: decisions made, written or not
        ("rejects", pa.int64()),  # summary: rejects written; rejects: count of the reason
        ("requests", pa.int64()),  # requests: the quota's requests (events' count)
        ("written_at", pa.int64()),  # summary: wall clock at write (ms)
        ("newest_ts", pa.int64()),  # summary: newest event time of a new decision
        ("config_version", pa.int64()),  # summary: highest configuration version decided
        ("redis_failures", pa.int64()),  # summary: failed Redis attempts before the write
        ("value", pa.binary()),  # decision: the value written to Redis
        ("quota", pa.string()),  # requests
        ("reason", pa.string()),  # rejects
        ("shard", pa.int32()),  # timers
        ("timers_pending", pa.int64()),
        ("timers_fired", pa.int64()),
        ("timers_cancelled", pa.int64()),
        ("topic", pa.string()),  # remote_log
        ("partition", pa.int32()),
        ("remote_log_bytes", pa.int64()),
    ]
)

_ENFORCED = Mode.ENFORCED.value


def tracking_key(quota: str, entity: str) -> str:
    return f"{quota}\x00{entity}"


@dataclass(frozen=True)
class SummaryRequest:
    """What the driver asks of each writer: how many per quota, and which entities always."""

    top_k: int
    tracked: frozenset[str] = frozenset()  # tracking_key of each


class BatchSummary:
    """Accumulates one written Arrow batch's summary; bounded by the request, not the batch."""

    def __init__(self, request: SummaryRequest, written_at: int) -> None:
        self._request = request
        self._written_at = written_at
        self._kept: list[bytes] = []
        self._candidates: dict[str, list[tuple[tuple[float, float], int, bytes]]] = {}
        self._rejects: Tally[str] = Tally()
        self._requests: Tally[str] = Tally()
        self._rows: list[dict[str, Any]] = []
        #: Decisions written to Redis, and made (written or not).
        self.decisions = 0
        self.decided = 0
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
            self._rows.append(
                {"kind": TIMERS, "shard": int(row["shard"])}
                | {name: int(row[name]) for name in _TIMER_COLUMNS}
            )
        elif row_type == stages.REMOTE_LOG:
            self._rows.append(
                {
                    "kind": REMOTE_LOG,
                    "topic": str(row["topic"]),
                    "partition": int(row["partition"]),
                    "remote_log_bytes": int(row["remote_log_bytes"]),
                }
            )

    def decisions_of(self, decisions: pa.RecordBatch, written: int) -> None:
        """Decision rows, ``written`` of them to Redis, column by column: a batch may hold
        every entity of a shard. Kept, as the values Redis gets: the throttled, the tracked, and
        the top ``top_k`` per quota of the rest by rank
        (:func:`streaming.engine.exported_entities.rank`, in column form; ties: the later row)."""
        count = decisions.num_rows
        if not count:
            return
        self.decisions += written
        self.decided += count
        first = self.decided - count  # rows are numbered across the writer's batches
        ts = decisions.column("ts").to_numpy(zero_copy_only=False)
        fresh = pc.is_null(decisions.column("notice")).to_numpy(zero_copy_only=False)
        if fresh.any():  # a release repeats an old decision's event time: not counted
            newest = int(ts[fresh].max())
            self._newest_ts = newest if self._newest_ts is None else max(self._newest_ts, newest)
        version = pc.max(decisions.column("config_version")).as_py()
        if version is not None:
            self._config_version = max(version, self._config_version or version)
        quota = decisions.column("quota").to_numpy(zero_copy_only=False)
        keep = throttled_at(decisions, self._written_at)
        tracked = self._request.tracked
        if tracked:
            entity = decisions.column("entity").to_numpy(zero_copy_only=False)
            keep |= np.fromiter(
                (tracking_key(q, e) in tracked for q, e in zip(quota, entity, strict=True)),
                dtype=np.bool_,
                count=count,
            )
        kept = np.flatnonzero(keep)
        top, ranks = self._top_rows(decisions, quota, ~keep)
        values = decision_values(decisions.take(pa.array(np.concatenate([kept, top]))))
        self._kept += values[: len(kept)]
        for position, rank, value in zip(top.tolist(), ranks, values[len(kept) :], strict=True):
            heap = self._candidates.setdefault(str(quota[position]), [])
            item = (rank, first + position)
            if len(heap) < self._request.top_k:
                heapq.heappush(heap, (*item, value))
            elif item > heap[0][:2]:
                heapq.heapreplace(heap, (*item, value))

    def _top_rows(
        self, decisions: pa.RecordBatch, quota: npt.NDArray[Any], rest: npt.NDArray[np.bool_]
    ) -> tuple[npt.NDArray[np.int64], list[tuple[float, float]]]:
        """The rows of ``rest`` among the top ``top_k`` of their quota, with their ranks."""
        if self._request.top_k <= 0:
            return np.zeros(0, dtype=np.int64), []
        rate = decisions.column("rate").to_numpy(zero_copy_only=False)
        limit = decisions.column("limit").fill_null(np.nan).to_numpy(zero_copy_only=False)
        limited = limit > 0  # False for NaN: unlimited
        ratio = np.where(limited, rate / np.where(limited, limit, 1.0), -1.0)
        rows = np.flatnonzero(rest)
        chosen = [np.zeros(0, dtype=np.int64)]
        for name in np.unique(quota[rows]):
            of_quota = rows[quota[rows] == name]
            # Highest (ratio, rate, position) first.
            order = np.lexsort((of_quota, rate[of_quota], ratio[of_quota]))[::-1]
            chosen.append(of_quota[order[: self._request.top_k]])
        top = np.concatenate(chosen)
        return top, [(float(ratio[row]), float(rate[row])) for row in top.tolist()]

    def rows(self) -> list[dict[str, Any]]:
        summary = {
            "kind": SUMMARY,
            "decisions": self.decisions,
            "decided": self.decided,
            "rejects": sum(self._rejects.values()),
            "written_at": self._written_at,
            "newest_ts": self._newest_ts,
            "config_version": self._config_version,
            "redis_failures": self.redis_failures,
        }
        candidates = [value for heap in self._candidates.values() for _, _, value in heap]
        decisions = [{"kind": DECISION, "value": value} for value in [*self._kept, *candidates]]
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


_TIMER_COLUMNS = ("timers_pending", "timers_fired", "timers_cancelled")


def throttled_at(decisions: pa.RecordBatch, now_ms: int) -> npt.NDArray[np.bool_]:
    """Per decision row, whether it throttles at ``now_ms``: the column form of
    ``Decision.throttle_ms_at(now_ms) > 0`` (pending, enforced, not over yet)."""
    until = decisions.column("until").to_numpy(zero_copy_only=False)
    pending = pc.is_null(decisions.column("released_at")).to_numpy(zero_copy_only=False)
    enforced = pc.equal(decisions.column("mode"), _ENFORCED).to_numpy(zero_copy_only=False)
    throttled: npt.NDArray[np.bool_] = pending & enforced & (until > now_ms)
    return throttled


@dataclass
class BatchReport:
    """A micro-batch's summaries from every writer, merged on the driver."""

    decisions: list[Decision] = field(default_factory=list)
    decisions_written: int = 0
    decisions_made: int = 0
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
                report.decisions.append(decode_decision("the batch summary", row["value"]))
            elif kind == SUMMARY:
                report.decisions_written += int(row["decisions"])
                report.decisions_made += int(row["decided"])
                report.written_at = _max(report.written_at, row["written_at"])
                report.newest_ts = _max(report.newest_ts, row["newest_ts"])
                report.config_version = _max(report.config_version, row["config_version"])
                report.redis_failures += int(row["redis_failures"] or 0)
            elif kind == REJECTS:
                report.rejects[str(row["reason"])] += int(row["rejects"])
            elif kind == REQUESTS:
                report.requests[str(row["quota"])] += int(row["requests"])
            elif kind == TIMERS:
                pending, fired, cancelled = (int(row[name]) for name in _TIMER_COLUMNS)
                report.timers[int(row["shard"])] = (pending, fired, cancelled)
            elif kind == REMOTE_LOG:
                key = (str(row["topic"]), int(row["partition"]))
                report.remote_log[key] = int(row["remote_log_bytes"])
        # Several writers may return one entity (tracked in two Arrow batches): latest wins.
        report.decisions.sort(key=lambda decision: decision.decided_at)
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
