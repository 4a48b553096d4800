"""Which decisions a shard writes to Redis: only those an enforcement point would act on.

An agent reads one key per entity, and a missing key means "not throttled" (``docs/redis.md``).
Most decisions are an unthrottled client's, far below its limit, the same answer batch after
batch: writing them all made the sink the largest Python cost of a batch with many clients
(``docs/streaming.md``). So a decision is written when:

* it throttles: ``throttle_ms > 0`` and not released (in any mode: a shadow throttle is what
  shadow mode reports);
* it ends a pending throttle (``notice``: expired or superseded);
* its rate is at least ``near_limit`` of its limit (limited entities only): a proxy measures
  the window on from the last decision it read, and a client near its limit is the one whose
  bytes through other proxies matter (``quotastream/proxy/holds.py``);
* its entity's key is still in Redis and holds another limit, mode, configuration version, or
  the other side of ``near_limit``: what Redis holds must never bind with a stale limit, or
  show a client near its limit that no longer is.

Any other decision answers as a missing key does, or as the key Redis holds does (same limit,
mode and version, not throttling, on the same side of ``near_limit``), so it is not written.

The shard remembers what each key it wrote holds, for as long as Redis keeps it: every written
key expires at ``max(until, now + keep_ms)``, ``now`` being the micro-batch time. That time is
the checkpoint's, so a replayed batch writes the same keys with the same expiry, and the shard
knows exactly which keys are still there. Only written keys are remembered, so this table holds
the throttled and near-limit entities of the last ``keep_ms``, not the shard's population.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from state.keyed_table import KeyedColumns

_FORMAT = b"quotastream.written_decisions.1"

#: What a written key holds that an agent acts on besides the throttle, per key.
_HELD = {
    "expire_at": np.int64,
    "limit": np.float64,  # NaN: unlimited
    "mode": object,
    "config_version": np.int64,
    "near_limit": np.bool_,
}


class WrittenDecisionsDecodeError(ValueError):
    """Bytes that are not an encoded table of written decisions."""


@dataclass(frozen=True)
class WritePolicy:
    #: How long a written decision stays readable at least (throttles stay until they end).
    keep_ms: int = 30_000
    #: Decisions whose rate is at least this share of their limit are written every batch.
    near_limit: float = 0.8


class WrittenDecisions:
    """The keys one shard has written and Redis still holds, with what each holds."""

    def __init__(self, held: KeyedColumns | None = None) -> None:
        self.held = held if held is not None else KeyedColumns.empty(_HELD)

    def step(self, now_ms: int, decisions: pd.DataFrame, policy: WritePolicy) -> pd.DataFrame:
        """``decisions`` (indexed by key: ``rate``, ``limit``, ``throttle_ms``, ``until``,
        ``mode``, ``config_version``, ``released_at``, ``notice``) with ``write`` (whether to
        write it) and ``expire_at`` (when its key expires, if written); remembers the written."""
        held = self.held.rows(self.held["expire_at"] > now_ms)
        rate = decisions["rate"].to_numpy(dtype=np.float64)
        limit = decisions["limit"].to_numpy(dtype=np.float64)
        mode = decisions["mode"].to_numpy(dtype=object)
        version = decisions["config_version"].to_numpy(dtype=np.int64)
        throttling = (decisions["throttle_ms"].to_numpy(dtype=np.int64) > 0) & decisions[
            "released_at"
        ].isna().to_numpy()
        ending = decisions["notice"].notna().to_numpy()
        # NaN (unlimited) compares false: never near.
        near = rate >= policy.near_limit * limit
        at = held.positions_of(decisions.index)
        known = at >= 0
        holds = held.rows(at[known])
        differs = np.zeros(len(decisions), dtype=np.bool_)
        differs[known] = (
            ~_same_limit(limit[known], holds["limit"])
            | (mode[known] != holds["mode"])
            | (version[known] != holds["config_version"])
            | (near[known] != holds["near_limit"])
        )
        write = throttling | ending | near | differs
        until = decisions["until"].to_numpy(dtype=np.int64)
        expire_at = np.maximum(until, now_ms + policy.keep_ms)
        written = KeyedColumns(
            decisions.index.to_numpy(dtype=object)[write],
            {
                "expire_at": expire_at[write],
                "limit": limit[write],
                "mode": mode[write],
                "config_version": version[write],
                "near_limit": near[write],
            },
        )
        self.held = held.upserted(written)
        return decisions.assign(write=write, expire_at=expire_at)

    # ------------------------------------------------------------------ encoding
    def encode(self) -> bytes:
        return self.held.encode({b"format": _FORMAT})

    @classmethod
    def decode(cls, data: bytes) -> WrittenDecisions:
        what = "written decisions"
        held, _ = KeyedColumns.decode(data, _FORMAT, what, WrittenDecisionsDecodeError)
        return cls(held.astype(_HELD))


def _same_limit(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
    same: npt.NDArray[np.bool_] = (a == b) | (np.isnan(a) & np.isnan(b))
    return same
