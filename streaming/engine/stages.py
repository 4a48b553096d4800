"""The two Python stages of the streaming query, as plain functions over Arrow and pandas.

1. :func:`staged_batches` (in the Kafka source's ``read()``, on the executor that reads the
   records, no state): validates Kafka values, resolves each event's quota and entity, and sums
   the counted bytes and the requests (events' ``count``) per (quota, entity, sample), so raw
   payloads never cross into the JVM.
   Summing is exact: after a batch, windows and decisions depend only on the events, not on
   their order (``tests/test_rolling.py``). Rejected events pass through with their reason and
   their coordinates (topic, partition, offset, index in a batched message).
2. :func:`update_shard` (``applyInPandasWithState``, one group per shard): converts a shard's
   rows for :class:`~state.shard.Shard` (which records the usage, emits each touched entity's
   latest decision, keeps every pending throttle's release in a timing wheel that also wakes the
   shard when no events come, and the partitions' remote log sizes) and its outcome back, with
   the requests its usage stood for per quota (for the metrics).

Spark charges about a millisecond per state group and micro-batch, so a group is a shard of
many entities, not one entity.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

from quotastream.clock import SYSTEM_CLOCK, Clock
from quotastream.redis_contract import remote_log_value
from state.config import QuotaConfig
from state.core import QuotaCore
from state.event_contract import STORAGE_KINDS, EventKind
from state.events import EventBounds, parse_events
from state.live_config import ConfigVersions, LiveConfig, decision_mode
from state.quota_rules import is_exempt
from state.quota_types import QuotaType
from state.remote_log import LINEAGE
from state.shard import USAGE_COLUMNS, Shard, ShardSettings, ShardState, timer_counts
from state.timing_wheel import KAFKA_TICK_MS, KAFKA_WHEEL_SIZE
from state.written_decisions import WritePolicy
from streaming.engine.shard_layout import ShardLayout
from streaming.engine.source_records import (
    BYTES_PER_CHUNK,
    RECORDS_PER_CHUNK,
    STAGED_SCHEMA,
    KafkaRecords,
)

if TYPE_CHECKING:
    from streaming.engine.settings import EngineSettings

USAGE = "usage"  # a client's or broker's traffic, on its way to its shard
DECISION = "decision"  # an entity's latest decision (or the release of its throttle)
REJECT = "reject"
SEGMENT = "segment"  # a remote segment lifecycle event (KIP-852), on its way to its shard
REMOTE_LOG = "remote_log"  # a partition's remote log sizes, after a batch changed them
REQUESTS = "requests"  # a shard's requests of one quota in a micro-batch

#: Rows between the two stages: usage sums, and rejected events on their way to the dead letter.
STAGE_SCHEMA = pa.schema(
    [
        ("row_type", pa.string()),
        ("shard", pa.int32()),
        ("quota", pa.string()),
        ("entity", pa.string()),
        ("ts", pa.int64()),  # latest event time of the group
        ("counted_bytes", pa.int64()),
        ("requests", pa.int64()),  # usage: the summed events' count
        ("limit", pa.float64()),
        ("level", pa.int32()),
        ("partition_key", pa.string()),  # remote_copy: the uploading partition
        ("topic", pa.string()),  # rejects: where the payload came from
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("index", pa.int32()),  # rejects: the event's index in its batched message, else null
        ("payload", pa.binary()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("config_version", pa.int64()),  # the live configuration the row was decided with
        ("mode", pa.string()),  # state.live_config.Mode
        ("leader_epoch", pa.int32()),  # segments (with topic, partition, ts, counted_bytes)
        ("segment_id", pa.string()),
        ("segment_state", pa.string()),  # also LINEAGE: a leader_epochs report
        ("segment_epochs", pa.string()),  # JSON [[epoch, first offset], ...]; null: none given
        ("end_offset", pa.int64()),
        ("log_end_offset", pa.int64()),
    ]
)


@dataclass(frozen=True)
class StageSettings:
    config: QuotaConfig
    bounds: EventBounds  # absolute event-time bounds
    max_payload_bytes: int
    #: Events older than the wall clock by more than this are rejected, so no entity idle for
    #: longer can receive bytes again: its state can go (None: keep every entity).
    max_past_ms: int | None = None
    max_future_ms: int | None = None
    #: The wall clock the event-time bounds are measured from.
    clock: Clock = SYSTEM_CLOCK
    #: The throttle timers' wheel.
    timer_tick_ms: int = KAFKA_TICK_MS
    timer_wheel_size: int = KAFKA_WHEEL_SIZE
    #: Where later versions of the configuration are (None: ``config`` is the only version).
    live_configs: ConfigVersions | None = None
    #: Which decisions are written to Redis, and until when they stay.
    write_policy: WritePolicy = field(default_factory=WritePolicy)

    @staticmethod
    def of(
        settings: EngineSettings, config: QuotaConfig, live_configs: ConfigVersions | None = None
    ) -> StageSettings:
        """What the engine's query stages with: the engine settings' bounds, shards and timers."""
        return StageSettings(
            config=config,
            bounds=settings.events.bounds(None),
            max_payload_bytes=settings.events.max_payload_bytes,
            max_past_ms=settings.events.max_past_ms,
            max_future_ms=settings.events.max_future_ms,
            timer_tick_ms=settings.timers.tick_ms,
            timer_wheel_size=settings.timers.wheel_size,
            live_configs=live_configs,
            write_policy=settings.redis.write_policy(),
        )

    def live(self, version: int) -> LiveConfig:
        """The configuration a batch pinned; ``config`` (version 0) is the YAML file."""
        if self.live_configs is None:
            return LiveConfig(0, self.config)
        return self.live_configs.at(version)

    def now_ms(self) -> int:
        return self.clock.wall_ms()

    @property
    def shard(self) -> ShardSettings:
        return ShardSettings(
            self.config, self.timer_tick_ms, self.timer_wheel_size, self.write_policy
        )

    def eviction_horizon(self, now_ms: int) -> int | None:
        return None if self.max_past_ms is None else now_ms - self.max_past_ms


def shard_of(
    entities: pd.Series | npt.NDArray[np.object_], layout: ShardLayout, distinct: bool = False
) -> npt.NDArray[np.int32]:
    """A stable shard per entity key (the same in every process and run), as the group key the
    ``layout`` gives it. ``distinct``: no key recurs, so none is worth hashing once for all its
    rows (the hashes are the same)."""
    hashes = pd.util.hash_array(np.asarray(entities, dtype=object), categorize=not distinct)
    keys = np.array(layout.keys, dtype=np.int32)
    return keys[(hashes % np.uint64(layout.shards)).astype(np.intp)]


def staged_together(
    reads: Iterable[KafkaRecords],
    records: int = RECORDS_PER_CHUNK,
    value_bytes: int = BYTES_PER_CHUNK,
) -> Iterator[list[KafkaRecords]]:
    """Consecutive ``reads`` in groups of at least ``records`` records or ``value_bytes`` bytes
    of values (but the last), each group to stage in one :func:`staged_batches` call."""
    group: list[KafkaRecords] = []
    size = 0
    held = 0
    for read in reads:
        group.append(read)
        size += len(read.offsets)
        held += read.value_bytes
        if size >= records or held >= value_bytes:
            yield group
            group, size, held = [], 0, 0
    if group:
        yield group


def staged_batches(
    reads: Sequence[KafkaRecords], settings: StageSettings, layout: ShardLayout
) -> Iterator[pa.RecordBatch]:
    """Stage 1: Kafka records in, usage sums, segment events and rejects out (STAGE_SCHEMA),
    each usage and segment row with its shard's group key in the checkpoint's ``layout``.

    ``reads`` (of one micro-batch, so of one configuration version) are staged together: a
    staging pays pandas' and Arrow's costs per call, which a tiny batch read from several
    partitions would otherwise pay once per partition."""
    versions = {read.config_version for read in reads}
    if len(versions) > 1:
        raise ValueError(f"reads of several configuration versions: {sorted(versions)}")
    payloads = [value if value is not None else b"" for read in reads for value in read.values]
    bounds = settings.bounds.around(settings.now_ms(), settings.max_past_ms, settings.max_future_ms)
    parsed = parse_events(payloads, bounds, settings.max_payload_bytes)
    is_segment = parsed.accepted["kind"].isin(STORAGE_KINDS).to_numpy()
    if is_segment.any():
        segments = _segments(parsed.accepted[is_segment], layout)
        yield from arrow_rows(SEGMENT, segments, STAGE_SCHEMA)
    if len(parsed.accepted):
        version = versions.pop()
        live = settings.live(version)
        core = QuotaCore(live.config)
        usage = _usage(
            core.resolve(parsed.accepted),
            parsed.accepted["count"].to_numpy(),
            settings,
            core.config,
            version,
            layout=layout,
        )
        if len(usage):
            yield from arrow_rows(USAGE, usage, STAGE_SCHEMA)
    if len(parsed.rejected):
        yield from _rejects(reads, parsed.rejected)


def packed_by_shard(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """STAGE_SCHEMA batches as STAGED_SCHEMA: a row per shard (more for a shard whose rows
    exceed :data:`PACK_BYTES`), holding its rows packed (:func:`shard_rows` unpacks them)."""
    table = pa.Table.from_batches(list(batches), STAGE_SCHEMA)
    if not table.num_rows:
        return
    shards = table.column("shard").to_numpy()
    order = np.argsort(shards, kind="stable")
    by_shard = table.take(order)
    ids, starts = np.unique(shards[order], return_index=True)
    ends = [*starts[1:], table.num_rows]
    pieces = [
        (int(shard), piece)
        for shard, start, end in zip(ids, starts, ends, strict=True)
        for piece in bounded(by_shard.slice(start, end - start))
    ]
    first = 0
    for packed in arrow_streams(piece for _, piece in pieces):
        owners = [shard for shard, _ in pieces[first : first + len(packed)]]
        first += len(packed)
        yield pa.RecordBatch.from_arrays(
            [pa.array(owners, pa.int32()), packed], schema=STAGED_SCHEMA
        )


def shard_rows(packed: Iterable[bytes]) -> pd.DataFrame:
    """One shard's packed STAGE_SCHEMA rows (:func:`packed_by_shard`) as one frame, integer
    columns with nulls as objects (as :func:`update_shard` takes them)."""
    batches = [batch for blob in packed for batch in stream_batches(blob)]
    rows: pd.DataFrame = pa.Table.from_batches(batches, STAGE_SCHEMA).to_pandas(
        integer_object_nulls=True
    )
    return rows


#: At most this many bytes of Arrow data in one pack (unless one row has more), and about as
#: many in one batch of packs: a pack is a binary value in Spark, and an Arrow binary column
#: addresses at most 2 GiB.
PACK_BYTES = 64 << 20
BATCH_OF_PACKS_BYTES = 1 << 30
#: Packs are LZ4-compressed: a usage row is mostly columns that only other row types fill
#: (110 MB of 632k rows -> 17 MB), and every byte crosses into the JVM, its shuffle and out.
PACK_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")


def bounded(table: pa.Table) -> Iterator[pa.Table]:
    """``table`` in consecutive slices of at most :data:`PACK_BYTES` (or one row)."""
    if table.nbytes <= PACK_BYTES or table.num_rows <= 1:
        yield table
        return
    half = table.num_rows // 2
    yield from bounded(table.slice(0, half))
    yield from bounded(table.slice(half))


def arrow_streams(tables: Iterable[pa.Table]) -> Iterator[pa.BinaryArray]:
    """Each table as one Arrow IPC stream (:func:`stream_batches` reads one), in binary arrays
    of about :data:`BATCH_OF_PACKS_BYTES` at most. The streams are written one after another
    into the arrays' data buffer, never copied one by one."""
    sink, ends = pa.BufferOutputStream(), [0]
    for table in tables:
        with pa.ipc.new_stream(sink, table.schema, options=PACK_OPTIONS) as writer:
            writer.write_table(table)
        ends.append(sink.tell())
        if ends[-1] >= BATCH_OF_PACKS_BYTES:
            yield _binary_array(ends, sink.getvalue())
            sink, ends = pa.BufferOutputStream(), [0]
    if len(ends) > 1:
        yield _binary_array(ends, sink.getvalue())


