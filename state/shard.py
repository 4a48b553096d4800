"""One shard of entities: the state one Spark state group keeps, and what a batch does to it.

Spark charges about a millisecond per state group and micro-batch, so a group is a *shard* of
many entities. A shard holds four columnar parts, each encoded as one blob
(:class:`ShardState`): the rolling windows of every quota type (:class:`~state.core.QuotaCore`),
the pending throttle releases in a timing wheel (:class:`~state.throttle_timers.ThrottleTimers`),
the remote log sizes of its partitions (:class:`~state.remote_log.RemoteLogSizes`), and what
Redis holds of its decisions (:class:`~state.written_decisions.WrittenDecisions`).

:meth:`Shard.step` is one micro-batch at the batch time ``now_ms``: it fires the timers due,
records the usage sums in the windows, registers the new decisions' timers, marks the decisions
Redis needs, applies segment events, and forgets entities idle past the eviction horizon. The batch
time is the checkpoint's, so a replayed batch repeats the same releases. Nothing here knows Spark:
the streaming job only converts Arrow rows to the frames below and back. ``replay`` and
``--what-if`` drive a shard too, through :meth:`Shard.decide`: the same windows, decided event
by event.

The windows stay encoded between batches: a batch decodes only the entities it touches and copies
the others through (``state/encoding.py``), so its cost follows its work, not the shard's size.

Usage rows (:data:`USAGE_COLUMNS`) are events already summed per (quota, entity, partition key,
sample); summing is exact (``tests/test_rolling.py``), so a shard's decisions are those of the
events one by one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from state.config import QuotaConfig
from state.core import QuotaCore
from state.live_config import Mode
from state.quota_types import QuotaType
from state.remote_log import EVENT_COLUMNS, RemoteLogSizes
from state.remote_log_view import RemoteLog, RetentionView
from state.throttle_timers import ThrottleTimers
from state.timer_stats import TimerStats
from state.timing_wheel import KAFKA_TICK_MS, KAFKA_WHEEL_SIZE
from state.written_decisions import WritePolicy, WrittenDecisions

#: What :meth:`Shard.step` takes as usage: sums per (quota, entity, partition_key, sample).
USAGE_COLUMNS = (
    "quota",
    "entity",
    "partition_key",  # remote_copy: the uploading partition; None for other quotas
    "ts",  # the newest event time of the sum
    "counted_bytes",
    "limit",  # inf where unlimited
    "level",
    "config_version",
    "mode",  # state.live_config.Mode
)
#: What :meth:`Shard.step` takes as segment events and lineage reports (KIP-852), as
#: ``RemoteLogSizes.apply``.
SEGMENT_COLUMNS = EVENT_COLUMNS
#: Each touched entity's latest decision.
DECISION_FIELDS = (
    "quota",
    "entity",
    "ts",
    "rate",
    "limit",
    "throttle_ms",
    "until",
    "exceeded",
    "window_ms",
    "config_version",
    "mode",
)


@dataclass(frozen=True)
class ShardState:
    """One shard's state value: rolling tables, pending throttle timers, remote log sizes, and
    what Redis holds of its decisions."""

    tables: bytes
    timers: bytes
    remote_log: bytes
    written: bytes


@dataclass(frozen=True)
class ShardSettings:
    config: QuotaConfig
    timer_tick_ms: int = KAFKA_TICK_MS
    timer_wheel_size: int = KAFKA_WHEEL_SIZE
    write_policy: WritePolicy = field(default_factory=WritePolicy)


@dataclass(frozen=True)
class ShardStep:
    """What one micro-batch did to a shard."""

    state: ShardState
    #: The touched entities' latest decisions, and the throttles that ended (``released_at``,
    #: ``notice``), as :meth:`ThrottleTimers.step` reports them; ``write`` tells which Redis
    #: needs, and ``expire_at`` until when it keeps them (:class:`WrittenDecisions`).
    decisions: pd.DataFrame
    timers: TimerStats
    #: Per partition whose remote log sizes changed: topic, partition, and ``remote_log`` (its
    #: :class:`~state.remote_log_view.RemoteLog`, or None when its last segment is gone).
    remote_logs: pd.DataFrame
    #: When the earliest pending timer bucket is due (None: no timers).
    wake_at_ms: int | None


class Shard:
    """A shard's state: restored for one :meth:`step`, or kept across :meth:`decide` calls."""

    def __init__(
        self,
        settings: ShardSettings,
        tables: bytes | None,
        timers: ThrottleTimers,
        remote_log: bytes,
        written: WrittenDecisions,
    ) -> None:
        self.config = settings.config
        self.write_policy = settings.write_policy
        #: Kept encoded: a step decodes only the entities its usage touches.
        self._tables = tables
        self.timers = timers
        #: Kept encoded: decoded only by a batch that brings segment events (most bring none).
        self._remote_log = remote_log
        self.written = written

    @classmethod
    def new(cls, config: QuotaConfig) -> Shard:
        """An empty shard for :meth:`decide` (its timing wheel is not used there)."""
        return cls.restore(None, ShardSettings(config), 0)

    @classmethod
    def restore(cls, state: ShardState | None, settings: ShardSettings, now_ms: int) -> Shard:
        """The shard ``state`` holds, or a new one (its timing wheel starting at ``now_ms``)."""
        if state is None:
            timers = ThrottleTimers.empty(settings.timer_tick_ms, settings.timer_wheel_size, now_ms)
            return cls(settings, None, timers, RemoteLogSizes().encode(), WrittenDecisions())
        return cls(
            settings,
            state.tables,
            ThrottleTimers.decode(state.timers),
            state.remote_log,
            WrittenDecisions.decode(state.written),
        )

    def step(
        self,
        now_ms: int,
        usage: pd.DataFrame,
        segments: pd.DataFrame | None = None,
        eviction_horizon_ms: int | None = None,
    ) -> ShardStep:
        """One micro-batch at ``now_ms``: ``usage`` (:data:`USAGE_COLUMNS`), ``segments``
        (:data:`SEGMENT_COLUMNS`); entities whose windows are empty at the horizon go."""
        remote_logs = _no_remote_logs()
        if segments is not None and len(segments):
            sizes = RemoteLogSizes.decode(self._remote_log)
            remote_logs = _remote_logs(sizes, segments)
            if eviction_horizon_ms is not None:
                sizes.evict_tombstones(eviction_horizon_ms)
            self._remote_log = sizes.encode()
        core = self._core_for(usage)
        decisions = latest_decisions(core, usage)
        decisions["enforced"] = decisions["mode"] == Mode.ENFORCED.value
        keys = pd.Index((decisions["quota"] + ":" + decisions["entity"]).to_numpy(dtype=object))
        changed = self.timers.step(now_ms, decisions.set_index(keys))
        changed = self.written.step(now_ms, changed, self.write_policy).reset_index(drop=True)
        if eviction_horizon_ms is not None:
            core.evict_idle(eviction_horizon_ms)
        self._tables = core.encode_state()
        return ShardStep(
            state=ShardState(
                self._tables, self.timers.encode(), self._remote_log, self.written.encode()
            ),
            decisions=changed,
            timers=self.timers.stats(),
            remote_logs=remote_logs,
            wake_at_ms=self.timers.next_expiration(),
        )

    def decide(self, events: pd.DataFrame) -> pd.DataFrame:
        """Each accepted event's decision (:meth:`QuotaCore.decide`), in input order: what replay
        and what-if report event by event, where the engine publishes each entity's latest."""
        resolved = QuotaCore(self.config).resolve(events)
        core = self._core_for(resolved[resolved["quota"].notna()])
        decisions = core.record(resolved)
        self._tables = core.encode_state()
        return decisions

    def _core_for(self, usage: pd.DataFrame) -> QuotaCore:
        """The windows of the entities ``usage`` touches; the others stay encoded."""
        if self._tables is None:
            return QuotaCore(self.config)
        quota = usage["quota"].to_numpy(dtype=object)
        entity = usage["entity"].to_numpy(dtype=object)
        touched = {QuotaType(name): entity[quota == name] for name in pd.unique(quota).tolist()}
        return QuotaCore.restore(self.config, self._tables, touched)


