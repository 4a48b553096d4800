"""A streaming query checked from outside: how far it read, and its checkpoint's windows and
Redis's decisions against a replay of the same events in one batch."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import redis
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from quotastream.redis_contract import decision_key
from state.config import QuotaConfig
from state.core import QuotaCore
from state.events import parse_events
from state.live_config import Mode
from streaming.services import LocalService
from tests.support.checkpoint import planned_batches
from tests.support.engine import stored_decisions
from tests.support.expected import (
    assert_reads_as_unwritten,
    by_key,
    final_decisions,
    mode_of,
    must_be_written,
    replayed,
    window_state,
)


def checkpoint_cores(spark: SparkSession, checkpoint: Path, config: QuotaConfig) -> list[QuotaCore]:
    """Each shard's rolling windows as the checkpoint holds them (Spark's state reader)."""
    rows = spark.read.format("statestore").load(str(checkpoint)).collect()
    return [QuotaCore.restore(config, bytes(row["value"]["groupState"]["tables"])) for row in rows]


#: Decision fields that depend on where the micro-batches split and when they ran: the newest
#: event time of the entity in the last batch that had its events, that plus the throttle, and
#: that batch's time (a throttle from 2023 is over when decided, so released at once).
BATCH_DEPENDENT = ("decided_at", "until", "released_at")


def assert_matches_batch_recomputation(
    spark: SparkSession,
    checkpoint: Path,
    redis_server: LocalService,
    prefix: str,
    values: list[bytes],
    config: QuotaConfig,
) -> None:
    """Windows and decisions equal the replay core's over the same events in one batch: every
    field of every decision that the batch split leaves alone; the others are checked to be
    one of the entity's event times, and one of the checkpoint's batch times."""
    core, decided = replayed(values, config)
    expected_windows = window_state([core])
    windows = window_state(checkpoint_cores(spark, checkpoint, config))
    assert windows == expected_windows
    # Every event lies within the final windows: each client byte is there exactly once.
    events = parse_events(values).accepted
    for kind in ("produce", "fetch"):
        kept = sum(
            nbytes
            for (table, _), (_, samples) in windows.items()
            if table == kind
            for nbytes, _ in samples.values()
        )
        assert kept == events.loc[events["kind"] == kind, "bytes"].sum() > 0

    event_times: dict[str, set[int]] = {}
    entities = zip(decided["quota"], decided["entity"], decided["partition_key"], strict=True)
    for (quota, entity, partition), ts in zip(entities, decided["ts"].tolist(), strict=True):
        # A remote copy decides for its broker and for its partition (the fair wait).
        for decided_for in (entity, partition):
            if not pd.isna(decided_for):
                key = decision_key(prefix, str(quota), str(decided_for))
                event_times.setdefault(key, set()).add(ts)
    batch_times = {batch.timestamp_ms for batch in planned_batches(checkpoint)}
    expected = {
        decision_key(prefix, quota, entity): row
        for (quota, entity), row in by_key(final_decisions(values, config)).items()
    }
    stored = stored_decisions(redis.Redis(host=redis_server.host, port=redis_server.port), prefix)
    assert stored.keys() <= expected.keys()
    # Redis holds what an agent acts on (docs/redis.md): these, and keys that read as the rest.
    assert sum(map(must_be_written, expected.values())) > len(expected) / 2
    for key, want in expected.items():
        mode = mode_of(want, config)
        if not must_be_written(want):
            assert_reads_as_unwritten(stored.get(key), want, config)
            continue
        got = stored[key]
        assert {field: got[field] for field in got if field not in BATCH_DEPENDENT} == {
            "quota": want["quota"],
            "entity": want["entity"],
            "throttle_ms": want["throttle_ms"],
            "rate": pytest.approx(want["rate"]),
            "limit": None if math.isnan(want["limit"]) else want["limit"],
            "exceeded": want["exceeded"],
            "window_ms": want["window_ms"],
            "enforced": mode is Mode.ENFORCED,
            "mode": mode.value,
            "config_version": 0,  # the configuration file's: these tests never change it
        }, key
        assert got["decided_at"] in event_times[key], key
        assert got["until"] == got["decided_at"] + got["throttle_ms"], key
        released = got["released_at"]
        assert (released is not None) == (got["throttle_ms"] > 0 and got["enforced"]), key
        assert released is None or released in batch_times, key


def read_offsets(query: StreamingQuery, topic: str) -> int:
    """Records of ``topic`` the query has read, by its last progress (0 before one)."""
    progress = query.lastProgress
    return read_offsets_of(progress, topic) if progress else 0


def read_offsets_of(progress: dict[str, Any], topic: str) -> int:
    """Records of ``topic`` read by the end of one micro-batch."""
    end: Any = progress["sources"][0]["endOffset"]
    offsets = json.loads(end) if isinstance(end, str) else end
    return sum(int(offset) for offset in (offsets or {}).get(topic, {}).values())


def wait_until_read(query: StreamingQuery, topic: str, count: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while read_offsets(query, topic) < count:
        assert query.isActive, query.exception()
        assert time.monotonic() < deadline, f"read {read_offsets(query, topic)} of {count}"
        time.sleep(0.2)
