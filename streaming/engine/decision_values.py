"""The value Redis gets for each decision row: what the sink writes and the metrics read back."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from quotastream.redis_contract import Decision, encode
from state.live_config import Mode


def decision_values(decisions: pa.RecordBatch) -> list[bytes]:
    """Each decision row's value (:class:`~quotastream.redis_contract.Decision`), built column
    by column: a batch may hold every entity of a shard."""
    columns = [
        decisions.column("quota"),
        decisions.column("entity"),
        decisions.column("throttle_ms"),
        decisions.column("until"),
        decisions.column("rate"),
        decisions.column("limit"),  # null: unlimited
        decisions.column("exceeded"),
        decisions.column("window_ms"),
        decisions.column("ts"),
        pc.equal(decisions.column("mode"), Mode.ENFORCED.value),
        decisions.column("mode"),
        decisions.column("config_version"),
        decisions.column("released_at"),
    ]
    return list(map(encode, map(Decision, *(column.to_pylist() for column in columns))))
