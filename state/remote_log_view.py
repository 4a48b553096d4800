"""A partition's remote log as enforcement points see it (KIP-852): one value per partition.

The engine builds it from a shard's :class:`~state.remote_log.RemoteLogSizes` whenever segment
events change the partition (:func:`state.shard.remote_log_of`); :mod:`quotastream.redis_contract`
writes it to Redis as JSON and reads it back, field for field, so these dataclasses are the
document's only definition (``docs/redis.md``). Plain data, and the two questions agents ask
of it: ``remoteLogSize`` of an epoch, and which segments size-based retention deletes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from state.leader_epochs import breach


@dataclass(frozen=True)
class RetentionView:
    """What size-based retention sees (``state/leader_epochs.py``)."""

    #: The lineage the leader last reported: (leader epoch, first offset); None: no report.
    lineage: list[tuple[int, int]] | None
    log_end_offset: int | None
    #: ``buildRetentionSizeData``'s remote size: segments within the lineage, once each.
    bytes: int
    #: The cleaner's walk: (segment id, bytes, within the lineage), in order.
    walk: list[tuple[str, int, bool]]


@dataclass(frozen=True)
class RemoteLog:
    """A partition's remote log sizes, as the engine last wrote them."""

    topic: str
    partition: int
    #: RemoteLogSizeBytes: bytes in remote storage, all leader epochs.
    total: int
    #: Leader epoch -> bytes of the segments listed under it (a segment under each of its epochs).
    epochs: dict[int, int] = field(default_factory=dict)
    #: The live segments (segment id, last leader epoch, bytes), oldest copy first.
    segments: list[tuple[str, int, int]] = field(default_factory=list)
    #: None only in a document written before lineages were reported: every segment counts.
    retention: RetentionView | None = None

    @property
    def retention_view(self) -> RetentionView:
        """What retention counts and walks (every live segment, in order, without a lineage)."""
        if self.retention is not None:
            return self.retention
        walk = [(segment, size, True) for segment, _, size in self.segments]
        return RetentionView(None, None, self.total, walk)

    @property
    def lineage(self) -> list[tuple[int, int]] | None:
        return self.retention_view.lineage

    @property
    def retention_bytes(self) -> int:
        return self.retention_view.bytes

    @property
    def retention_walk(self) -> list[tuple[str, int, bool]]:
        return self.retention_view.walk

    def size(self, leader_epoch: int) -> int:
        """``remoteLogSize(partition, leaderEpoch)``: 0 for an epoch with no remote segments."""
        return self.epochs.get(leader_epoch, 0)

    def retention_breach(self, retention_bytes: int, local_only_bytes: int) -> list[str]:
        """The segments size-based retention deletes, in order (Kafka's walk)."""
        view = self.retention_view
        return breach(view.walk, view.bytes, local_only_bytes, retention_bytes)
