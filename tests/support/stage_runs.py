"""The engine's two stages as its query hands data between them, without Spark: a read task's
reads are staged and packed per shard in groups of ``records`` (as the source stages them), and a
shard is given the packs of all groups of its micro-batch together (as
``applyInPandasWithState`` gives them)."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from streaming.engine.shard_layout import ShardLayout
from streaming.engine.source_records import RECORDS_PER_CHUNK, KafkaRecords
from streaming.engine.stages import (
    StageSettings,
    packed_by_shard,
    shard_rows,
    staged_batches,
    staged_together,
)


def packs_by_shard(
    reads: Iterable[KafkaRecords],
    stage: StageSettings,
    layout: ShardLayout,
    records: int = RECORDS_PER_CHUNK,
) -> dict[int, list[bytes]]:
    """Each shard's packs of ``reads`` by its key in ``layout``, in read order (the dead-letter
    group is -1)."""
    packs: dict[int, list[bytes]] = {}
    for group in staged_together(reads, records):
        for batch in packed_by_shard(staged_batches(group, stage, layout)):
            shards = batch.column("shard").to_pylist()
            for shard, packed in zip(shards, batch.column("rows").to_pylist(), strict=True):
                packs.setdefault(shard, []).append(packed)
    return dict(sorted(packs.items()))


def shard_inputs(
    reads: Iterable[KafkaRecords],
    stage: StageSettings,
    layout: ShardLayout,
    records: int = RECORDS_PER_CHUNK,
) -> dict[int, pd.DataFrame]:
    """What each shard's update is given for ``reads``: its rows, unpacked together."""
    packs = packs_by_shard(reads, stage, layout, records)
    return {shard: shard_rows(of_shard) for shard, of_shard in packs.items()}
