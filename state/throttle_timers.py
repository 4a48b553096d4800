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

from state.keyed_table import KeyedColumns
from state.timer_stats import TimerStats
from state.timing_wheel import TimingWheel

EXPIRED = "expired"
SUPERSEDED = "superseded"

_FORMAT = b"quotastream.throttle_timers.1"
#: The timers' own columns; the others are the decisions' payload.
_HANDLE = "handle"


class TimersDecodeError(ValueError):
    """Bytes that are not encoded throttle timers."""


class ThrottleTimers:
    """Pending throttles of one state shard, keyed by decision key, in one timing wheel.

    ``pending`` holds, per key, ``handle``, ``until`` and the payload columns.
    """

    def __init__(self, wheel: TimingWheel, pending: KeyedColumns | None = None) -> None:
        self.wheel = wheel
        self.pending = (
            pending
            if pending is not None
            else KeyedColumns.empty({_HANDLE: np.int64, "until": np.int64})
        )

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
        keys = decisions.index
        replaced = self._take(keys)
        throttled = decisions["throttle_ms"].to_numpy() > 0
        if "enforced" in decisions:
            throttled &= decisions["enforced"].to_numpy(dtype=np.bool_)
        added = self.wheel.add(decisions["until"].to_numpy(dtype=np.int64)[throttled])
        released_at = np.full(len(decisions), -1, dtype=np.int64)
        over_at_once = np.flatnonzero(throttled)[added.due]
        released_at[over_at_once] = self.wheel.now_ms
        still_pending = np.flatnonzero(throttled)[~added.due]
        notice = np.full(len(decisions), None, dtype=object)
        superseded = replaced.copy()
        superseded[still_pending] = False
        notice[superseded] = SUPERSEDED
        # A key whose timer fired in this step and that has a new decision reports the new
        # decision, with the expiry notice so that waiting agents wake up and read it.
        expiry_of_decision = expired.positions_of(keys)
        notice[expiry_of_decision >= 0] = EXPIRED
        new = KeyedColumns.of_frame(decisions.iloc[still_pending])
        self.pending = self.pending.upserted(new.with_column(_HANDLE, added.handles[~added.due]))
        # Found from the expiries' side: looking them up among the decisions would hash every
        # decision's key (8 ms for 49k), most batches to find no expiry at all.
        only_expired = expired.without(expiry_of_decision[expiry_of_decision >= 0])
        if not len(only_expired):
            return decisions.assign(released_at=_nullable(released_at), notice=notice)
        # Released now, which is up to one step after the rounded expiration.
        released_at = np.append(released_at, np.full(len(only_expired), self.wheel.now_ms))
        notice = np.append(notice, np.full(len(only_expired), EXPIRED, dtype=object))
        payload = only_expired.without_column(_HANDLE)
        columns = {
            name: np.concatenate([decisions[name].to_numpy(), payload[name]])
            for name in decisions.columns
        }
        return pd.DataFrame(
            {**columns, "released_at": _nullable(released_at), "notice": notice},
            index=pd.Index(np.concatenate([keys.to_numpy(dtype=object), payload.keys])),
        )

    # ------------------------------------------------------------------ encoding
    def encode(self) -> bytes:
        return self.pending.encode({b"format": _FORMAT, b"wheel": self.wheel.encode()})

    @classmethod
    def decode(cls, data: bytes) -> ThrottleTimers:
        pending, metadata = KeyedColumns.decode(data, _FORMAT, "throttle timers", TimersDecodeError)
        return cls(TimingWheel.decode(metadata[b"wheel"]), pending)

    # ------------------------------------------------------------------ internals
    def _expire(self, now_ms: int) -> KeyedColumns:
        """The pending rows whose timers fire by ``now_ms``, in firing order; they leave."""
        fired = self.wheel.advance(now_ms)
        if not len(fired.handles):
            return self.pending.rows(np.zeros(0, dtype=np.intp))
        rows = pd.Index(self.pending[_HANDLE]).get_indexer(pd.Index(fired.handles))
        done = self.pending.rows(rows)
        self.pending = self.pending.without(rows)
        return done

    def _take(self, keys: pd.Index) -> npt.NDArray[np.bool_]:
        """Cancel the timers of keys that have one; which of ``keys`` had one."""
        at = self.pending.positions_of(keys)
        had = at >= 0
        if had.any():
            taken = np.sort(at[had])
            self.wheel.cancel(self.pending[_HANDLE][taken])
            self.pending = self.pending.without(taken)
        return had


def _nullable(values: npt.NDArray[np.int64]) -> pd.api.extensions.ExtensionArray:
    """Epoch milliseconds, null where negative."""
    nullable: pd.api.extensions.ExtensionArray = pd.arrays.IntegerArray(values, values < 0)
    return nullable
