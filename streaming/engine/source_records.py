"""What the Kafka source reads and what it hands Spark, apart from the staging code.

Spark runs a Python source's planning in Python processes of their own (one creates the source,
one plans its reads, one runs its trigger planner), each started anew on the path of every query
start and each importing ``streaming.engine.kafka_source``. This module is all that source needs
of the stages' vocabulary, so none of those processes imports pandas or the quota core: on two
cores that import is ~1.3 s a process (docs/streaming.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import pyarrow as pa

#: What the source hands Spark: a read's stage rows (``streaming.engine.stages.STAGE_SCHEMA``) for
#: one shard as one Arrow IPC stream (``packed_by_shard``), so that Spark moves a value per read
#: and shard instead of converting each row (Arrow to its own rows, shuffled, then to Arrow and
#: pandas again).
STAGED_SCHEMA = pa.schema([("shard", pa.int32()), ("rows", pa.binary())])


@dataclass(frozen=True)
class KafkaRecords:
    """Consecutive records of one topic-partition, and the configuration version their
    micro-batch decides with."""

    topic: str
    partition: int
    offsets: list[int]
    values: list[bytes | None]
    config_version: int

    @cached_property
    def value_bytes(self) -> int:
        return sum(len(value) for value in self.values if value is not None)


#: Records fetched per poll and staged together: large enough that the staging's per-call costs
#: (pandas, Arrow) vanish per record, small enough to bound a worker's memory.
RECORDS_PER_CHUNK = 100_000
#: And values staged together, at most about: a staging's memory peaks at ~6x its payload (2M
#: events in 500-event messages, 193 MiB, grew a process by 1.1 GiB), so 100k records of such
#: messages (5 GB, a backlog read in one micro-batch) would not fit a worker. 16 MiB is ~165k
#: events in 500-event messages: in Spark, 2M such events a batch took ~3.8 s staged 16 MiB at a
#: time against ~5.0 s at 64 MiB, 8 and 32 MiB in between (docs/streaming.md).
BYTES_PER_CHUNK = 16 << 20
