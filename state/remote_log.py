"""Remote log size per partition and leader epoch (KIP-852), from remote segment lifecycle events.

Kafka's ``RemoteLogMetadataManager.remoteLogSize(partition, leaderEpoch)`` is the sum of the
sizes of the partition's remote segments in that leader epoch (0 for an unknown epoch), and
size-based retention compares ``local-only size + remote size`` with ``retention.bytes``.
:class:`RemoteLogSizes` keeps these sizes for the partitions of one state shard, from
``remote_segment`` events (``copy_finished`` and ``delete_finished``).

Model. Each segment, keyed by (topic, partition, segment_id), is *unknown*, *live* or a
*tombstone*; its leader epoch, size and copy time come from the event that created it:

* ``copy_finished`` of an unknown segment makes it live and adds its size to the totals;
* ``delete_finished`` of a live segment subtracts the size it was copied with and turns it into
  a tombstone; of an unknown segment, it records a tombstone (without a copy time);
* anything else (a repeated copy or delete, a copy after the delete) changes nothing.

So the final state of a segment is "tombstone if any delete arrived, else live if any copy
arrived": duplicated (at-least-once) and reordered events never count a segment twice, and any
split of a stream into batches gives the same sizes. A tombstone remembers the latest event time
of its segment; :meth:`RemoteLogSizes.evict_tombstones` forgets tombstones older than a horizon.
That is exact only while the engine rejects every event older than the same horizon (the event
validator's ``max_past_ms``): a copy event of a forgotten segment would make it live again.

Segments are ordered oldest first by the event time of their ``copy_finished``, ties broken by
``segment_id``; :func:`retention_breach` walks them in that order as Kafka's
``RemoteLogManager`` does for ``retention.bytes``.

Cost. Segment attributes are numpy columns (grown by doubling); each partition keeps its running
totals per epoch, the ids of its live segments and a dict from segment id to row. A batch is
grouped per segment with numpy (hash-based, no sort), then only segments whose liveness changed
touch the totals: O(1) amortised per event, and size queries are dict look-ups. Only
:meth:`RemoteLogSizes.evict_tombstones` and decoding walk every segment, and
:meth:`RemoteLogSizes.live_segments` sorts the partition's live segments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
ObjectArray = npt.NDArray[np.object_]

COPY_FINISHED = "copy_finished"
DELETE_FINISHED = "delete_finished"

#: ``copied_at`` of a tombstone whose ``copy_finished`` never arrived.
NOT_COPIED = np.iinfo(np.int64).min
_NO_EVENT = np.iinfo(np.int64).min

#: Columns of the frame :meth:`RemoteLogSizes.apply` returns.
CHANGE_COLUMNS = ("topic", "partition", "remote_bytes", "live_segments")
EVENT_COLUMNS = ("ts", "topic", "partition", "leader_epoch", "segment_id", "bytes", "state")

_INT32_MAX = 2**31 - 1
_FORMAT = b"quotastream.remote_log.1"
_SCHEMA = pa.schema(
    [
        ("topic", pa.dictionary(pa.int32(), pa.string())),
        ("partition", pa.int32()),
        ("segment_id", pa.string()),
        ("leader_epoch", pa.int32()),
        ("bytes", pa.int64()),
        ("copied_at", pa.int64()),  # null: a tombstone whose copy never arrived
        ("last_event_ts", pa.int64()),
        ("live", pa.bool_()),
    ]
)

_ArrayT = TypeVar("_ArrayT", bound=npt.NDArray[Any])


class RemoteLogDecodeError(ValueError):
    """Bytes that are not encoded remote log sizes of a version this code reads."""


def retention_breach(
    segment_ids: Sequence[str],
    sizes: npt.ArrayLike,
    remote_total: int,
    local_only_bytes: int,
    retention_bytes: int,
) -> list[str]:
    """Ids of the remote segments that size-based retention deletes, oldest first.

    ``segment_ids`` and ``sizes`` list a partition's live remote segments oldest first;
    ``remote_total`` is its remote log size and ``local_only_bytes`` the size of its segments not
    yet copied. As Kafka's ``RemoteLogManager``: nothing breaches unless ``retention_bytes`` is
    set (``-1`` disables it) and ``local_only_bytes + remote_total > retention_bytes``. Then, with
    ``remaining`` the breach, segments are taken oldest first while ``remaining > 0`` and
    ``remaining - size >= 0`` (subtracting each one taken), and the walk stops at the first segment
    that is not taken: a big old segment protects the younger ones behind it.
    """
    nbytes = np.asarray(sizes, dtype=np.int64)
    if nbytes.ndim != 1 or len(nbytes) != len(segment_ids):
        raise ValueError("segment_ids and sizes must be flat and of the same length")
    if (nbytes < 0).any() or remote_total < 0 or local_only_bytes < 0:
        raise ValueError("segment sizes, remote_total and local_only_bytes must be >= 0")
    if retention_bytes < 0:
        return []
    breach = local_only_bytes + remote_total - retention_bytes
    if breach <= 0:
        return []
    # Sizes are >= 0, so the walk's condition holds on a prefix: the segments whose cumulative
    # size fits in the breach, up to and including the one that makes ``remaining`` reach 0.
    cumulative = np.cumsum(nbytes)
    fits = int(np.searchsorted(cumulative, breach, side="right"))
    before_zero = int(np.searchsorted(cumulative, breach, side="left")) + 1
    return list(segment_ids[: min(fits, before_zero)])


@dataclass(slots=True)
class _Partition:
    """Running totals of one partition, its live segment ids and the rows of all its segments."""

    topic: str
    partition: int
    total: int = 0
    epoch_bytes: dict[int, int] = field(default_factory=dict)
    epoch_segments: dict[int, int] = field(default_factory=dict)
    live: set[str] = field(default_factory=set)
    rows: dict[str, int] = field(default_factory=dict)  # segment id -> row, tombstones too

    def add(self, segment_id: str, epoch: int, nbytes: int) -> None:
        self.total += nbytes
        self.epoch_bytes[epoch] = self.epoch_bytes.get(epoch, 0) + nbytes
        self.epoch_segments[epoch] = self.epoch_segments.get(epoch, 0) + 1
        self.live.add(segment_id)

    def remove(self, segment_id: str, epoch: int, nbytes: int) -> None:
        self.total -= nbytes
        left = self.epoch_segments[epoch] - 1
        if left:
            self.epoch_segments[epoch] = left
            self.epoch_bytes[epoch] -= nbytes
        else:
            # An epoch without live segments is unknown again (size 0), and takes no memory.
            del self.epoch_segments[epoch]
            del self.epoch_bytes[epoch]
        self.live.discard(segment_id)


@dataclass
class _Columns:
    """Per-segment attributes; rows ``[0, count)`` are in use, the rest is spare capacity."""

    partition_id: Int64Array
    segment_id: ObjectArray
    epoch: Int64Array
    nbytes: Int64Array
    copied_at: Int64Array
    last_ts: Int64Array
    live: BoolArray
    count: int

    @staticmethod
    def empty(capacity: int = 16) -> _Columns:
        return _Columns(
            partition_id=np.zeros(capacity, dtype=np.int64),
            segment_id=np.full(capacity, None, dtype=object),
            epoch=np.zeros(capacity, dtype=np.int64),
            nbytes=np.zeros(capacity, dtype=np.int64),
            copied_at=np.zeros(capacity, dtype=np.int64),
            last_ts=np.zeros(capacity, dtype=np.int64),
            live=np.zeros(capacity, dtype=np.bool_),
            count=0,
        )

    def append(
        self,
        partition_id: Int64Array,
        segment_id: ObjectArray,
        epoch: Int64Array,
        nbytes: Int64Array,
        copied_at: Int64Array,
    ) -> Int64Array:
        """Add rows (not live yet, no event time yet); returns their row numbers."""
        start, added = self.count, len(partition_id)
        needed = start + added
        if needed > len(self.live):
            capacity = max(needed, 2 * len(self.live))
            self.partition_id = _grown(self.partition_id, capacity)
            self.segment_id = _grown(self.segment_id, capacity)
            self.epoch = _grown(self.epoch, capacity)
            self.nbytes = _grown(self.nbytes, capacity)
            self.copied_at = _grown(self.copied_at, capacity)
            self.last_ts = _grown(self.last_ts, capacity)
            self.live = _grown(self.live, capacity)
        rows = slice(start, needed)
        self.partition_id[rows] = partition_id
        self.segment_id[rows] = segment_id
        self.epoch[rows] = epoch
        self.nbytes[rows] = nbytes
        self.copied_at[rows] = copied_at
        self.last_ts[rows] = _NO_EVENT
        self.live[rows] = False
        self.count = needed
        return np.arange(start, needed, dtype=np.int64)

    def compacted(self, keep: BoolArray, partition_of: Int64Array) -> _Columns:
        """The rows where ``keep``, with their partition ids mapped through ``partition_of``."""
        used = slice(0, self.count)
        return _Columns(
            partition_id=partition_of[self.partition_id[used][keep]],
            segment_id=self.segment_id[used][keep],
            epoch=self.epoch[used][keep],
            nbytes=self.nbytes[used][keep],
            copied_at=self.copied_at[used][keep],
            last_ts=self.last_ts[used][keep],
            live=self.live[used][keep],
            count=int(np.count_nonzero(keep)),
        )


class RemoteLogSizes:
    """Remote segments of one state shard and their sizes per partition and leader epoch."""

    def __init__(self) -> None:
        self._columns = _Columns.empty()
        self._partitions: list[_Partition] = []
        self._partition_ids: dict[tuple[str, int], int] = {}
        self._live_count = 0

    # ------------------------------------------------------------------ inspection
    def __len__(self) -> int:
        """Live segments."""
        return self._live_count

    @property
    def tombstones(self) -> int:
        """Deleted segments still remembered, so that their late events are ignored."""
        return self._columns.count - self._live_count

    def size(self, topic: str, partition: int, leader_epoch: int) -> int:
        """KIP-852 ``remoteLogSize``: bytes of the live segments of that epoch, 0 if none."""
        state = self._partition(topic, partition)
        return 0 if state is None else state.epoch_bytes.get(leader_epoch, 0)

    def partition_total(self, topic: str, partition: int) -> int:
        """Bytes of all live remote segments of the partition, 0 if none."""
        state = self._partition(topic, partition)
        return 0 if state is None else state.total

    def epoch_sizes(self, topic: str, partition: int) -> dict[int, int]:
        """``{leader epoch: bytes}`` of the epochs that have live segments, by epoch."""
        state = self._partition(topic, partition)
        return {} if state is None else dict(sorted(state.epoch_bytes.items()))

    def live_segments(self, topic: str, partition: int) -> pd.DataFrame:
        """The partition's live segments oldest first: ``segment_id``, ``leader_epoch``,
        ``bytes``, ``copied_at`` (event time of the copy, epoch ms)."""
        state = self._partition(topic, partition) or _Partition(topic, partition)
        rows = np.fromiter(
            (state.rows[segment_id] for segment_id in state.live),
            dtype=np.int64,
            count=len(state.live),
        )
        columns = self._columns
        rows = rows[np.lexsort((columns.segment_id[rows], columns.copied_at[rows]))]
        return pd.DataFrame(
            {
                "segment_id": columns.segment_id[rows],
                "leader_epoch": columns.epoch[rows],
                "bytes": columns.nbytes[rows],
                "copied_at": columns.copied_at[rows],
            }
        )

    def segments(self) -> pd.DataFrame:
        """Every remembered segment, live or tombstone, in storage order (for inspection).

        Columns: ``topic``, ``partition``, ``segment_id``, ``leader_epoch``, ``bytes``,
        ``copied_at`` (nullable), ``last_event_ts`` and ``live``.
        """
        columns, used = self._columns, slice(0, self._columns.count)
        partition_ids = columns.partition_id[used]
        owners = self._partitions
        copied_at = columns.copied_at[used]
        return pd.DataFrame(
            {
                "topic": np.array([owners[i].topic for i in partition_ids.tolist()], dtype=object),
                "partition": np.array(
                    [owners[i].partition for i in partition_ids.tolist()], dtype=np.int64
                ),
                "segment_id": columns.segment_id[used].copy(),
                "leader_epoch": columns.epoch[used].copy(),
                "bytes": columns.nbytes[used].copy(),
                "copied_at": pd.arrays.IntegerArray(copied_at.copy(), copied_at == NOT_COPIED),
                "last_event_ts": columns.last_ts[used].copy(),
                "live": columns.live[used].copy(),
            }
        )

    def retention_breach(
        self, topic: str, partition: int, local_only_bytes: int, retention_bytes: int
    ) -> list[str]:
        """:func:`retention_breach` for one partition's live segments."""
        live = self.live_segments(topic, partition)
        return retention_breach(
            live["segment_id"].tolist(),
            live["bytes"].to_numpy(dtype=np.int64),
            self.partition_total(topic, partition),
            local_only_bytes,
            retention_bytes,
        )

    # ------------------------------------------------------------------ updates
    def apply(self, events: pd.DataFrame) -> pd.DataFrame:
        """Apply a batch of ``remote_segment`` events in input order; the partitions it changed.

        ``events`` has :data:`EVENT_COLUMNS` (others are ignored). The result has one row per
        partition whose set of live segments changed, sorted, with :data:`CHANGE_COLUMNS`: its
        remote log size and live segment count after the batch.
        """
        batch = _Batch.of(events)
        if not batch.size:
            return _changes([])
        partition_id = self._partition_ids_of(batch.topic, batch.partition)
        # Keys are < 2**62: partition ids and segment codes are both below 2**31.
        segment_code = np.asarray(pd.factorize(batch.segment_id)[0], dtype=np.int64)
        key = partition_id * (int(segment_code.max()) + 1) + segment_code
        group = np.asarray(pd.factorize(key)[0], dtype=np.int64)
        first_event = _first_positions(group)

        count, positions = len(first_event), np.arange(batch.size, dtype=np.int64)
        first_copy = np.full(count, batch.size, dtype=np.int64)
        np.minimum.at(first_copy, group[batch.is_copy], positions[batch.is_copy])
        first_delete = np.full(count, batch.size, dtype=np.int64)
        np.minimum.at(first_delete, group[~batch.is_copy], positions[~batch.is_copy])
        last_ts = np.full(count, _NO_EVENT, dtype=np.int64)
        np.maximum.at(last_ts, group, batch.ts)

        segment_partition = partition_id[first_event]
        segment_id = batch.segment_id[first_event]
        rows = np.fromiter(
            (
                self._partitions[owner].rows.get(segment, -1)
                for owner, segment in zip(
                    segment_partition.tolist(), segment_id.tolist(), strict=True
                )
            ),
            dtype=np.int64,
            count=count,
        )
        columns = self._columns
        known = rows >= 0
        was_live = np.zeros(count, dtype=np.bool_)
        was_live[known] = columns.live[rows[known]]

        # An unknown segment is created by its first event in input order: a copy makes it
        # live; a delete makes a tombstone, after which the copy is ignored.
        new = ~known
        created_by_copy = new & (first_copy < first_delete)
        origin = np.where(created_by_copy, first_copy, first_delete)[new]
        new_rows = columns.append(
            segment_partition[new],
            segment_id[new],
            batch.epoch[origin],
            batch.nbytes[origin],
            np.where(created_by_copy[new], batch.ts[origin], NOT_COPIED),
        )
        rows[new] = new_rows
        for owner, segment, row in zip(
            segment_partition[new].tolist(),
            segment_id[new].tolist(),
            new_rows.tolist(),
            strict=True,
        ):
            self._partitions[owner].rows[segment] = row

        live = (was_live | created_by_copy) & (first_delete == batch.size)
        columns.live[rows] = live
        columns.last_ts[rows] = np.maximum(columns.last_ts[rows], last_ts)
        flipped = rows[live != was_live]
        for row, now_live in zip(flipped.tolist(), columns.live[flipped].tolist(), strict=True):
            owner = self._partitions[int(columns.partition_id[row])]
            args = (
                str(columns.segment_id[row]),
                int(columns.epoch[row]),
                int(columns.nbytes[row]),
            )
            if now_live:
                owner.add(*args)
            else:
                owner.remove(*args)
        self._live_count += int(np.count_nonzero(live) - np.count_nonzero(was_live))
        changed = np.unique(columns.partition_id[flipped])
        return _changes([self._partitions[i] for i in changed.tolist()])

    def evict_tombstones(self, horizon_ms: int) -> int:
        """Forget tombstones whose latest event is older than ``horizon_ms``; how many.

        Exact only if no event older than ``horizon_ms`` is applied later (the engine's event
        validator must reject them): a late ``copy_finished`` of a forgotten segment would be
        counted again. Partitions left without any segment are forgotten too. O(segments).
        """
        columns = self._columns
        used = slice(0, columns.count)
        keep = columns.live[used] | (columns.last_ts[used] >= horizon_ms)
        dropped = columns.count - int(np.count_nonzero(keep))
        if not dropped:
            return 0
        kept_partitions = np.unique(columns.partition_id[used][keep])
        partition_of = np.full(len(self._partitions), -1, dtype=np.int64)
        partition_of[kept_partitions] = np.arange(len(kept_partitions), dtype=np.int64)
        self._columns = columns.compacted(keep, partition_of)
        self._partitions = [self._partitions[i] for i in kept_partitions.tolist()]
        self._partition_ids = {
            (owner.topic, owner.partition): index for index, owner in enumerate(self._partitions)
        }
        self._index_rows()
        return dropped

    # ------------------------------------------------------------------ encoding
    def encode(self) -> bytes:
        """One Arrow IPC stream (zstd) with a row per segment; totals are rebuilt on decode."""
        columns, used = self._columns, slice(0, self._columns.count)
        owners = self._partitions
        partition_ids = columns.partition_id[used]
        topics = pa.array([owner.topic for owner in owners], pa.string()).dictionary_encode()
        copied_at = columns.copied_at[used]
        batch = pa.record_batch(
            [
                pa.DictionaryArray.from_arrays(
                    pa.array(topics.indices.to_numpy()[partition_ids].astype(np.int32), pa.int32()),
                    topics.dictionary,
                ),
                pa.array(
                    np.array([owner.partition for owner in owners], dtype=np.int32)[partition_ids],
                    pa.int32(),
                ),
                pa.array(columns.segment_id[used], pa.string()),
                pa.array(columns.epoch[used].astype(np.int32), pa.int32()),
                pa.array(columns.nbytes[used], pa.int64()),
                pa.array(copied_at, pa.int64(), mask=copied_at == NOT_COPIED),
                pa.array(columns.last_ts[used], pa.int64()),
                pa.array(columns.live[used], pa.bool_()),
            ],
            schema=_SCHEMA,
        )
        sink = pa.BufferOutputStream()
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        schema = _SCHEMA.with_metadata({b"format": _FORMAT})
        with pa.ipc.new_stream(sink, schema, options=options) as writer:
            writer.write_batch(batch)
        return bytes(sink.getvalue().to_pybytes())

    @classmethod
    def decode(cls, data: bytes) -> RemoteLogSizes:
        try:
            table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
            found = (table.schema.metadata or {}).get(b"format")
            same_schema = table.schema.remove_metadata().equals(_SCHEMA)
            if found == _FORMAT and same_schema:
                table.validate(full=True)
        # Damaged bytes can also surface as undecodable names (UnicodeDecodeError, a ValueError).
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise RemoteLogDecodeError(f"not encoded remote log sizes: {exc!r}") from None
        if found != _FORMAT:
            raise RemoteLogDecodeError(f"unsupported remote log sizes format {found!r}")
        if not same_schema:
            raise RemoteLogDecodeError(f"unexpected remote log sizes schema: {table.schema}")
        for name in _SCHEMA.names:
            if name != "copied_at" and table.column(name).null_count:
                raise RemoteLogDecodeError(f"remote log sizes column {name!r} has nulls")
        return cls._from_table(table)

    # ------------------------------------------------------------------ internals
    @classmethod
    def _from_table(cls, table: pa.Table) -> RemoteLogSizes:
        count = table.num_rows
        topic = np.asarray(table.column("topic").to_pandas(), dtype=object)
        partition = np.asarray(table.column("partition").to_numpy(), dtype=np.int64)
        copied = table.column("copied_at")
        copied_at = np.asarray(copied.fill_null(NOT_COPIED).to_numpy(), dtype=np.int64)
        nbytes = np.asarray(table.column("bytes").to_numpy(), dtype=np.int64)
        epoch = np.asarray(table.column("leader_epoch").to_numpy(), dtype=np.int64)
        live = np.asarray(table.column("live").to_numpy(), dtype=np.bool_)
        if (nbytes < 0).any() or (epoch < 0).any() or (partition < 0).any():
            raise RemoteLogDecodeError("negative partition, leader epoch or size")
        if (live & (copied_at == NOT_COPIED)).any():
            raise RemoteLogDecodeError("a live segment without a copy time")

        state = cls()
        partition_id = state._partition_ids_of(topic, partition)
        state._columns.append(
            partition_id,
            np.asarray(table.column("segment_id").to_numpy(), dtype=object),
            epoch,
            nbytes,
            copied_at,
        )
        columns = state._columns
        columns.last_ts[:count] = np.asarray(table.column("last_event_ts").to_numpy())
        columns.live[:count] = live
        state._index_rows()
        if sum(len(owner.rows) for owner in state._partitions) != count:
            raise RemoteLogDecodeError("a segment is listed twice")
        state._count_live()
        return state

    def _partition(self, topic: str, partition: int) -> _Partition | None:
        key = self._partition_ids.get((topic, partition))
        return None if key is None else self._partitions[key]

    def _partition_ids_of(self, topic: ObjectArray, partition: Int64Array) -> Int64Array:
        """Partition id of every row, registering the partitions seen for the first time."""
        if not len(topic):
            return np.zeros(0, dtype=np.int64)
        topic_code = np.asarray(pd.factorize(topic)[0], dtype=np.int64)
        # Kafka partitions are int32, so the key stays far below 2**63.
        group = np.asarray(pd.factorize(topic_code * (_INT32_MAX + 1) + partition)[0])
        first = _first_positions(group)
        ids = np.empty(len(first), dtype=np.int64)
        for index, pair in enumerate(
            zip(topic[first].tolist(), partition[first].tolist(), strict=True)
        ):
            known = self._partition_ids.get(pair)
            if known is None:
                known = self._partition_ids[pair] = len(self._partitions)
                self._partitions.append(_Partition(*pair))
            ids[index] = known
        return ids[group]

    def _index_rows(self) -> None:
        """Rebuild every partition's ``rows`` from the columns (after decoding or compacting)."""
        columns, used = self._columns, slice(0, self._columns.count)
        order = np.argsort(columns.partition_id[used], kind="stable")
        partition_id = columns.partition_id[used][order]
        segment_ids, rows = columns.segment_id[used][order].tolist(), order.tolist()
        starts, ends = _runs(partition_id)
        for owner, start, end in zip(
            partition_id[starts].tolist(), starts.tolist(), ends.tolist(), strict=True
        ):
            self._partitions[owner].rows = dict(
                zip(segment_ids[start:end], rows[start:end], strict=True)
            )

    def _count_live(self) -> None:
        """Rebuild the totals and live sets of fresh partitions from the live rows (decoding)."""
        columns, used = self._columns, slice(0, self._columns.count)
        live = np.flatnonzero(columns.live[used])
        live = live[np.lexsort((columns.epoch[live], columns.partition_id[live]))]
        partition_id, epoch = columns.partition_id[live], columns.epoch[live]
        segment_ids = columns.segment_id[live].tolist()
        starts, ends = _runs(partition_id, epoch)
        sums = np.add.reduceat(columns.nbytes[live], starts) if len(live) else starts
        for owner_id, run_epoch, run_bytes, start, end in zip(
            partition_id[starts].tolist(),
            epoch[starts].tolist(),
            sums.tolist(),
            starts.tolist(),
            ends.tolist(),
            strict=True,
        ):
            owner = self._partitions[owner_id]
            owner.epoch_bytes[run_epoch] = run_bytes
            owner.epoch_segments[run_epoch] = end - start
            owner.total += run_bytes
            owner.live.update(segment_ids[start:end])
        self._live_count = len(live)


