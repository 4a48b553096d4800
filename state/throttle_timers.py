"""Release timers for throttle decisions: when each pending throttle ends, and why it ended early.

Every decision with a delay registers a timer at its ``until`` in a :class:`TimingWheel`; a newer
decision for the same key replaces it. What a step returns tells enforcement points which
throttles ended (``notice``):

* ``expired`` -- the timer fired: the throttle is over;
* ``superseded`` -- a newer decision without a pending delay replaced a pending throttle.

A newer decision that is itself a pending throttle replaces the old one silently: readers see the
new ``until``. A decision already over when it is made (old event time) is marked released at once
and needs no notice, unless it replaced a pending one.

Keys are opaque strings (the engine uses ``quota:entity``). The payload columns of each decision
(rate, limit, ...) are kept with its timer, so an expiry can be reported with the decision it ends
even when the key has no new traffic.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pandas as pd

# Re-exported (an explicit alias, as mypy wants): state.shard and streaming.engine.sinks import
# it here.
from state.keyed_table import decode_keyed, encode_keyed
from state.timer_stats import TimerStats
from state.timing_wheel import TimingWheel

EXPIRED = "expired"
SUPERSEDED = "superseded"

_FORMAT = b"quotastream.throttle_timers.1"


class TimersDecodeError(ValueError):
    """Bytes that are not encoded throttle timers."""


class ThrottleTimers:
    """Pending throttles of one state shard, keyed by decision key, in one timing wheel.

    ``pending`` is indexed by key and holds ``handle``, ``until`` and the payload columns.
    """

    def __init__(self, wheel: TimingWheel, pending: pd.DataFrame | None = None) -> None:
        self.wheel = wheel
        self.pending = pending if pending is not None else _empty(["until"])

    @classmethod
    def empty(cls, tick_ms: int, wheel_size: int, now_ms: int) -> ThrottleTimers:
        return cls(TimingWheel(tick_ms, wheel_size, now_ms))

    def stats(self) -> TimerStats:
        return TimerStats(len(self.wheel), self.wheel.fired_total, self.wheel.cancelled_total)

    def next_expiration(self) -> int | None:
        """When the earliest bucket of pending timers is due (the shard's next wake-up)."""
        return self.wheel.next_expiration()

    def step(self, now_ms: int, decisions: pd.DataFrame) -> pd.DataFrame:
        """Fire what is due by ``now_ms``, then register ``decisions``; what changed, by key.

        ``decisions`` is indexed by key (one row each) with ``throttle_ms``, ``until`` and payload
        columns; a decision whose optional ``enforced`` column is false holds no timer. The
        result has every decision plus every expiry of a key without a decision, with
        ``released_at`` (nullable) and ``notice`` (None, or why a pending throttle ended).
        """
        expired = self._expire(now_ms)
        replaced = self._take(decisions.index).index
        throttled = decisions["throttle_ms"].to_numpy() > 0
        if "enforced" in decisions:
            throttled &= decisions["enforced"].to_numpy(dtype=np.bool_)
        added = self.wheel.add(decisions["until"].to_numpy(dtype=np.int64)[throttled])
        rows = decisions.copy()
        released_at = np.full(len(rows), -1, dtype=np.int64)
        over_at_once = np.flatnonzero(throttled)[added.due]
        released_at[over_at_once] = self.wheel.now_ms
        rows["released_at"] = _nullable(released_at)
        still_pending = np.zeros(len(rows), dtype=np.bool_)
        still_pending[np.flatnonzero(throttled)[~added.due]] = True
        notice = np.full(len(rows), None, dtype=object)
        superseded = rows.index.isin(replaced) & ~still_pending
        notice[superseded] = SUPERSEDED
        # A key whose timer fired in this step and that has a new decision reports the new
        # decision, with the expiry notice so that waiting agents wake up and read it.
        notice[rows.index.isin(expired.index)] = EXPIRED
        rows["notice"] = notice
        new = rows.iloc[np.flatnonzero(still_pending)].drop(columns=["released_at", "notice"])
        new["handle"] = added.handles[~added.due]
        self.pending = pd.concat([self.pending, new]) if len(self.pending) else new
        only_expired = expired[~expired.index.isin(rows.index)]
        if len(only_expired):
            return pd.concat([rows, only_expired])
        return rows

    # ------------------------------------------------------------------ encoding
    def encode(self) -> bytes:
        return encode_keyed(self.pending, {b"format": _FORMAT, b"wheel": self.wheel.encode()})

    @classmethod
    def decode(cls, data: bytes) -> ThrottleTimers:
        pending, metadata = decode_keyed(data, _FORMAT, "throttle timers", TimersDecodeError)
        return cls(TimingWheel.decode(metadata[b"wheel"]), pending)

    # ------------------------------------------------------------------ internals
    def _expire(self, now_ms: int) -> pd.DataFrame:
        fired = self.wheel.advance(now_ms)
        if not len(fired.handles):
            return self._report(self.pending.iloc[:0], np.zeros(0, dtype=np.int64), EXPIRED)
        by_handle = pd.Index(self.pending["handle"].to_numpy(dtype=np.int64))
        rows = by_handle.get_indexer(pd.Index(fired.handles))
        done = self.pending.iloc[rows]
        self.pending = self.pending.drop(index=done.index)
        # Released now, which is up to one step after the rounded expiration.
        released_at = np.full(len(done), self.wheel.now_ms, dtype=np.int64)
        return self._report(done, released_at, EXPIRED)

    def _take(self, keys: pd.Index) -> pd.DataFrame:
        """Cancel the timers of keys that have one; returns their pending rows."""
        present = self.pending.index.isin(keys)
        taken = self.pending[present]
        self.wheel.cancel(taken["handle"].to_numpy(dtype=np.int64))
        self.pending = self.pending[~present]
        return taken

    @staticmethod
    def _report(
        rows: pd.DataFrame, released_at: npt.NDArray[np.int64], notice: str
    ) -> pd.DataFrame:
        report = rows.drop(columns="handle", errors="ignore").copy()
        report["released_at"] = _nullable(released_at)
        report["notice"] = notice
        return report


def _nullable(values: npt.NDArray[np.int64]) -> pd.api.extensions.ExtensionArray:
    """Epoch milliseconds, null where negative."""
    nullable: pd.api.extensions.ExtensionArray = (
        pd.Series(values, dtype="Int64").mask(values < 0).array
    )
    return nullable


def _empty(columns: list[str]) -> pd.DataFrame:
    frame = pd.DataFrame({name: np.zeros(0, dtype=np.int64) for name in ["handle", *columns]})
    frame.index = pd.Index([], dtype=object)
    return frame