def latest_decisions(core: QuotaCore, usage: pd.DataFrame) -> pd.DataFrame:
    """Each touched entity's latest decision (:data:`DECISION_FIELDS`) after ``core`` records
    ``usage``, in the order of their latest rows.

    Built from numpy columns: a tiny batch's shard step is mostly pandas' cost per call, and
    this runs in every step."""
    if not len(usage):
        return pd.DataFrame(
            {name: pd.Series(dtype=_EMPTY_DTYPES.get(name, np.int64)) for name in DECISION_FIELDS}
        )
    ts = usage["ts"].to_numpy(dtype=np.int64)
    order = None if bool(np.all(ts[1:] >= ts[:-1])) else np.argsort(ts, kind="stable")
    in_order = usage if order is None else usage.take(order)
    decided = core.record_columns(in_order.reset_index(drop=True))
    columns = {
        "quota": np.asarray(decided["quota"], dtype=object),
        "entity": np.asarray(decided["entity"], dtype=object),
        **{name: decided[name] for name in _DECIDED_FIELDS},
        "config_version": in_order["config_version"].to_numpy(dtype=np.int64),
        "mode": in_order["mode"].to_numpy(dtype=object),
    }
    # A remote_copy decision is also published per partition: its fair wait
    # (docs/semantics.md).
    partition_key = np.asarray(decided["partition_key"], dtype=object)
    copies = pd.notna(partition_key)
    if copies.any():
        per_partition = {name: column[copies] for name, column in columns.items()}
        per_partition["entity"] = partition_key[copies].astype(str).astype(object)
        per_partition["throttle_ms"] = decided["partition_wait_ms"][copies]
        columns = {
            name: np.concatenate([column, per_partition[name]]) for name, column in columns.items()
        }
    latest = _last_of_each(columns["quota"], columns["entity"])
    columns = {name: column[latest] for name, column in columns.items()}
    columns["until"] = columns["ts"] + columns["throttle_ms"]
    return pd.DataFrame({name: columns[name] for name in DECISION_FIELDS})