@dataclass(frozen=True)
class _Batch:
    ts: Int64Array
    topic: ObjectArray
    partition: Int64Array
    epoch: Int64Array
    segment_id: ObjectArray
    nbytes: Int64Array
    is_copy: BoolArray

    @property
    def size(self) -> int:
        return len(self.ts)

    @staticmethod
    def of(events: pd.DataFrame) -> _Batch:
        missing = [name for name in EVENT_COLUMNS if name not in events.columns]
        if missing:
            raise ValueError(f"remote segment events lack columns {missing}")
        state = events["state"].to_numpy(dtype=object)
        is_copy = np.asarray(state == COPY_FINISHED, dtype=np.bool_)
        unknown = ~is_copy & (state != DELETE_FINISHED)
        if unknown.any():
            found = sorted({str(value) for value in state[unknown]})
            raise ValueError(f"unknown remote segment states {found} (only remote_segment events)")
        batch = _Batch(
            ts=events["ts"].to_numpy(dtype=np.int64),
            topic=events["topic"].to_numpy(dtype=object),
            partition=events["partition"].to_numpy(dtype=np.int64),
            epoch=events["leader_epoch"].to_numpy(dtype=np.int64),
            segment_id=events["segment_id"].to_numpy(dtype=object),
            nbytes=events["bytes"].to_numpy(dtype=np.int64),
            is_copy=is_copy,
        )
        for name, values in (("partition", batch.partition), ("leader_epoch", batch.epoch)):
            if ((values < 0) | (values > _INT32_MAX)).any():
                raise ValueError(f"remote segment {name} out of [0, 2**31)")
        if (batch.nbytes < 0).any():
            raise ValueError("remote segment bytes must be >= 0")
        return batch


