"""The engine's two stages as its query hands data between them, without Spark: each read is
staged and packed per shard on its own (as the source's reads are), and a shard is given the
packs of all reads of its micro-batch together (as ``applyInPandasWithState`` gives them)."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from streaming.engine.stages import (
    KafkaRecords,
    StageSettings,
    packed_by_shard,
    shard_rows,
    staged_batches,
)


def packs_by_shard(reads: Iterable[KafkaRecords], stage: StageSettings) -> dict[int, list[bytes]]:
    """Each shard's packs of ``reads``, in read order (the dead-letter group is shard -1)."""
    packs: dict[int, list[bytes]] = {}
    for read in reads:
        for batch in packed_by_shard(staged_batches(read, stage)):
            shards = batch.column("shard").to_pylist()
            for shard, packed in zip(shards, batch.column("rows").to_pylist(), strict=True):
                packs.setdefault(shard, []).append(packed)
    return dict(sorted(packs.items()))


def shard_inputs(reads: Iterable[KafkaRecords], stage: StageSettings) -> dict[int, pd.DataFrame]:
    """What each shard's update is given for ``reads``: its rows, unpacked together."""
    return {shard: shard_rows(packs) for shard, packs in packs_by_shard(reads, stage).items()}