#: What :func:`latest_decisions` takes as :meth:`QuotaCore.record` decided it.
_DECIDED_FIELDS = ("ts", "rate", "limit", "throttle_ms", "exceeded", "window_ms")


def _last_of_each(quota: np.ndarray, entity: np.ndarray) -> np.ndarray:
    """The positions of each (quota, entity)'s last row, in row order."""
    quota_codes, _ = pd.factorize(quota)
    entity_codes, entity_names = pd.factorize(entity)
    keys = quota_codes.astype(np.int64) * len(entity_names) + entity_codes
    _, first_from_the_end = np.unique(keys[::-1], return_index=True)
    return np.sort(len(keys) - 1 - first_from_the_end)


_EMPTY_DTYPES: dict[str, Any] = {
    "quota": object,
    "entity": object,
    "rate": float,
    "limit": float,
    "exceeded": bool,
    "mode": object,
}


def _no_remote_logs() -> pd.DataFrame:
    # A new frame each time: pandas remembers every view of a frame's columns in the frame
    # (a weak reference each, pruned only now and then), so a module-level frame that each
    # batch derives one from holds a little more memory every batch.
    return pd.DataFrame({"topic": [], "partition": [], "remote_log": []})


def _remote_logs(sizes: RemoteLogSizes, segments: pd.DataFrame) -> pd.DataFrame:
    """Applies segment events; one row per partition whose sizes changed."""
    changed = sizes.apply(segments.reset_index(drop=True))
    remote_logs = [
        remote_log_of(sizes, topic, int(partition)) if live else None
        for topic, partition, live in zip(
            changed["topic"], changed["partition"], changed["live_segments"], strict=True
        )
    ]
    return pd.DataFrame(
        {
            "topic": changed["topic"].to_numpy(dtype=object),
            "partition": changed["partition"].to_numpy(dtype=np.int64),
            "remote_log": remote_logs,
        }
    )


def remote_log_of(sizes: RemoteLogSizes, topic: str, partition: int) -> RemoteLog:
    """The partition's remote log now (``total`` 0 and no segments once its last one is gone)."""
    live = sizes.live_segments(topic, partition)
    reported = sizes.lineage(topic, partition)
    retention = sizes.retention(topic, partition)
    return RemoteLog(
        topic,
        partition,
        sizes.partition_total(topic, partition),
        sizes.epoch_sizes(topic, partition),
        [
            (str(segment), int(epoch), int(size))
            for segment, epoch, size in zip(
                live["segment_id"], live["leader_epoch"], live["bytes"], strict=True
            )
        ],
        RetentionView(
            lineage=None if reported is None else [(int(e), int(o)) for e, o in reported[1]],
            log_end_offset=None if reported is None else int(reported[0]),
            bytes=retention.size,
            walk=[
                (segment.segment_id, segment.size, within) for segment, within in retention.order
            ],
        ),
    )


def timer_counts(stats: TimerStats) -> dict[str, int]:
    """``stats`` as the ``timers_*`` fields the engine reports per shard."""
    return {f"timers_{name}": count for name, count in asdict(stats).items()}
