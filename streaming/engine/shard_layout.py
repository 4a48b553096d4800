"""Which group key each shard has, so that Spark gives every state task its share of shards.

The stateful stage groups rows by a shard's key and Spark hash-partitions those keys among
``spark.sql.shuffle.partitions`` state tasks: the task of key ``k`` is
``pmod(murmur3_x86_32(k as a 4-byte int, seed 42), tasks)`` (``HashPartitioning``, whose hash
``pyspark.sql.functions.hash`` also computes). Numbered 0..7, eight shards fall 5 and 3 into
two tasks and 4, 3, 1 and 0 into four: the longest task held 5/8 and 4/8 of the stage's work
where 4/8 and 2/8 were due. A layout instead gives shard ``i`` the smallest free key whose task
is ``i % tasks``, so the tasks' shard counts differ by at most one.

The layout is pinned in the checkpoint with the source's offsets (``streaming.engine.offsets``),
as Spark pins the task count: an entity's state stays in the group it was kept in for the life of
the checkpoint. Checkpoints begun before layouts keep the old numbering (:meth:`numbered`).

Imported by the source's planning processes: no pandas, no numpy.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import mmh3

#: Spark's seed for ``Murmur3Hash`` in ``HashPartitioning``.
SPARK_HASH_SEED = 42


def state_task(key: int, tasks: int) -> int:
    """The state task Spark's hash partitioning gives group key ``key`` (an int32 column)."""
    # Python's % of a positive modulus is Spark's pmod.
    return int(mmh3.hash(key.to_bytes(4, "little", signed=True), SPARK_HASH_SEED) % tasks)


@dataclass(frozen=True)
class ShardLayout:
    shards: int
    #: The state tasks the keys are spread over; None: shard ``i`` has key ``i``.
    tasks: int | None

    def __post_init__(self) -> None:
        if self.shards < 1 or (self.tasks is not None and self.tasks < 1):
            raise ValueError(f"a layout needs shards and tasks >= 1, not {self}")

    @staticmethod
    def numbered(shards: int) -> ShardLayout:
        """The keys of checkpoints begun before layouts: the shard numbers themselves."""
        return ShardLayout(shards, None)

    @cached_property
    def keys(self) -> tuple[int, ...]:
        """The group key of each shard, by shard number."""
        if self.tasks is None:
            return tuple(range(self.shards))
        free: dict[int, deque[int]] = {task: deque() for task in range(self.tasks)}
        keys = []
        candidate = 0
        for shard in range(self.shards):
            wanted = shard % self.tasks
            while not free[wanted]:
                free[state_task(candidate, self.tasks)].append(candidate)
                candidate += 1
            keys.append(free[wanted].popleft())
        return tuple(keys)

    def to_json(self) -> dict[str, int]:
        # The offsets' shape: a map of names to integers (``streaming.engine.offsets``).
        return {"shards": self.shards} | ({} if self.tasks is None else {"tasks": self.tasks})

    @staticmethod
    def from_json(data: Any) -> ShardLayout:
        expected = "{'shards': N, 'tasks': M}"
        try:
            tasks = data.get("tasks")
            if set(data) <= {"shards", "tasks"}:
                return ShardLayout(int(data["shards"]), None if tasks is None else int(tasks))
        except (AttributeError, KeyError, TypeError, ValueError):
            pass
        raise ValueError(f"a shard layout is {expected}, not {data!r}")