def _binary_array(ends: list[int], data: pa.Buffer) -> pa.BinaryArray:
    offsets = pa.array(ends, pa.int32()).buffers()[1]
    array: pa.BinaryArray = pa.Array.from_buffers(pa.binary(), len(ends) - 1, [None, offsets, data])
    return array


def stream_batches(packed: bytes | bytearray | pa.Buffer) -> list[pa.RecordBatch]:
    """The record batches of an Arrow IPC stream."""
    return list(pa.ipc.open_stream(pa.py_buffer(packed)))


def _usage(
    resolved: pd.DataFrame,
    requests: npt.NDArray[np.int64],
    settings: StageSettings,
    config: QuotaConfig,
    version: int,
    *,
    layout: ShardLayout,
) -> pd.DataFrame:
    """Resolved events (with each one's ``requests``, row for row) summed per (quota, entity,
    partition key, sample), grouped by their category codes: strings are looked up for the sums
    only."""
    quota = resolved["quota"].cat
    entity = resolved["entity"].cat
    partition = resolved["partition_key"].cat
    quota_codes = quota.codes.to_numpy()
    measured = quota_codes >= 0
    windows = np.array(
        [settings.config.quota_types.of(QuotaType(name)).window_ms for name in quota.categories],
        dtype=np.int64,
    )
    ts = resolved["ts"].to_numpy()[measured]
    frame = pd.DataFrame(
        {
            "quota": quota_codes[measured],
            "entity": entity.codes.to_numpy()[measured],
            # remote_copy is summed per partition too: the fair wait needs each one's usage.
            "partition_key": partition.codes.to_numpy()[measured],
            "sample": ts // windows[quota_codes[measured]],
            "ts": ts,
            "counted_bytes": resolved["counted_bytes"].to_numpy()[measured],
            "requests": requests[measured],
            "limit": resolved["limit"].to_numpy()[measured],
            "level": resolved["level"].to_numpy()[measured],
        },
        copy=False,
    )
    keys = ["quota", "entity", "partition_key", "sample"]
    summed = (
        frame.groupby(keys, sort=False)
        .agg(
            ts=("ts", "max"),
            counted_bytes=("counted_bytes", "sum"),
            requests=("requests", "sum"),
            limit=("limit", "first"),
            level=("level", "first"),
        )
        .reset_index()
    )
    summed["quota"] = quota.categories.to_numpy(dtype=object)[summed["quota"].to_numpy()]
    entity_codes = summed["entity"].to_numpy()
    entities = entity.categories.to_numpy(dtype=object)
    summed["entity"] = entities[entity_codes]
    # Code -1 (no partition) indexes the appended None.
    partitions = np.concatenate(
        [partition.categories.to_numpy(dtype=object), np.array([None], dtype=object)]
    )
    summed["partition_key"] = partitions[summed["partition_key"].to_numpy()]
    summed["mode"] = _modes(summed, config)
    summed["config_version"] = version
    summed = summed.drop(columns="sample")
    shards = shard_of(entities, layout, distinct=True)[entity_codes]
    summed.insert(0, "shard", shards)
    return summed


