"""Fair remote segment copy: share an exhausted copy quota among the partitions that upload.

KIP-956 notes that the copy task of a busy partition can starve low-throughput partitions: every
task waits for the broker's quota and the one that re-checks first takes it. Kafka's rule is kept
as is (``throttle_ms`` is how long the broker's next upload waits); each ``remote_copy`` decision
also carries ``partition_wait_ms``, how long the uploading partition's next upload waits:

* 0 while the broker is within its quota (work-conserving: a lone partition may use all of it);
* otherwise ``max(throttle_ms, share throttle)``: the share throttle is Kafka's throttle formula
  applied to the partition's own rate (its own rolling window, same spec as the broker's) against
  the fair share ``limit / active``, where ``active`` counts the partitions of the same broker
  entity that uploaded within the broker's retained window at that event (the uploading one
  included).

A partition that used less than its share waits for the broker only; one that used more waits
until its own rate is back at its share. The functions here are the pure rule; ``state.core``
keeps the per-partition table and feeds them (``docs/semantics.md``, "Fair remote copy").
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from state.entities import escape
from state.throttle import throttle_ms

Int64Array = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
ObjectArray = npt.NDArray[np.object_]

#: Name of the per-partition copy table in an encoded state (next to the quota types' names).
PARTITION_TABLE = "remote_copy_partition"


def partition_keys(
    entities: ObjectArray, topics: ObjectArray, partitions: Int64Array
) -> ObjectArray:
    """``<entity>,topic=T,partition=P`` per row: ``broker=3,topic=clicks,partition=4``.

    ``entities`` are broker entity keys (``broker=N`` or ``cluster``, never containing a comma),
    so a partition key always starts with its broker entity; topic names are percent-escaped like
    every name in an entity key (legal Kafka topic names need none).
    """
    joined = pc.binary_join_element_wise(
        pa.array(entities, type=pa.string()),
        ",topic=",
        escape(topics),
        ",partition=",
        pc.cast(pa.array(partitions, type=pa.int64()), pa.string()),
        "",
    )
    return np.asarray(joined.to_numpy(zero_copy_only=False), dtype=object)


def entity_of(keys: ObjectArray) -> ObjectArray:
    """The broker entity key each partition key starts with (the part before the first comma)."""
    if not len(keys):
        return np.zeros(0, dtype=object)
    parts = pc.split_pattern(pa.array(keys, type=pa.string()), ",", max_splits=1)
    return np.asarray(pc.list_element(parts, 0).to_numpy(zero_copy_only=False), dtype=object)


@dataclass(frozen=True)
class Uploads:
    """A batch's uploads (input order) and the partitions known from earlier batches.

    Groups are broker entities and partitions are numbered together for uploads and known
    partitions (a known partition that also uploads has that upload's number). Times are in
    samples (``ts // window_ms``).
    """

    group: Int64Array  # per upload: its broker entity
    partition: Int64Array  # per upload: its partition
    low: Int64Array  # per upload: the oldest sample of the broker entity's window after it
    sample: Int64Array  # per upload: the sample of the partition's clock after it
    known_group: Int64Array  # per known partition: its broker entity
    known_partition: Int64Array  # per known partition: its number
    known_sample: Int64Array  # per known partition: the sample of its clock before the batch


def active_partitions(uploads: Uploads) -> Int64Array:
    """Per upload: partitions of its broker entity that uploaded within the window, itself included.

    A partition is active at an upload when its latest upload so far (by then, in input order)
    falls in a sample the broker entity's window still retains: ``clock // window >= low``. That
    is also what keeps a partition from ``evict_idle`` at the broker's clock, so the count needs no
    state beyond the partitions' clocks, and a batch split anywhere counts the same.
    """
    count = np.zeros(len(uploads.group), dtype=np.int64)
    order = np.argsort(uploads.group, kind="stable")
    bounds = np.flatnonzero(np.diff(uploads.group[order], prepend=-1, append=-1))
    for start, stop in itertools.pairwise(bounds):  # one pass per broker entity
        rows = order[start:stop]
        known = np.flatnonzero(uploads.known_group == uploads.group[rows[0]])
        count[rows] = _active_in_group(
            uploads.low[rows],
            uploads.partition[rows],
            uploads.sample[rows],
            uploads.known_partition[known],
            uploads.known_sample[known],
        )
    return count


def _active_in_group(
    low: Int64Array,
    partition: Int64Array,
    sample: Int64Array,
    known_partition: Int64Array,
    known_sample: Int64Array,
) -> Int64Array:
    """:func:`active_partitions` for the uploads of one broker entity (``low`` never decreases).

    Each upload, and each known partition's clock before the batch, is a *mark* holding its
    partition's clock sample from its position until the partition's next mark. A mark counts
    while the window still reaches its sample: up to the first position whose ``low`` exceeds it,
    found by binary search because ``low`` never decreases. The count at every position is then
    the cumulative sum of +1 at each mark's start and -1 at its end.
    """
    size = len(low)
    known = len(known_partition)
    start = np.concatenate([np.zeros(known, dtype=np.int64), np.arange(size, dtype=np.int64)])
    mark_partition = np.concatenate([known_partition, partition])
    mark_sample = np.concatenate([known_sample, sample])
    # By partition, then position; a known clock precedes an upload at position 0.
    order = np.lexsort((np.arange(known + size), start, mark_partition))
    start, mark_partition, mark_sample = start[order], mark_partition[order], mark_sample[order]
    same_next = np.append(mark_partition[1:] == mark_partition[:-1], False)
    following = np.where(same_next, np.append(start[1:], size), size)
    end = np.minimum(following, np.searchsorted(low, mark_sample, side="right"))
    end = np.maximum(end, start)
    delta = np.bincount(start, minlength=size + 1) - np.bincount(end, minlength=size + 1)
    count = np.cumsum(delta[:-1])
    # An upload older than the window (late) still counts its own partition.
    result: Int64Array = count + (sample < low)
    return result


def fair_share(limit: FloatArray, active: Int64Array) -> FloatArray:
    """Each active partition's share of the broker's limit (``inf`` stays ``inf``)."""
    share: FloatArray = limit / np.maximum(active, 1)
    return share


def partition_wait_ms(
    broker_throttle_ms: Int64Array,
    partition_rate: FloatArray,
    share: FloatArray,
    partition_window_ms: Int64Array,
) -> Int64Array:
    """0 while the broker is within quota, else ``max(broker throttle, share throttle)``."""
    share_throttle = throttle_ms(partition_rate, share, partition_window_ms)
    wait: Int64Array = np.where(
        broker_throttle_ms > 0, np.maximum(broker_throttle_ms, share_throttle), 0
    )
    return wait
