"""Only decisions an agent would act on are written: what agents read is what they read when
every decision was written (docs/redis.md)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from state.config import parse_quota_config
from state.live_config import Mode
from state.shard import USAGE_COLUMNS, Shard, ShardSettings, ShardState
from state.written_decisions import WritePolicy, WrittenDecisions, WrittenDecisionsDecodeError

NOW = 1_700_000_000_000
CONFIG = parse_quota_config(
    {"quota_types": {"produce": {"samples": 2, "window_ms": 1000}}}, "test config"
)
ENTITIES = ("user=a,broker=1", "user=b,broker=1", "user=c,broker=1")
LIMITS = (math.inf, 0.0, 100.0, 1000.0, 2000.0)

#: A Redis as each model leaves it: key -> (decision row, expire_at).
Keys = dict[str, tuple[dict[str, Any], int]]


def usage(now_ms: int, sends: list[tuple[int, int, int, int, int, int]]) -> pd.DataFrame:
    """(entity, bytes, ms before now, limit, mode, version) per usage row."""
    rows = [
        {
            "quota": "produce",
            "entity": ENTITIES[entity],
            "partition_key": None,
            "ts": now_ms - before,
            "counted_bytes": nbytes,
            "limit": LIMITS[limit],
            "level": 1,
            "config_version": version,
            "mode": list(Mode)[mode].value,
        }
        for entity, nbytes, before, limit, mode, version in sends
    ]
    frame = pd.DataFrame(rows, columns=list(USAGE_COLUMNS))
    return frame.astype({"ts": np.int64, "counted_bytes": np.int64, "config_version": np.int64})


def remaining_ms(row: dict[str, Any] | None, at_ms: int) -> int:
    """What an agent enforces (``Decision.throttle_ms_at``); a missing key: nothing."""
    if row is None or row["mode"] != Mode.ENFORCED.value or not pd.isna(row["released_at"]):
        return 0
    return max(int(row["until"]) - at_ms, 0)


def throttling(row: dict[str, Any]) -> bool:
    return bool(row["throttle_ms"] > 0 and pd.isna(row["released_at"]))


def near(row: dict[str, Any], policy: WritePolicy) -> bool:
    return bool(row["rate"] >= policy.near_limit * row["limit"])  # NaN: False


def held_fields(row: dict[str, Any], policy: WritePolicy) -> tuple[Any, ...]:
    limit = None if math.isnan(row["limit"]) else row["limit"]
    return (limit, row["mode"], row["config_version"], near(row, policy))


def live(keys: Keys, at_ms: int) -> dict[str, dict[str, Any]]:
    return {key: row for key, (row, expire_at) in keys.items() if expire_at > at_ms}


def assert_agents_read_the_same(
    everything: Keys, changed: Keys, at_ms: int, policy: WritePolicy
) -> None:
    every, only = live(everything, at_ms), live(changed, at_ms)
    assert only.keys() <= every.keys()
    for key, latest in every.items():
        held = only.get(key)
        assert remaining_ms(held, at_ms) == remaining_ms(latest, at_ms), key
        if throttling(latest) or not pd.isna(latest["notice"]) or near(latest, policy):
            assert held == latest, key
        elif held is not None and held != latest:
            assert not throttling(held), key
            assert held_fields(held, policy) == held_fields(latest, policy), key


sends = st.lists(
    st.tuples(
        st.integers(0, len(ENTITIES) - 1),
        st.integers(0, 3000),
        st.integers(0, 500),
        st.integers(0, len(LIMITS) - 1),
        st.integers(0, len(Mode) - 1),
        st.integers(0, 2),
    ),
    max_size=4,
)


@settings(max_examples=100, deadline=None)
@given(
    batches=st.lists(st.tuples(st.integers(1, 4000), sends), min_size=1, max_size=12),
    keep_ms=st.integers(1, 5000),
    near_limit=st.sampled_from([0.0, 0.5, 0.8, 1.0]),
)
def test_agents_read_what_they_read_when_every_decision_was_written(
    batches: list[tuple[int, list[tuple[int, int, int, int, int, int]]]],
    keep_ms: int,
    near_limit: float,
) -> None:
    """A shard's micro-batches with random traffic, limits, modes and configuration versions:
    Redis as the written decisions leave it, against Redis had every decision been written
    (each until ``max(until, batch time + keep_ms)``), looked at right after each batch and
    just before the next. Same throttle for every key; the same value wherever the latest
    decision throttles, ends a throttle or is near its limit; elsewhere, an older value with
    the same limit, mode, version and side of ``near_limit``, or no key."""
    policy = WritePolicy(keep_ms=keep_ms, near_limit=near_limit)
    shard_settings = ShardSettings(CONFIG, write_policy=policy)
    state: ShardState | None = None
    everything: Keys = {}
    changed: Keys = {}
    now = NOW
    for gap, sent in batches:
        step = Shard.restore(state, shard_settings, now).step(now, usage(now, sent))
        state = step.state
        for record in step.decisions.to_dict(orient="records"):
            row = {str(name): value for name, value in record.items()}
            key = f"{row['quota']}:{row['entity']}"
            expire_at = max(int(row["until"]), now + keep_ms)
            everything[key] = (row, expire_at)
            if row["write"]:
                assert row["expire_at"] == expire_at
                changed[key] = (row, expire_at)
        assert_agents_read_the_same(everything, changed, now, policy)
        now += gap
        assert_agents_read_the_same(everything, changed, now - 1, policy)


def shard_at(policy: WritePolicy) -> tuple[ShardSettings, list[ShardState | None]]:
    return ShardSettings(CONFIG, write_policy=policy), [None]


def written_after(
    shard_settings: ShardSettings, states: list[ShardState | None], now: int, frame: pd.DataFrame
) -> list[str]:
    step = Shard.restore(states[0], shard_settings, now).step(now, frame)
    states[0] = step.state
    return sorted(step.decisions.loc[step.decisions["write"], "entity"])


def test_clients_far_below_their_limit_are_not_written_until_something_changes() -> None:
    policy = WritePolicy(keep_ms=30_000, near_limit=0.8)
    shard_settings, states = shard_at(policy)
    # 1,000 B/s limits; 100 bytes in a 2 s window are 50 B/s.
    quiet = [(entity, 100, 10, 3, 0, 0) for entity in range(len(ENTITIES))]
    assert written_after(shard_settings, states, NOW, usage(NOW, quiet)) == []
    assert written_after(shard_settings, states, NOW + 1000, usage(NOW + 1000, quiet)) == []
    # user=a bursts past 80% of its limit: written, and again when it is back below.
    burst = [(0, 1700, 10, 3, 0, 0)]
    assert written_after(shard_settings, states, NOW + 2000, usage(NOW + 2000, burst)) == [
        ENTITIES[0]
    ]
    later = NOW + 10_000
    assert written_after(shard_settings, states, later, usage(later, quiet)) == [ENTITIES[0]]
    # A new configuration version: only user=a's key is in Redis, so only it is rewritten.
    moved = [(entity, 100, 10, 3, 0, 1) for entity in range(len(ENTITIES))]
    at = later + 1000
    assert written_after(shard_settings, states, at, usage(at, moved)) == [ENTITIES[0]]
    assert written_after(shard_settings, states, at + 1, usage(at + 1, moved)) == []
    # So is a new mode (shadow), or a new limit (2,000 B/s), while its key is there.
    for when, change in ((at + 2, (3, 1, 1)), (at + 3, (4, 1, 1))):
        sent = [(entity, 1, 10, *change) for entity in range(len(ENTITIES))]
        assert written_after(shard_settings, states, when, usage(when, sent)) == [ENTITIES[0]]
    # Once its key has expired, a change is not written either: a missing key reads the same.
    at = when + 30_000  # the last write's key expires then
    limit_changed = [(entity, 100, 10, 2, 0, 2) for entity in range(len(ENTITIES))]
    assert written_after(shard_settings, states, at, usage(at, limit_changed)) == []


def test_throttles_and_their_ends_are_written() -> None:
    shard_settings = ShardSettings(CONFIG, write_policy=WritePolicy(keep_ms=30_000))
    over = [(1, 5000, 10, 2, 0, 0)]  # 2,500 B/s against 100
    step = Shard.restore(None, shard_settings, NOW).step(NOW, usage(NOW, over))
    (row,) = step.decisions.to_dict(orient="records")
    assert row["write"]
    assert row["throttle_ms"] > 0
    assert row["expire_at"] == max(row["until"], NOW + 30_000)
    # No traffic: the timer fires and the release is written with its notice.
    done = Shard.restore(step.state, shard_settings, row["until"] + 1).step(
        row["until"] + 1, usage(row["until"] + 1, [])
    )
    (release,) = done.decisions.to_dict(orient="records")
    assert (release["write"], release["notice"]) == (True, "expired")


def test_the_table_round_trips_and_refuses_other_bytes() -> None:
    written = WrittenDecisions()
    frame = pd.DataFrame(
        {
            "rate": [900.0, 10.0],
            "limit": [1000.0, np.nan],
            "throttle_ms": [0, 0],
            "until": [NOW, NOW],
            "mode": ["enforced", "exempt"],
            "config_version": [3, 3],
            "released_at": pd.array([None, None], dtype="Int64"),
            "notice": [None, None],
        },
        index=pd.Index(["produce:a", "produce:b"], dtype=object),
    )
    out = written.step(NOW, frame, WritePolicy(keep_ms=100, near_limit=0.8))
    assert out["write"].tolist() == [True, False]
    again = WrittenDecisions.decode(written.encode())
    pd.testing.assert_frame_equal(again.held.frame(), written.held.frame())
    with pytest.raises(WrittenDecisionsDecodeError):
        WrittenDecisions.decode(b"not arrow")
