"""Which remote segments size-based retention counts and deletes (KIP-405 / KIP-852 as shipped).

A partition's *lineage* is its leader-epoch checkpoint: each leader epoch with the first offset
written under it. A remote segment lists the epochs of its records the same way
(``segmentLeaderEpochs``); after an unclean leader election the remote store can hold segments of
epochs, or offset ranges, that the partition's lineage no longer contains. Kafka's
``RemoteLogManager`` then sizes and deletes by the lineage, transcribed here:

* :func:`filtered` is ``buildFilteredLeaderEpochMap``: epochs that hold no records (the next
  epoch starts at the same offset) are left out;
* :func:`within_lineage` is ``isRemoteSegmentWithinLeaderEpochs``;
* :func:`retention` is ``buildRetentionSizeData`` with the cleaner's walk order: for each epoch of
  the lineage in turn, the segments listed under it by their first offset in that epoch, each
  segment once. Its size counts the segments within the lineage;
* :func:`breach` is the cleaner's size-based walk over that order: a segment outside the lineage
  is passed over, one within it is deleted while ``remaining > 0`` and ``remaining - size >= 0``,
  and the walk stops at the first one it keeps.

Retention by time and by log start offset, and segments still being copied or deleted, are the
broker's business and not modelled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

#: Leader epoch -> the first offset written under it, ascending by epoch.
Epochs = tuple[tuple[int, int], ...]


def epochs_of(pairs: Mapping[int, int] | Iterable[tuple[int, int]]) -> Epochs:
    """``pairs`` as :data:`Epochs`, sorted by epoch."""
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    return tuple(sorted((int(epoch), int(offset)) for epoch, offset in items))


def filtered(epochs: Epochs) -> Epochs:
    """``buildFilteredLeaderEpochMap``: without the epochs whose next epoch starts at the same
    offset (they hold no records)."""
    return tuple(
        entry
        for entry, following in zip(epochs, (*epochs[1:], None), strict=True)
        if following is None or following[1] != entry[1]
    )


def within_lineage(
    segment_epochs: Epochs, end_offset: int, log_end_offset: int, lineage: Epochs
) -> bool:
    """``isRemoteSegmentWithinLeaderEpochs``: the segment's epochs and offsets lie within the
    partition's (filtered) lineage and below its log end offset. ``end_offset`` -1: unknown (only
    the epochs are checked)."""
    segment = dict(filtered(segment_epochs))
    leader = dict(lineage)
    if not segment or not leader or end_offset >= log_end_offset:
        return False
    leader_epochs = sorted(leader)
    segment_last = max(segment)
    # The segment's first epoch at or after the lineage's first (overlapping segments).
    segment_first = min((epoch for epoch in segment if epoch >= leader_epochs[0]), default=None)
    if segment_first is None or segment_last > leader_epochs[-1]:
        return False
    return all(
        _epoch_within(epoch, offset, segment, leader, end_offset)
        for epoch, offset in sorted(segment.items())
        if epoch >= segment_first
    )


def _epoch_within(
    epoch: int, offset: int, segment: dict[int, int], leader: dict[int, int], end_offset: int
) -> bool:
    """One epoch of a segment against the lineage (the loop body of Kafka's check)."""
    if epoch not in leader:
        return False
    first = epoch == min(e for e in segment if e >= min(leader))
    if first and any(other < epoch for other in leader) and offset < leader[epoch]:
        return False
    next_leader = min(((e, o) for e, o in leader.items() if e > epoch), default=None)
    if epoch == max(segment):
        # The segment ends before the next epoch of the lineage starts.
        return next_leader is None or end_offset <= next_leader[1] - 1
    next_segment = min(((e, o) for e, o in segment.items() if e > epoch), default=None)
    return next_leader == next_segment


@dataclass(frozen=True)
class RemoteSegment:
    """A live (copy finished, not deleted) remote segment of one partition."""

    segment_id: str
    size: int
    epochs: Epochs  # segmentLeaderEpochs
    end_offset: int  # -1: unknown


@dataclass(frozen=True)
class Retention:
    """What size-based retention sees of a partition's remote log."""

    #: The cleaner's walk order, each segment with whether it is within the lineage.
    order: tuple[tuple[RemoteSegment, bool], ...]
    #: ``buildRetentionSizeData``'s remote size: segments within the lineage, once each.
    size: int


def retention(segments: Sequence[RemoteSegment], lineage: Epochs, log_end_offset: int) -> Retention:
    """The partition's remote segments as the cleaner walks and sizes them."""
    lineage = filtered(lineage)
    listed: dict[int, list[tuple[int, str, RemoteSegment]]] = {}
    for segment in segments:
        for epoch, offset in segment.epochs:
            listed.setdefault(epoch, []).append((offset, segment.segment_id, segment))
    order: list[tuple[RemoteSegment, bool]] = []
    seen: set[str] = set()
    for epoch, _ in lineage:
        for _, segment_id, segment in sorted(listed.get(epoch, [])):
            if segment_id in seen:
                continue
            seen.add(segment_id)
            order.append(
                (
                    segment,
                    within_lineage(segment.epochs, segment.end_offset, log_end_offset, lineage),
                )
            )
    return Retention(
        order=tuple(order), size=sum(segment.size for segment, within in order if within)
    )


def breach(
    walk: Sequence[tuple[str, int, bool]],
    remote_size: int,
    local_only_bytes: int,
    retention_bytes: int,
) -> list[str]:
    """Ids of the segments size-based retention deletes, in ``walk`` order of
    ``(segment id, size, within lineage)``.

    As Kafka: nothing unless ``retention_bytes`` is set (``-1`` disables it) and
    ``local_only_bytes + remote_size > retention_bytes``. A segment outside the lineage is passed
    over; one within it is deleted while ``remaining > 0`` and ``remaining - size >= 0``; the walk
    stops at the first one kept, so a big old segment protects the younger ones behind it.
    """
    if remote_size < 0 or local_only_bytes < 0 or any(size < 0 for _, size, _ in walk):
        raise ValueError("segment sizes, remote_size and local_only_bytes must be >= 0")
    if retention_bytes < 0:
        return []
    remaining = local_only_bytes + remote_size - retention_bytes
    deleted: list[str] = []
    for segment_id, size, within in walk:
        if not within:
            continue
        if remaining <= 0 or remaining - size < 0:
            break
        remaining -= size
        deleted.append(segment_id)
    return deleted
