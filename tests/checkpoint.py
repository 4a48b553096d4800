"""What a query's checkpoint says it planned: each micro-batch's time and source offsets.

Spark writes a batch's offset log entry before it runs the batch; the entry holds the batch
time (the one the shards see as ``getCurrentProcessingTimeMs``) and the source's end offsets,
in which the engine pins the configuration version (the configuration log's end). Tests read
it to say *which* batch did something, not how long it took.
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

    def end_of(self, topic: str, partition: int = 0) -> int:
        return int(self.offsets.get(topic, {}).get(str(partition), 0))


def planned_batches(checkpoint: Path) -> list[PlannedBatch]:
    """The offset log's entries, by batch id (empty before the first batch is planned)."""
    folder = checkpoint / "offsets"
    entries = [path for path in folder.glob("*") if path.name.isdigit()] if folder.exists() else []
    batches = []
    for path in sorted(entries, key=lambda p: int(p.name)):
        version, metadata, *sources = path.read_text().splitlines()
        assert version == "v1", (path, version)
        batches.append(
            PlannedBatch(
                int(path.name),
                int(json.loads(metadata)["batchTimestampMs"]),
                json.loads(sources[-1]),
            )
        )
    return batches
