"""The core as the streaming job uses it: resolve, record, and state that survives a restart."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from state.config import parse_quota_config
from state.core import RESOLVED_COLUMNS, QuotaCore
from state.encoding import StateDecodeError, encode_tables
from state.events import parse_events
from state.quota_types import QuotaType
from tests.support.factories import BASE, MIXED_QUOTAS, mixed_payloads, produce, remote

CONFIG = parse_quota_config(MIXED_QUOTAS, "test config")
DATA = Path(__file__).parent / "data"


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
    # Rows are kept in key-hash order (state/encoding.py), not insertion order.
    assert sorted(restored.copy_partitions.keys) == sorted(core.copy_partitions.keys)
    # State kept before the partition table existed restores with an empty one.
    old = encode_tables({quota.value: table for quota, table in core.tables.items()})
    assert len(QuotaCore.restore(CONFIG, old).copy_partitions) == 0
    # Every window is empty 11 s after the last event: the produce and remote_copy entities and
    # the partitions go alike.
    assert core.evict_idle(BASE + 2500 + 11_000) == 1 + 2 + 5
    assert len(core.copy_partitions) == 0


# ------------------------------------------------------------------ partial restore
def touched_by(batch: pd.DataFrame) -> dict[QuotaType, list[str]]:
    resolved = QuotaCore(CONFIG).resolve(batch)
    recorded = resolved[resolved["quota"].notna()]
    return {
        QuotaType(str(quota)): rows["entity"].astype(str).unique().tolist()
        for quota, rows in recorded.groupby("quota", observed=True)
    }


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), cut=st.integers(0, 300), idle_s=st.integers(0, 40))
def test_a_core_restored_for_its_batch_decides_and_encodes_as_a_whole_one(
    seed: int, cut: int, idle_s: int
) -> None:
    """A micro-batch decodes only the entities it touches (state/encoding.py): its decisions,
    its eviction and the bytes it writes are those of restoring everything."""
    batch = events(seed, 300)
    head, tail = batch.iloc[:cut], batch.iloc[cut:]
    first = QuotaCore(CONFIG)
    first.decide(head)
    state = first.encode_state()
    whole = QuotaCore.restore(CONFIG, state)
    partial = QuotaCore.restore(CONFIG, state, touched_by(tail))
    pd.testing.assert_frame_equal(plain(partial.decide(tail)), plain(whole.decide(tail)))
    horizon = BASE + 30_000 + idle_s * 1000
    assert partial.evict_idle(horizon) == whole.evict_idle(horizon)
    assert partial.encode_state() == whole.encode_state()


def test_a_partly_restored_core_refuses_entities_it_did_not_restore() -> None:
    batch = events(5, 100)
    first = QuotaCore(CONFIG)
    first.decide(batch)
    partial = QuotaCore.restore(CONFIG, first.encode_state(), {QuotaType.PRODUCE: ["nobody"]})
    with pytest.raises(ValueError, match="entities not restored for recording"):
        partial.decide(batch)


def test_a_partly_restored_core_refuses_a_stored_entity_it_did_not_restore() -> None:
    """Refused although the state holds it: recorded from empty windows, it would lose them."""
    batch = events(5, 100)
    first = QuotaCore(CONFIG)
    first.decide(batch)
    touched = touched_by(batch)
    left_out = touched[QuotaType.PRODUCE][-1]
    touched[QuotaType.PRODUCE] = touched[QuotaType.PRODUCE][:-1]
    partial = QuotaCore.restore(CONFIG, first.encode_state(), touched)
    with pytest.raises(ValueError, match="entities not restored for recording") as refused:
        partial.decide(batch)
    assert left_out in str(refused.value)


def test_state_of_the_previous_format_resumes_identically() -> None:
    """``tests/data/rolling_format3.arrows``: the windows after ``events(7, 300)``, encoded by
    format 3 (every slot, insertion order) before format 4."""
    legacy = (DATA / "rolling_format3.arrows").read_bytes()
    uninterrupted = QuotaCore(CONFIG)
    uninterrupted.decide(events(7, 300))
    assert QuotaCore.restore(CONFIG, legacy).encode_state() == uninterrupted.encode_state()
    touched = touched_by(events(8, 50))
    partial = QuotaCore.restore(CONFIG, legacy, touched)
    partial.decide(events(8, 50))
    uninterrupted.decide(events(8, 50))
    assert partial.encode_state() == uninterrupted.encode_state()
