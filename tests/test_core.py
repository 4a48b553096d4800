"""The core as the streaming job uses it: resolve, record, and state that survives a restart."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from state.config import parse_quota_config
from state.core import RESOLVED_COLUMNS, QuotaCore
from state.encoding import StateDecodeError, encode_tables
from state.events import parse_events
from tests.factories import BASE, MIXED_QUOTAS, mixed_payloads, produce, remote

CONFIG = parse_quota_config(MIXED_QUOTAS, "test config")


def events(seed: int, count: int) -> pd.DataFrame:
    parsed = parse_events(mixed_payloads(seed, count, users=3, span_ms=30_000))
    assert parsed.rejected.empty
    return parsed.accepted


def plain(frame: pd.DataFrame) -> pd.DataFrame:
    """Categoricals as plain values, so frames from different batches compare."""
    categorical = frame.select_dtypes("category").columns
    return frame.astype(dict.fromkeys(categorical, object)).reset_index(drop=True)


def test_resolve_is_stateless_and_names_every_column() -> None:
    core = QuotaCore(CONFIG)
    batch = events(1, 200)
    first = core.resolve(batch)
    assert list(first.columns) == list(RESOLVED_COLUMNS)
    pd.testing.assert_frame_equal(first, core.resolve(batch))
    assert all(len(table) == 0 for table in core.tables.values())


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), cut=st.integers(0, 300))
def test_state_survives_encode_and_restore(seed: int, cut: int) -> None:
    batch = events(seed, 300)
    uninterrupted = QuotaCore(CONFIG)
    expected = uninterrupted.decide(batch)
    first = QuotaCore(CONFIG)
    head = first.decide(batch.iloc[:cut])
    resumed = QuotaCore.restore(CONFIG, first.encode_state())
    tail = resumed.decide(batch.iloc[cut:])
    pd.testing.assert_frame_equal(plain(pd.concat([plain(head), plain(tail)])), plain(expected))
    assert resumed.encode_state() == uninterrupted.encode_state()


def test_restore_refuses_state_kept_with_other_windows() -> None:
    core = QuotaCore(CONFIG)
    core.decide(events(3, 50))
    other = parse_quota_config({"quota_types": {"produce": {"samples": 5}}}, "other")
    with pytest.raises(StateDecodeError, match="produce state was kept with 11 samples"):
        QuotaCore.restore(other, core.encode_state())


# ---------------------------------------------------------------------------- fair remote copy
def copies() -> pd.DataFrame:
    payloads = [
        json.dumps(remote("remote_copy", broker, 3000, BASE + 500 * i, "logs", i % 3)).encode()
        for i, broker in enumerate([1, 1, 2, 1, 2, 1])
    ]
    payloads.append(json.dumps(produce("u", "c", 10, BASE)).encode())
    return parse_events(payloads).accepted


def test_resolve_keys_remote_copies_by_partition_and_nothing_else() -> None:
    resolved = QuotaCore(CONFIG).resolve(copies())
    assert resolved["partition_key"].tolist()[:3] == [
        "broker=1,topic=logs,partition=0",
        "broker=1,topic=logs,partition=1",
        "broker=2,topic=logs,partition=2",
    ]
    assert pd.isna(resolved["partition_key"].iloc[-1])


def test_partition_table_is_kept_restored_and_evicted_with_the_others() -> None:
    core = QuotaCore(CONFIG)
    core.decide(copies())
    assert len(core.copy_partitions) == 5  # broker 1: partitions 0, 1, 2; broker 2: 1, 2
    restored = QuotaCore.restore(CONFIG, core.encode_state())
    assert list(restored.copy_partitions.keys) == list(core.copy_partitions.keys)
    # State kept before the partition table existed restores with an empty one.
    old = encode_tables({quota.value: table for quota, table in core.tables.items()})
    assert len(QuotaCore.restore(CONFIG, old).copy_partitions) == 0
    # Every window is empty 11 s after the last event: the produce and remote_copy entities and
    # the partitions go alike.
    assert core.evict_idle(BASE + 2500 + 11_000) == 1 + 2 + 5
    assert len(core.copy_partitions) == 0
