"""Shard layouts: each state task gets its share of shards, as Spark itself places their keys."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql.functions import spark_partition_id

from streaming.engine.offsets import (
    LAYOUT_KEY,
    SourceOptionError,
    SourceOptions,
    from_json,
    layout_of,
    to_json,
)
from streaming.engine.shard_layout import ShardLayout, state_task


@given(shards=st.integers(1, 300), tasks=st.integers(1, 40))
def test_every_state_task_holds_its_share_of_shards(shards: int, tasks: int) -> None:
    keys = ShardLayout(shards, tasks).keys
    assert len(set(keys)) == shards
    assert all(0 <= key < 2**31 for key in keys)
    assert [state_task(key, tasks) for key in keys] == [shard % tasks for shard in range(shards)]
    per_task = Counter(state_task(key, tasks) for key in keys)
    assert max(per_task.values()) - min(per_task.values(), default=0) <= 1
    assert len(per_task) == min(shards, tasks)


def test_shards_numbered_are_unbalanced_where_a_layout_is_not() -> None:
    """What the layout is for: numbered 0..7, eight shards crowd two and four tasks."""
    numbered = ShardLayout.numbered(8).keys
    assert numbered == tuple(range(8))
    assert sorted(Counter(state_task(key, 2) for key in numbered).values()) == [3, 5]
    assert sorted(Counter(state_task(key, 4) for key in numbered).values()) == [1, 3, 4]
    assert ShardLayout(8, 1).keys == numbered  # one task: nothing to spread


def test_the_layout_travels_with_the_offsets_and_old_checkpoints_have_none() -> None:
    offsets = {("events", 0): 42, ("events", 1): 7}
    layout = ShardLayout(8, 2)
    pinned = to_json(offsets, layout)
    assert pinned[LAYOUT_KEY] == {"shards": 8, "tasks": 2}
    assert from_json(pinned) == offsets
    assert layout_of(pinned) == layout
    assert layout_of(to_json(offsets)) is None
    assert layout_of({**to_json(offsets), LAYOUT_KEY: {"shards": 8}}) == ShardLayout.numbered(8)


@pytest.mark.parametrize(
    "entry", [{"shards": 0, "tasks": 2}, {"shards": "x"}, {"tasks": 2}, {"shards": 8, "keys": 1}, 8]
)
def test_a_damaged_layout_entry_is_refused_by_name(entry: object) -> None:
    with pytest.raises(SourceOptionError, match=r"offsets' '\$shards'"):
        layout_of({"events": {"0": 1}, LAYOUT_KEY: entry})


def test_the_source_options_name_the_layout_of_a_new_checkpoint() -> None:
    required = {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "events"}
    assert SourceOptions.parse(required).layout == ShardLayout(1, 1)
    given_layout = SourceOptions.parse({**required, "shards": "8", "stateTasks": "2"}).layout
    assert given_layout == ShardLayout(8, 2)
    with pytest.raises(SourceOptionError, match="'stateTasks' must be >= 1"):
        SourceOptions.parse({**required, "shards": "8", "stateTasks": "0"})


def test_spark_places_each_key_in_the_task_the_layout_says(spark: SparkSession) -> None:
    """The stateful stage's input is hash-partitioned by the group key into the shuffle's
    partitions, as ``repartition(n, column)`` partitions (``HashPartitioning``)."""
    for shards, tasks in [(8, 2), (8, 4), (13, 3), (64, 16)]:
        keys = ShardLayout(shards, tasks).keys
        frame = spark.createDataFrame([(key,) for key in keys], "shard int")
        placed = frame.repartition(tasks, "shard").select("shard", spark_partition_id())
        assert {row[0]: row[1] for row in placed.collect()} == {
            key: shard % tasks for shard, key in enumerate(keys)
        }