def _segments(events: pd.DataFrame, layout: ShardLayout) -> pd.DataFrame:
    """Segment events and lineage reports as stage rows, sharded by partition so that one shard
    keeps its sizes."""
    partition_keys = (
        "topic=" + events["topic"].astype(str) + ",partition=" + events["partition"].astype(str)
    )
    rows = pd.DataFrame(
        {
            "shard": shard_of(partition_keys, layout),
            "ts": events["ts"].to_numpy(),
            "counted_bytes": events["bytes"].to_numpy(),
            "topic": events["topic"].to_numpy(),
            "partition": events["partition"].to_numpy(),
            "leader_epoch": events["leader_epoch"].to_numpy(),
            "segment_id": events["segment_id"].to_numpy(),
            "segment_state": np.where(
                (events["kind"] == EventKind.LEADER_EPOCHS).to_numpy(),
                LINEAGE,
                events["state"].to_numpy(dtype=object),
            ),
            "segment_epochs": np.array(
                [None if e is None else json.dumps(e) for e in events["epochs"].tolist()],
                dtype=object,
            ),
            "end_offset": events["end_offset"].to_numpy(),
            "log_end_offset": events["log_end_offset"].to_numpy(),
        }
    )
    return rows


def arrow_rows(row_type: str, rows: pd.DataFrame, schema: pa.Schema) -> list[pa.RecordBatch]:
    """``rows``, all of ``row_type``, as ``schema``'s record batches: the columns it has,
    converted one by one (a whole-frame ``from_pandas`` costs milliseconds per call in its
    bookkeeping, paid for each small frame of each shard); the others (and its all-None ones)
    null. The row type and the nulls are made in Arrow: as pandas objects, Arrow would check
    each one (about 1 s of a batch at 1M clients for the nulls, docs/streaming.md; 7 ms of a
    shard's 49k decisions for the row type)."""
    size = len(rows)
    columns = [
        row_types(row_type, size)
        if field.name == "row_type"
        else pa.array(rows[field.name], type=field.type, from_pandas=True)
        if field.name in rows and not _all_none(rows[field.name])
        else pa.nulls(size, field.type)
        for field in schema
    ]
    # A table: a column over 2 GiB (rejected payloads) converts to a chunked array.
    batches: list[pa.RecordBatch] = pa.Table.from_arrays(columns, schema=schema).to_batches()
    return batches


