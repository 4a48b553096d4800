"""The core as the streaming job uses it: resolve, record, and state that survives a restart."""

from __future__ import annotations

import json
import random

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from state.config import parse_quota_config
from state.core import RESOLVED_COLUMNS, QuotaCore
from state.encoding import StateDecodeError
from state.events import parse_events
from tests.factories import BASE, fetch, produce, remote, replication

CONFIG = parse_quota_config(
    {
        "clients": [{"user": "<default>", "producer_byte_rate": 2000, "consumer_byte_rate": 3000}],
        "brokers": {
            "<default>": {
                "remote.log.manager.copy.max.bytes.per.second": 4000,
                "leader.replication.throttled.rate": 1500,
            }
        },
        "topics": {"t": {"leader.replication.throttled.replicas": "*"}},
    },
    "test config",
)


def events(seed: int, count: int) -> pd.DataFrame:
    rng = random.Random(seed)
    makers = [
        lambda ts: produce(f"u{rng.randrange(3)}", "c", rng.randrange(3000), ts, rng.randrange(2)),
        lambda ts: fetch(f"u{rng.randrange(3)}", "c", rng.randrange(3000), ts),
        lambda ts: remote("remote_copy", rng.randrange(2), rng.randrange(5000), ts),
        lambda ts: replication(
            1, "leader", "t", rng.randrange(3), 5, rng.random() < 0.5, rng.randrange(2000), ts
        ),
    ]
    payloads = [
        json.dumps(rng.choice(makers)(BASE + rng.randrange(30_000))).encode() for _ in range(count)
    ]
    parsed = parse_events(payloads)
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
