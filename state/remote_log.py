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
of its segment; :meth:`RemoteLogSizes.evict_tombstones` forgets tombstones older than a horizon
(the event validator's ``max_past_ms``). The validator accepts segment events of any age (they
state what the remote store holds), so a copy event of a forgotten segment would make it live
again: exact while no copy event comes later than the horizon after its segment's delete, which
a publisher that sends each segment's events in Kafka's order, and resumes from a position
committed after them, guarantees (``quotastream.brokers``).

A segment lists its leader epochs with their first offsets (``segmentLeaderEpochs``; one epoch
from offset 0 when the event gives none) and is counted under each of them by :meth:`size`, as
``RemoteLogMetadataManager.remoteLogSize`` does. ``leader_epochs`` reports give each partition its
lineage (the broker's leader-epoch checkpoint and log end offset; the newest report wins): then
:meth:`RemoteLogSizes.retention` sizes and orders the segments as Kafka's ``RemoteLogManager``
does for ``retention.bytes`` (``state/leader_epochs.py``), counting only segments within the
lineage. Without a report, every live segment counts, oldest copy first (by the event time of
its ``copy_finished``, ties broken by ``segment_id``).

Cost. Segment attributes are numpy columns (grown by doubling); each partition keeps its running
totals per epoch, the ids of its live segments and a dict from segment id to row. A batch is
grouped per segment with numpy (hash-based, no sort), then only segments whose liveness changed
touch the totals: O(1) amortised per event, and size queries are dict look-ups. Only
:meth:`RemoteLogSizes.evict_tombstones` and decoding walk every segment, and
:meth:`RemoteLogSizes.live_segments` sorts the partition's live segments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

from state.leader_epochs import Epochs, RemoteSegment, Retention, breach, epochs_of, retention

Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
ObjectArray = npt.NDArray[np.object_]

COPY_FINISHED = "copy_finished"
DELETE_FINISHED = "delete_finished"
#: The ``state`` of a row that reports a partition's leader-epoch lineage (``leader_epochs``).
LINEAGE = "leader_epochs"

#: ``copied_at`` of a tombstone whose ``copy_finished`` never arrived.
NOT_COPIED = np.iinfo(np.int64).min
_NO_EVENT = np.iinfo(np.int64).min

#: Columns of the frame :meth:`RemoteLogSizes.apply` returns.
CHANGE_COLUMNS = ("topic", "partition", "remote_bytes", "live_segments")
EVENT_COLUMNS = (
    "ts",
    "topic",
    "partition",
    "leader_epoch",
    "segment_id",
    "bytes",
    "state",  # copy_finished, delete_finished, or LINEAGE
    "epochs",  # Epochs: a segment's segmentLeaderEpochs (None: its leader_epoch from 0), a lineage
    "end_offset",  # a segment's last offset, -1 unknown
    "log_end_offset",  # a lineage report's log end offset
)

_INT32_MAX = 2**31 - 1
_FORMAT = b"quotastream.remote_log.2"
_FORMAT_1 = b"quotastream.remote_log.1"  # no segment epochs, end offsets or lineage
_EPOCHS = pa.list_(pa.struct([("epoch", pa.int32()), ("offset", pa.int64())]))
_SCHEMA_1 = pa.schema(
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
_SCHEMA = _SCHEMA_1.append(pa.field("epochs", _EPOCHS)).append(pa.field("end_offset", pa.int64()))

_ArrayT = TypeVar("_ArrayT", bound=npt.NDArray[Any])


class RemoteLogDecodeError(ValueError):
    """Bytes that are not encoded remote log sizes of a version this code reads."""


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
    #: The newest ``leader_epochs`` report: (ts, log end offset, lineage), or None.
    lineage: tuple[int, int, Epochs] | None = None

    def add(self, segment_id: str, epochs: Epochs, nbytes: int) -> None:
        self.total += nbytes
        # remoteLogSize(partition, epoch) lists a segment under each of its epochs.
        for epoch, _ in epochs:
            self.epoch_bytes[epoch] = self.epoch_bytes.get(epoch, 0) + nbytes
            self.epoch_segments[epoch] = self.epoch_segments.get(epoch, 0) + 1
        self.live.add(segment_id)

    def remove(self, segment_id: str, epochs: Epochs, nbytes: int) -> None:
        self.total -= nbytes
        for epoch, _ in epochs:
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
    epochs: ObjectArray  # Epochs
    end_offset: Int64Array
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
            epochs=np.full(capacity, None, dtype=object),
            end_offset=np.zeros(capacity, dtype=np.int64),
            count=0,
        )

    def append(
        self,
        partition_id: Int64Array,
        segment_id: ObjectArray,
        *,
        epoch: Int64Array,
        nbytes: Int64Array,
        copied_at: Int64Array,
        epochs: ObjectArray,
        end_offset: Int64Array,
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
            self.epochs = _grown(self.epochs, capacity)
            self.end_offset = _grown(self.end_offset, capacity)
        rows = slice(start, needed)
        self.partition_id[rows] = partition_id
        self.segment_id[rows] = segment_id
        self.epoch[rows] = epoch
        self.nbytes[rows] = nbytes
        self.copied_at[rows] = copied_at
        self.last_ts[rows] = _NO_EVENT
        self.live[rows] = False
        self.epochs[rows] = epochs
        self.end_offset[rows] = end_offset
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
            epochs=self.epochs[used][keep],
            end_offset=self.end_offset[used][keep],
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
        """KIP-852 ``remoteLogSize``: bytes of the live segments listed under that epoch (a
        segment spanning several epochs under each), 0 if none."""
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
        ``bytes``, ``copied_at`` (event time of the copy, epoch ms), ``epochs`` (its
        :data:`~state.leader_epochs.Epochs`) and ``end_offset`` (-1 unknown)."""
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
                "epochs": columns.epochs[rows],
                "end_offset": columns.end_offset[rows],
            }
        )

    def lineage(self, topic: str, partition: int) -> tuple[int, Epochs] | None:
        """The newest reported (log end offset, lineage) of the partition, or None."""
        state = self._partition(topic, partition)
        if state is None or state.lineage is None:
            return None
        _, log_end_offset, lineage = state.lineage
        return log_end_offset, lineage

    def retention(self, topic: str, partition: int) -> Retention:
        """What size-based retention counts and walks (``state/leader_epochs.py``): with a
        reported lineage, Kafka's; without, every live segment, oldest copy first."""
        live = self.live_segments(topic, partition)
        segments = [
            RemoteSegment(str(segment_id), int(nbytes), epochs, int(end_offset))
            for segment_id, nbytes, epochs, end_offset in zip(
                live["segment_id"], live["bytes"], live["epochs"], live["end_offset"], strict=True
            )
        ]
        reported = self.lineage(topic, partition)
        if reported is None:
            return Retention(
                order=tuple((segment, True) for segment in segments),
                size=self.partition_total(topic, partition),
            )
        log_end_offset, lineage = reported
        return retention(segments, lineage, log_end_offset)

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
        """Ids of the segments size-based retention deletes (:func:`state.leader_epochs.breach`
        over :meth:`retention`)."""
        sized = self.retention(topic, partition)
        walk = [(segment.segment_id, segment.size, within) for segment, within in sized.order]
        return breach(walk, sized.size, local_only_bytes, retention_bytes)

    # ------------------------------------------------------------------ updates
    def apply(self, events: pd.DataFrame) -> pd.DataFrame:
        """Apply a batch of ``remote_segment`` and ``leader_epochs`` events in input order; the
        partitions it changed.

        ``events`` has :data:`EVENT_COLUMNS` (others are ignored). The result has one row per
        partition whose set of live segments or lineage changed, sorted, with
        :data:`CHANGE_COLUMNS`: its remote log size and live segment count after the batch.
        """
        missing = [name for name in EVENT_COLUMNS if name not in events.columns]
        if missing:
            raise ValueError(f"remote segment events lack columns {missing}")
        is_lineage = np.asarray(events["state"].to_numpy(dtype=object) == LINEAGE, np.bool_)
        reported = self._report_lineage(events[is_lineage]) if is_lineage.any() else set()
        changed = reported | self._apply_segments(events[~is_lineage])
        return _changes([self._partitions[i] for i in sorted(changed)])

    def _report_lineage(self, reports: pd.DataFrame) -> set[int]:
        """Keeps each partition's newest lineage report (by ts, then log end offset, then the
        lineage itself: any order of the same reports keeps the same); the ids that changed."""
        partition_id = self._partition_ids_of(
            reports["topic"].to_numpy(dtype=object), reports["partition"].to_numpy(dtype=np.int64)
        )
        changed: set[int] = set()
        for owner_id, ts, log_end_offset, lineage in zip(
            partition_id.tolist(),
            reports["ts"].to_numpy(dtype=np.int64).tolist(),
            reports["log_end_offset"].to_numpy(dtype=np.int64).tolist(),
            reports["epochs"].tolist(),
            strict=True,
        ):
            owner = self._partitions[owner_id]
            report = (ts, log_end_offset, epochs_of(lineage))
            if owner.lineage is None or report > owner.lineage:
                owner.lineage = report
                changed.add(owner_id)
        return changed

    def _apply_segments(self, events: pd.DataFrame) -> set[int]:
        batch = _Batch.of(events)
        if not batch.size:
            return set()
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
            epoch=batch.epoch[origin],
            nbytes=batch.nbytes[origin],
            copied_at=np.where(created_by_copy[new], batch.ts[origin], NOT_COPIED),
            epochs=batch.epochs[origin],
            end_offset=batch.end_offset[origin],
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
            args = (str(columns.segment_id[row]), columns.epochs[row], int(columns.nbytes[row]))
            if now_live:
                owner.add(*args)
            else:
                owner.remove(*args)
        self._live_count += int(np.count_nonzero(live) - np.count_nonzero(was_live))
        return set(np.unique(columns.partition_id[flipped]).tolist())

    def evict_tombstones(self, horizon_ms: int) -> int:
        """Forget tombstones whose latest event is older than ``horizon_ms``; how many.

        Exact only if no event older than ``horizon_ms`` is applied later (the engine's event
        validator must reject them): a late ``copy_finished`` of a forgotten segment would be
        counted again. Partitions left without any segment or lineage are forgotten too.
        O(segments).
        """
        columns = self._columns
        used = slice(0, columns.count)
        keep = columns.live[used] | (columns.last_ts[used] >= horizon_ms)
        dropped = columns.count - int(np.count_nonzero(keep))
        if not dropped:
            return 0
        reported = [i for i, owner in enumerate(self._partitions) if owner.lineage is not None]
        kept_partitions = np.union1d(
            columns.partition_id[used][keep], np.array(reported, dtype=np.int64)
        )
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
                pa.array(
                    [
                        [{"epoch": e, "offset": o} for e, o in epochs]
                        for epochs in columns.epochs[used]
                    ],
                    _EPOCHS,
                ),
                pa.array(columns.end_offset[used], pa.int64()),
            ],
            schema=_SCHEMA,
        )
        sink = pa.BufferOutputStream()
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        lineages = [
            [owner.topic, owner.partition, *owner.lineage[:2], owner.lineage[2]]
            for owner in owners
            if owner.lineage is not None
        ]
        schema = _SCHEMA.with_metadata(
            {b"format": _FORMAT, b"lineage": json.dumps(lineages, separators=(",", ":"))}
        )
        with pa.ipc.new_stream(sink, schema, options=options) as writer:
            writer.write_batch(batch)
        return bytes(sink.getvalue().to_pybytes())

    @classmethod
    def decode(cls, data: bytes) -> RemoteLogSizes:
        """Sizes from :meth:`encode`'s bytes (format 1, before segment epochs and lineages, reads
        each segment as its one epoch from offset 0)."""
        try:
            table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
            metadata = table.schema.metadata or {}
            found = metadata.get(b"format")
            expected = {_FORMAT: _SCHEMA, _FORMAT_1: _SCHEMA_1}.get(found)  # type: ignore[arg-type]
            same_schema = expected is not None and table.schema.remove_metadata().equals(expected)
            if same_schema:
                table.validate(full=True)
            lineages = json.loads(metadata.get(b"lineage", b"[]"))
        # Damaged bytes can also surface as undecodable names (UnicodeDecodeError, a ValueError).
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise RemoteLogDecodeError(f"not encoded remote log sizes: {exc!r}") from None
        if expected is None:
            raise RemoteLogDecodeError(f"unsupported remote log sizes format {found!r}")
        if not same_schema:
            raise RemoteLogDecodeError(f"unexpected remote log sizes schema: {table.schema}")
        for name in expected.names:
            if name != "copied_at" and table.column(name).null_count:
                raise RemoteLogDecodeError(f"remote log sizes column {name!r} has nulls")
        return cls._from_table(table, lineages)

    # ------------------------------------------------------------------ internals
    @classmethod
    def _from_table(cls, table: pa.Table, lineages: list[Any]) -> RemoteLogSizes:
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
        epochs = np.empty(count, dtype=object)
        if "epochs" in table.column_names:
            epochs[:] = [
                epochs_of((entry["epoch"], entry["offset"]) for entry in listed)
                for listed in table.column("epochs").to_pylist()
            ]
            end_offset = np.asarray(table.column("end_offset").to_numpy(), dtype=np.int64)
        else:
            epochs[:] = [((e, 0),) for e in epoch.tolist()]
            end_offset = np.full(count, -1, dtype=np.int64)

        state = cls()
        partition_id = state._partition_ids_of(topic, partition)
        state._columns.append(
            partition_id,
            np.asarray(table.column("segment_id").to_numpy(), dtype=object),
            epoch=epoch,
            nbytes=nbytes,
            copied_at=copied_at,
            epochs=epochs,
            end_offset=end_offset,
        )
        columns = state._columns
        columns.last_ts[:count] = np.asarray(table.column("last_event_ts").to_numpy())
        columns.live[:count] = live
        state._index_rows()
        if sum(len(owner.rows) for owner in state._partitions) != count:
            raise RemoteLogDecodeError("a segment is listed twice")
        state._count_live()
        for lineage_topic, lineage_partition, ts, log_end_offset, lineage in lineages:
            owner_id = state._partition_ids_of(
                np.array([lineage_topic], dtype=object), np.array([lineage_partition], np.int64)
            )[0]
            state._partitions[owner_id].lineage = (ts, log_end_offset, epochs_of(lineage))
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
        for row in live.tolist():
            owner = self._partitions[int(columns.partition_id[row])]
            owner.add(str(columns.segment_id[row]), columns.epochs[row], int(columns.nbytes[row]))
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
    epochs: ObjectArray  # Epochs
    end_offset: Int64Array

    @property
    def size(self) -> int:
        return len(self.ts)

    @staticmethod
    def of(events: pd.DataFrame) -> _Batch:
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
            epochs=_segment_epochs(events),
            end_offset=events["end_offset"].to_numpy(dtype=np.int64),
        )
        for name, values in (("partition", batch.partition), ("leader_epoch", batch.epoch)):
            if ((values < 0) | (values > _INT32_MAX)).any():
                raise ValueError(f"remote segment {name} out of [0, 2**31)")
        if (batch.nbytes < 0).any():
            raise ValueError("remote segment bytes must be >= 0")
        return batch


def _segment_epochs(events: pd.DataFrame) -> ObjectArray:
    """Each segment's epochs; one without them lists its ``leader_epoch`` from offset 0."""
    epochs = np.empty(len(events), dtype=object)
    given = events["epochs"].tolist()
    epochs[:] = [
        epochs_of(listed) if listed is not None else ((int(epoch), 0),)
        for listed, epoch in zip(given, events["leader_epoch"].tolist(), strict=True)
    ]
    return epochs


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
