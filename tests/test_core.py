"""The core as the streaming job uses it: resolve, record, and state that survives a restart."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from state.config import parse_quota_config
from state.core import RESOLVED_COLUMNS, QuotaCore
from state.encoding import StateDecodeError
from state.events import parse_events
from tests.factories import MIXED_QUOTAS, mixed_payloads

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
