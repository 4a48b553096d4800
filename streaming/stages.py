"""The two Python stages of the streaming query, as plain functions over Arrow and pandas.

1. :func:`usage_batches` (``mapInArrow``, no state): validates Kafka values, resolves each
   event's quota and entity, and sums the counted bytes per (quota, entity, sample). Summing is
   exact: after a batch, windows and decisions depend only on the events, not on their order
   (``tests/test_rolling.py``). Rejected events pass through with their reason.
2. :func:`update_shard` (``applyInPandasWithState``, one group per shard): records a shard's usage
   in its :class:`~state.core.QuotaCore` and emits each touched entity's latest decision. The
   whole shard state is one binary value.

Spark charges about a millisecond per state group and micro-batch, so a group is a shard of
many entities, not one entity.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

from state.config import QuotaConfig
from state.core import QuotaCore
from state.events import EventBounds, parse_events
from state.quota_types import QuotaType

USAGE = "usage"
REJECT = "reject"

#: Rows between the two stages: usage sums, and rejected events on their way to the dead letter.
STAGE_SCHEMA = pa.schema(
    [
        ("row_type", pa.string()),
        ("shard", pa.int32()),
        ("quota", pa.string()),
        ("entity", pa.string()),
        ("ts", pa.int64()),  # latest event time of the group
        ("counted_bytes", pa.int64()),
        ("events", pa.int64()),
        ("limit", pa.float64()),
        ("level", pa.int32()),
        ("topic", pa.string()),  # rejects: where the payload came from
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("payload", pa.binary()),
        ("reason", pa.string()),
        ("detail", pa.string()),
    ]
)

_KIND_OF_QUOTA = {
    QuotaType.PRODUCE.value: "produce",
    QuotaType.FETCH.value: "fetch",
    QuotaType.REMOTE_COPY.value: "remote_copy",
    QuotaType.REMOTE_FETCH.value: "remote_fetch",
    QuotaType.LEADER_REPLICATION.value: "replication",
    QuotaType.FOLLOWER_REPLICATION.value: "replication",
}


@dataclass(frozen=True)
class StageSettings:
    config: QuotaConfig
    bounds: EventBounds  # absolute event-time bounds
    max_payload_bytes: int
    shards: int
    #: Events older than the wall clock by more than this are rejected, so no entity idle for
    #: longer can receive bytes again: its state can go (None: keep every entity).
    max_past_ms: int | None = None
    max_future_ms: int | None = None
    clock: Callable[[], float] = time.time

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def eviction_horizon(self) -> int | None:
        return None if self.max_past_ms is None else self.now_ms() - self.max_past_ms


def shard_of(entities: pd.Series, shards: int) -> npt.NDArray[np.int32]:
    """A stable shard per entity key (the same in every process and run)."""
    hashes = pd.util.hash_array(entities.to_numpy(dtype=object), categorize=True)
    return (hashes % np.uint64(shards)).astype(np.int32)


def usage_batches(
    batches: Iterator[pa.RecordBatch], settings: StageSettings
) -> Iterator[pa.RecordBatch]:
    """Stage 1: Kafka records in, usage sums and rejects out."""
    core = QuotaCore(settings.config)
    for batch in batches:
        values = batch.column("value").to_pylist()
        payloads = [value if value is not None else b"" for value in values]
        bounds = settings.bounds.around(
            settings.now_ms(), settings.max_past_ms, settings.max_future_ms
        )
        parsed = parse_events(payloads, bounds, settings.max_payload_bytes)
        if len(parsed.accepted):
            usage = _usage(core.resolve(parsed.accepted), settings)
            if len(usage):
                yield pa.RecordBatch.from_pandas(usage, schema=STAGE_SCHEMA, preserve_index=False)
        if len(parsed.rejected):
            yield _rejects(batch, parsed.rejected)


def _usage(resolved: pd.DataFrame, settings: StageSettings) -> pd.DataFrame:
    measured = resolved[resolved["quota"].notna()]
    window = measured["quota"].map(
        {q.value: settings.config.quota_types.of(q).window_ms for q in QuotaType}
    )
    frame = pd.DataFrame(
        {
            "quota": measured["quota"].astype(str).to_numpy(),
            "entity": measured["entity"].astype(str).to_numpy(),
            "sample": (measured["ts"] // window.astype(np.int64)).to_numpy(),
            "ts": measured["ts"].to_numpy(),
            "counted_bytes": measured["counted_bytes"].to_numpy(),
            "limit": measured["limit"].to_numpy(),
            "level": measured["level"].to_numpy(),
        }
    )
    summed = frame.groupby(["quota", "entity", "sample"], sort=False, observed=True).agg(
        ts=("ts", "max"),
        counted_bytes=("counted_bytes", "sum"),
        events=("ts", "size"),
        limit=("limit", "first"),
        level=("level", "first"),
    )
    summed = summed.reset_index().drop(columns="sample")
    summed.insert(0, "row_type", USAGE)
    summed.insert(1, "shard", shard_of(summed["entity"], settings.shards))
    for column in ("topic", "payload", "reason", "detail"):
        summed[column] = None
    summed["partition"] = -1
    summed["offset"] = -1
    ordered: pd.DataFrame = summed[STAGE_SCHEMA.names]
    return ordered


def _rejects(batch: pa.RecordBatch, rejected: pd.DataFrame) -> pa.RecordBatch:
    positions = pa.array(rejected["position"].to_numpy())
    count = len(rejected)
    columns = {
        "row_type": pa.array([REJECT] * count, pa.string()),
        # Rejects are not sharded: they all pass through the dead-letter group.
        "shard": pa.array([-1] * count, pa.int32()),
        "topic": batch.column("topic").take(positions),
        "partition": batch.column("partition").take(positions),
        "offset": batch.column("offset").take(positions),
        "payload": pa.array(rejected["payload"].tolist(), pa.binary()),
        "reason": pa.array(rejected["reason"].astype(str).tolist(), pa.string()),
        "detail": pa.array(rejected["detail"].tolist(), pa.string()),
    }
    arrays = [columns.get(field.name, pa.nulls(count, field.type)) for field in STAGE_SCHEMA]
    return pa.RecordBatch.from_arrays(arrays, schema=STAGE_SCHEMA)


#: What the stateful stage emits: each touched entity's latest decision, and rejects.
DECISION_SCHEMA = pa.schema(
    [
        ("row_type", pa.string()),
        ("quota", pa.string()),
        ("entity", pa.string()),
        ("ts", pa.int64()),
        ("rate", pa.float64()),
        ("limit", pa.float64()),
        ("throttle_ms", pa.int64()),
        ("exceeded", pa.bool_()),
        ("window_ms", pa.int64()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("payload", pa.binary()),
        ("reason", pa.string()),
        ("detail", pa.string()),
    ]
)


def update_shard(
    state: bytes | None, rows: pd.DataFrame, config: QuotaConfig, horizon_ms: int | None = None
) -> tuple[bytes, pd.DataFrame]:
    """Stage 2 for one shard: returns the new state and the decisions to emit.

    Entities whose windows are empty at ``horizon_ms`` (the oldest event time still accepted)
    are dropped from the state afterwards.
    """
    rejects = rows[rows["row_type"] == REJECT]
    usage = rows[rows["row_type"] == USAGE].sort_values("ts", kind="stable")
    core = QuotaCore(config) if state is None else QuotaCore.restore(config, state)
    decisions = pd.DataFrame(columns=DECISION_SCHEMA.names)
    if len(usage):
        resolved = pd.DataFrame(
            {
                "position": np.arange(len(usage)),
                "ts": usage["ts"].to_numpy(),
                "kind": usage["quota"].map(_KIND_OF_QUOTA).to_numpy(),
                "quota": usage["quota"].to_numpy(),
                "entity": usage["entity"].to_numpy(),
                "limit": usage["limit"].to_numpy(),
                "level": usage["level"].to_numpy(),
                "counted_bytes": usage["counted_bytes"].to_numpy(),
                "throttled": np.zeros(len(usage), dtype=np.bool_),
                "in_sync": np.zeros(len(usage), dtype=np.bool_),
            }
        )
        decided = core.record(resolved)
        latest = decided.assign(
            quota=decided["quota"].astype(str), entity=decided["entity"].astype(str)
        ).drop_duplicates(["quota", "entity"], keep="last")
        decisions = latest.assign(row_type=USAGE, limit=latest["limit"])
    out = pd.concat(
        [frame for frame in (decisions, rejects) if len(frame)] or [decisions],
        ignore_index=True,
    )
    for field in DECISION_SCHEMA.names:
        if field not in out:
            out[field] = None
    if horizon_ms is not None:
        core.evict_idle(horizon_ms)
    return core.encode_state(), out[DECISION_SCHEMA.names]