def row_types(row_type: str, count: int) -> pa.Array:
    """The ``row_type`` column of ``count`` rows of that type."""
    return pa.repeat(pa.scalar(row_type, pa.string()), count)


def _all_none(column: pd.Series) -> bool:
    # The first value settles most columns without a pass over all of them.
    return (
        column.dtype == object
        and (column.empty or pd.isna(column.iat[0]))
        and bool(column.isna().all())
    )


def _modes(resolved: pd.DataFrame, config: QuotaConfig) -> npt.NDArray[np.object_]:
    """Each row's :class:`Mode`; an entity resolved to an exempt level is unlimited there."""
    exempt = is_exempt(
        resolved["level"].to_numpy(dtype=np.int64), resolved["limit"].to_numpy(dtype=np.float64)
    )
    quota = resolved["quota"].astype(str).to_numpy()
    modes = np.empty(len(resolved), dtype=object)
    for quota_type in QuotaType:
        rows = quota == quota_type.value
        for exempt_here in (False, True):
            modes[rows & (exempt == exempt_here)] = decision_mode(
                config, quota_type, exempt_here
            ).value
    return modes


def _rejects(reads: Sequence[KafkaRecords], rejected: pd.DataFrame) -> list[pa.RecordBatch]:
    """Rejected events with where each came from (``position``: its record among ``reads``')."""
    count = len(rejected)
    positions = rejected["position"].to_numpy()
    sizes = [len(read.offsets) for read in reads]
    read_of = np.repeat(np.arange(len(reads)), sizes)[positions]
    topics = np.array([read.topic for read in reads], dtype=object)[read_of]
    partitions = np.array([read.partition for read in reads], dtype=np.int32)[read_of]
    offsets = np.concatenate([np.asarray(read.offsets, dtype=np.int64) for read in reads])[
        positions
    ]
    index = rejected["index"].to_numpy()
    columns = {
        "row_type": row_types(REJECT, count),
        # Rejects are not sharded: they all pass through the dead-letter group.
        "shard": pa.array(np.full(count, -1, dtype=np.int32)),
        "topic": pa.array(topics, pa.string()),
        "partition": pa.array(partitions),
        "offset": pa.array(offsets),
        "index": pa.array(index.astype(np.int32), mask=index < 0),
        "payload": pa.array(rejected["payload"].tolist(), pa.binary()),
        "reason": pa.array(rejected["reason"].astype(str).tolist(), pa.string()),
        "detail": pa.array(rejected["detail"].tolist(), pa.string()),
    }
    arrays = [columns.get(field.name, pa.nulls(count, field.type)) for field in STAGE_SCHEMA]
    # A table: payloads over 2 GiB in all convert to a chunked array.
    batches: list[pa.RecordBatch] = pa.Table.from_arrays(arrays, schema=STAGE_SCHEMA).to_batches()
    return batches


