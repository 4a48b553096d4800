"""What the streaming engine should end with: the replay core's final decision per Redis key."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from state.config import QuotaConfig
from state.core import QuotaCore
from state.events import parse_events
from state.live_config import Mode, decision_mode
from state.quota_types import QuotaType
from state.written_decisions import WritePolicy

#: The engine's default ``redis.write_near_limit``.
NEAR_LIMIT = WritePolicy().near_limit

#: Per (table, entity key): the entity's clock and its kept ``{sample: (bytes, last event ms)}``.
WindowState = dict[tuple[str, str], tuple[int | None, dict[int, tuple[int, int]]]]


def replayed(values: list[bytes], config: QuotaConfig) -> tuple[QuotaCore, pd.DataFrame]:
    """The batch recomputation: every valid event through one core, in time order."""
    events = parse_events(values).accepted.sort_values("ts", kind="stable", ignore_index=True)
    core = QuotaCore(config)
    return core, core.decide(events)


def window_state(cores: list[QuotaCore]) -> WindowState:
    """Every entity's rolling window in ``cores`` (one per shard, entities disjoint)."""
    state: WindowState = {}
    for core in cores:
        tables = {q.value: t for q, t in core.tables.items()} | {"partitions": core.copy_partitions}
        for name, table in tables.items():
            for key in table.keys:
                assert (name, str(key)) not in state, f"{key} is kept by two shards"
                state[(name, str(key))] = (table.clock_of(key), table.retained(key))
    return state


def final_decisions(values: list[bytes], config: QuotaConfig) -> pd.DataFrame:
    """The latest decision per (quota, entity) after every event, as the engine publishes them.

    Final windows do not depend on arrival order, so replaying in time order puts each entity's
    decision at its clock last. Each uploading partition's fair wait is a decision of its own.
    """
    decided = replayed(values, config)[1]
    decided = decided.assign(
        quota=decided["quota"].astype(str), entity=decided["entity"].astype(str)
    )
    decided = decided[decided["quota"] != "nan"]
    copies = decided[decided["partition_key"].notna()]
    partitions = copies.assign(
        entity=copies["partition_key"].astype(str), throttle_ms=copies["partition_wait_ms"]
    )
    return (
        pd.concat([decided, partitions])
        .sort_values("ts", kind="stable")
        .drop_duplicates(["quota", "entity"], keep="last")
        .reset_index(drop=True)
    )


def by_key(decisions: pd.DataFrame) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (str(row["quota"]), str(row["entity"])): {str(k): v for k, v in row.items()}
        for row in decisions.to_dict(orient="records")
    }


def must_be_written(want: dict[str, Any], near_limit: float = NEAR_LIMIT) -> bool:
    """Whether Redis must hold the final decision ``want`` (a :func:`final_decisions` row):
    it throttles, or is near its limit (docs/redis.md, which decisions are written)."""
    return bool(want["throttle_ms"] > 0 or want["rate"] >= near_limit * want["limit"])


def mode_of(want: dict[str, Any], config: QuotaConfig) -> Mode:
    """The mode of the final decision ``want`` under ``config`` (unlimited at a precedence
    level: exempt)."""
    exempt = want["level"] > 0 and math.isnan(want["limit"])
    return decision_mode(config, QuotaType(want["quota"]), exempt)


def assert_reads_as_unwritten(
    got: dict[str, Any] | None,
    want: dict[str, Any],
    config: QuotaConfig,
    config_version: int = 0,
    near_limit: float = NEAR_LIMIT,
) -> None:
    """An entity whose final decision ``want`` Redis need not hold: its key (``got``, the JSON
    value) is missing, or holds an earlier decision an agent reads as it would read ``want``:
    not throttling, the same limit, mode and version, below ``near_limit``."""
    if got is None:
        return
    assert got["throttle_ms"] == 0 or got["released_at"] is not None, got
    limit = None if math.isnan(want["limit"]) else want["limit"]
    mode = mode_of(want, config).value
    assert (got["limit"], got["mode"], got["config_version"]) == (limit, mode, config_version), got
    assert limit is None or got["rate"] < near_limit * limit, got