def _changes(partitions: list[_Partition]) -> pd.DataFrame:
    partitions = sorted(partitions, key=lambda p: (p.topic, p.partition))
    return pd.DataFrame(
        {
            "topic": np.array([p.topic for p in partitions], dtype=object),
            "partition": np.array([p.partition for p in partitions], dtype=np.int64),
            "remote_bytes": np.array([p.total for p in partitions], dtype=np.int64),
            "live_segments": np.array([len(p.live) for p in partitions], dtype=np.int64),
        }
    )


def _first_positions(codes: Int64Array) -> Int64Array:
    """Where each code first occurs, for codes numbered in order of first occurrence (factorize)."""
    seen = np.maximum.accumulate(codes)
    return np.flatnonzero(np.diff(seen, prepend=-1) > 0)


def _runs(*keys: Int64Array) -> tuple[Int64Array, Int64Array]:
    """Start and end positions of the runs of equal key tuples in sorted ``keys``."""
    size = len(keys[0])
    changes = np.zeros(size, dtype=np.bool_)
    changes[:1] = True
    for key in keys:
        changes[1:] |= key[1:] != key[:-1]
    starts = np.flatnonzero(changes)
    ends = np.append(starts[1:], size).astype(np.int64)[: len(starts)]
    return starts, ends


def _grown(array: _ArrayT, capacity: int) -> _ArrayT:
    grown = np.zeros(capacity, dtype=array.dtype)
    grown[: len(array)] = array
    return grown  # type: ignore[return-value]