#: What the stateful stage emits: each touched entity's latest decision (or the release of its
#: throttle), each touched shard's timer counts and requests per quota, remote log sizes, and
#: rejects.
DECISION_SCHEMA = pa.schema(
    [
        ("row_type", pa.string()),
        ("quota", pa.string()),
        ("entity", pa.string()),
        ("ts", pa.int64()),
        ("rate", pa.float64()),
        ("limit", pa.float64()),
        ("throttle_ms", pa.int64()),
        ("until", pa.int64()),
        ("exceeded", pa.bool_()),
        ("window_ms", pa.int64()),
        ("config_version", pa.int64()),
        ("mode", pa.string()),  # state.live_config.Mode: only "enforced" decisions bind
        ("released_at", pa.int64()),  # null while a throttle is pending
        ("notice", pa.string()),  # why a pending throttle ended in this batch
        ("write", pa.bool_()),  # whether Redis needs the decision (state/written_decisions.py)
        ("expire_at", pa.int64()),  # when its key expires, if written
        ("shard", pa.int32()),  # timers rows
        ("timers_pending", pa.int64()),
        ("timers_fired", pa.int64()),
        ("timers_cancelled", pa.int64()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("index", pa.int32()),
        ("payload", pa.binary()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        # remote_log rows: the partition's Redis value (quotastream.redis_contract), null once it
        # has no segments; and its total (RemoteLogSizeBytes, 0 then).
        ("remote_log", pa.binary()),
        ("remote_log_bytes", pa.int64()),
        ("requests", pa.int64()),  # requests rows (with quota)
    ]
)
TIMERS = "timers"
#: What the stateful stage hands Spark: each shard's DECISION_SCHEMA rows as one Arrow IPC
#: stream, so that Spark moves one value per shard instead of converting each of its rows
#: (pandas, Arrow and Spark's own rows, out of the shard and again into the sink).
PACKED_SCHEMA = pa.schema([("rows", pa.binary())])


@dataclass(frozen=True)
class ShardUpdate:
    state: ShardState | None  # None for the dead-letter group, which keeps no state
    #: DECISION_SCHEMA record batches: each kind of row converted to Arrow on its own
    #: (concatenating frames of different columns costs pandas a check per value).
    batches: list[pa.RecordBatch]
    #: When the shard's earliest pending timer bucket is due (None: no timers).
    wake_at_ms: int | None

    def packed(self) -> pd.DataFrame:
        """The batches as PACKED_SCHEMA rows, one unless they exceed :data:`PACK_BYTES`
        (:func:`unpacked` reads them)."""
        table = pa.Table.from_batches(self.batches, DECISION_SCHEMA)
        packs = [pack for packed in arrow_streams(bounded(table)) for pack in packed.to_pylist()]
        return pd.DataFrame({"rows": packs})

    @property
    def rows(self) -> pd.DataFrame:
        """All its rows in one frame, typed as Spark types them (for tests and tools)."""
        rows: pd.DataFrame = pa.Table.from_batches(self.batches, DECISION_SCHEMA).to_pandas()
        return rows


def unpacked(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The DECISION_SCHEMA rows of PACKED_SCHEMA batches (:meth:`ShardUpdate.packed`): one
    batch for each batch of packed shards."""
    for batch in batches:
        inner = [
            rows for packed in batch.column("rows") for rows in stream_batches(packed.as_buffer())
        ]
        if inner:
            yield from pa.Table.from_batches(inner, DECISION_SCHEMA).combine_chunks().to_batches()


def update_shard(
    state: ShardState | None,
    rows: pd.DataFrame,
    settings: StageSettings,
    shard: int,
    now_ms: int,
) -> ShardUpdate:
    """Stage 2 for one shard at the micro-batch time ``now_ms``: STAGE_SCHEMA rows to the
    shard's step (:meth:`state.shard.Shard.step`), and its outcome as DECISION_SCHEMA rows.
    Rejects pass through; the dead-letter group (shard -1) only passes them through."""
    row_type = rows["row_type"].to_numpy(dtype=object)
    rejects = rows[row_type == REJECT]
    if shard < 0:
        return ShardUpdate(None, _decision_rows({REJECT: rejects}), None)
    is_usage = row_type == USAGE
    # The usage columns only: the others are null in usage rows, costly to copy as objects.
    usage = rows.loc[is_usage, list(USAGE_COLUMNS)]
    requests = rows["requests"].to_numpy()[is_usage]
    segments = rows[row_type == SEGMENT]
    step = Shard.restore(state, settings.shard, now_ms).step(
        now_ms,
        usage,
        pd.DataFrame(
            {
                "ts": segments["ts"].to_numpy(dtype=np.int64),
                "topic": segments["topic"].to_numpy(dtype=object),
                "partition": segments["partition"].to_numpy(dtype=np.int64),
                "leader_epoch": segments["leader_epoch"].to_numpy(dtype=np.int64),
                "segment_id": segments["segment_id"].to_numpy(dtype=object),
                "bytes": segments["counted_bytes"].to_numpy(dtype=np.int64),
                "state": segments["segment_state"].to_numpy(dtype=object),
                "epochs": _epochs(segments["segment_epochs"]),
                "end_offset": segments["end_offset"].to_numpy(dtype=np.int64),
                "log_end_offset": segments["log_end_offset"].to_numpy(dtype=np.int64),
            }
        ),
        settings.eviction_horizon(now_ms),
    )
    counts = pd.DataFrame(
        {"shard": [shard]} | {name: [count] for name, count in timer_counts(step.timers).items()}
    )
    remote_logs = step.remote_logs
    # None: the partition's last segment is gone, and so is its key.
    logs = remote_logs["remote_log"].tolist()
    values = np.array([None if log is None else remote_log_value(log) for log in logs], object)
    totals = np.array([0 if log is None else log.total for log in logs], np.int64)
    parts = {
        DECISION: step.decisions,
        TIMERS: counts,
        REQUESTS: _requests(usage["quota"], requests),
        REMOTE_LOG: remote_logs.assign(remote_log=values, remote_log_bytes=totals),
        REJECT: rejects,
    }
    return ShardUpdate(step.state, _decision_rows(parts), step.wake_at_ms)


def _requests(quota: pd.Series, requests: npt.NDArray[np.int64]) -> pd.DataFrame:
    """The requests of a shard's usage rows (their ``quota`` and ``requests``), per quota."""
    per_quota = (
        pd.Series(requests.astype(np.int64, copy=False))
        .groupby(quota.to_numpy(dtype=object), sort=False)
        .sum()
    )
    return pd.DataFrame(
        {
            "quota": per_quota.index.to_numpy(dtype=object),
            "requests": per_quota.to_numpy(dtype=np.int64),
        }
    )


def _epochs(column: pd.Series) -> npt.NDArray[np.object_]:
    epochs = np.empty(len(column), dtype=object)
    epochs[:] = [
        None if pd.isna(text) else tuple(map(tuple, json.loads(text))) for text in column.tolist()
    ]
    return epochs


def _decision_rows(parts: Mapping[str, pd.DataFrame]) -> list[pa.RecordBatch]:
    """The non-empty ``parts`` (by row type) as DECISION_SCHEMA record batches."""
    return [
        batch
        for row_type, part in parts.items()
        if len(part)
        for batch in arrow_rows(row_type, part, DECISION_SCHEMA)
    ]
