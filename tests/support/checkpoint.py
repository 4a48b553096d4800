"""What a query's checkpoint says it planned, ran and finished, micro-batch by micro-batch.

Spark writes a batch's offset log entry before it runs the batch; the entry holds the batch
time (the one the shards see as ``getCurrentProcessingTimeMs``) and the source's end offsets,
in which the engine pins the configuration version (the configuration log's end). Spark takes
the batch time after it has read the sources' ends, so the ends may be older than that time.
Each state task writes the batch's version of its state partition once its shards are updated,
and the commit log entry comes last, once the batch's foreachBatch (the Redis writes) has
returned.
Tests read it to say *which* batch did something, and how far a batch got, not how long it took.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PlannedBatch:
    batch_id: int
    timestamp_ms: int
    #: The source's end offsets: ``{"topic": {"partition": offset}}``.
    offsets: dict[str, dict[str, int]]
    #: The stateful stage's partitions (``spark.sql.shuffle.partitions``, fixed by the
    #: query's first batch): each writes its own state files.
    state_partitions: int

    def end_of(self, topic: str, partition: int = 0) -> int:
        return int(self.offsets.get(topic, {}).get(str(partition), 0))

    def read_of(self, topic: str) -> int:
        """Records of ``topic`` read by the end of this batch, over all its partitions."""
        return sum(int(offset) for offset in self.offsets.get(topic, {}).values())


def planned_batches(checkpoint: Path) -> list[PlannedBatch]:
    """The offset log's entries, by batch id (empty before the first batch is planned)."""
    batches = []
    for path in _entries(checkpoint / "offsets"):
        version, metadata, *sources = path.read_text().splitlines()
        assert version == "v1", (path, version)
        fields = json.loads(metadata)
        batches.append(
            PlannedBatch(
                int(path.name),
                int(fields["batchTimestampMs"]),
                json.loads(sources[-1]),
                int(fields["conf"]["spark.sql.shuffle.partitions"]),
            )
        )
    return batches


def committed_batches(checkpoint: Path) -> set[int]:
    """Ids of the batches in the commit log: finished, never run again."""
    return {int(path.name) for path in _entries(checkpoint / "commits")}


def states_written(checkpoint: Path, batch: PlannedBatch) -> int:
    """How many of the batch's state partitions have written its state version.

    The engine's one stateful operator keeps ``state/0/<partition>/``; the HDFS-backed store
    writes version ``batch_id + 1`` of a partition as ``<version>.delta`` (renamed into place,
    so a file that exists is whole). A restart ignores versions past the last commit."""
    operator = checkpoint / "state" / "0"
    version = f"{batch.batch_id + 1}.delta"
    return sum(
        (operator / str(partition) / version).exists()
        for partition in range(batch.state_partitions)
    )


def _entries(folder: Path) -> list[Path]:
    """A metadata log's entries (files named by batch id; Spark renames them into place)."""
    entries = [path for path in folder.iterdir() if path.name.isdigit()] if folder.exists() else []
    return sorted(entries, key=lambda path: int(path.name))
