"""Throttled wall time: how long a counter was throttled, overlapping throttles counted once.

A decision with ``throttle_ms = d`` made at event time ``ts`` throttles its counter over the
half-open interval ``[ts, ts + d)`` (epoch ms). Summing ``d`` over decisions counts the same wall
time once for every throttle that overlaps it: a client over its quota is throttled again on
every request while the last throttle still runs, so the sum can be many times the time it was
throttled. Wall time is the length of the union of the intervals.

Releases shorten intervals. The engine keeps one pending throttle per counter: a newer decision
replaces it, with its own end if it throttles and as a release (``superseded``) if it does not
(``state.throttle_timers``). :func:`release_ends` applies that rule to a sequence of decisions;
intervals cut that way never overlap when the decisions are in event-time order, and the union
still counts each millisecond once when they are not.

Everything is vectorised over many counters at once: ``groups`` holds a non-negative integer per
interval naming its counter (``pandas.factorize`` codes, for instance).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

Int64Array = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Intervals:
    """Half-open ``[starts, ends)`` per row, each belonging to a group."""

    groups: Int64Array
    starts: Int64Array
    ends: Int64Array

    def __len__(self) -> int:
        return len(self.groups)


def release_ends(groups: Int64Array, ts: Int64Array, throttle_ms: Int64Array) -> Int64Array:
    """When each decision's throttle ends under the engine's one-pending-throttle rule.

    Rows are decisions in the order the engine takes them. A decision's throttle ends at the
    earlier of ``ts + throttle_ms`` and the group's next decision (which replaces it), and never
    before it starts; a group's last decision keeps its whole throttle.
    """
    ends = ts + throttle_ms
    order = np.argsort(groups, kind="stable")  # keeps each group's decisions in their order
    next_ts = np.full(len(order), np.iinfo(np.int64).max, dtype=np.int64)
    followed = groups[order][1:] == groups[order][:-1]
    next_ts[:-1][followed] = ts[order][1:][followed]
    cut = np.empty_like(ends)
    cut[order] = np.maximum(np.minimum(ends[order], next_ts), ts[order])
    return cut


def merge(intervals: Intervals) -> Intervals:
    """Each group's union as disjoint intervals, sorted by group and start.

    Empty intervals (``end <= start``) are dropped; intervals that overlap or touch are joined.
    """
    present = intervals.ends > intervals.starts
    groups = intervals.groups[present]
    starts = intervals.starts[present]
    ends = intervals.ends[present]
    order = np.lexsort((starts, groups))
    groups, starts, ends = groups[order], starts[order], ends[order]
    if not len(groups):
        return Intervals(groups, starts, ends)
    # The furthest end so far in the group, before each row: a row past it starts a new run.
    reach = pd.Series(ends).groupby(groups).cummax().to_numpy(dtype=np.int64)
    opens = np.ones(len(groups), dtype=np.bool_)
    opens[1:] = (groups[1:] != groups[:-1]) | (starts[1:] > reach[:-1])
    first = np.flatnonzero(opens)
    return Intervals(groups[first], starts[first], np.maximum.reduceat(ends, first))


def covered_ms(intervals: Intervals, groups: int, within: tuple[int, int]) -> Int64Array:
    """Per group ``0 .. groups - 1``: the milliseconds of ``[within[0], within[1])`` that the
    group's union covers."""
    merged = merge(intervals)
    low, high = within
    lengths = np.clip(np.minimum(merged.ends, high) - np.maximum(merged.starts, low), 0, None)
    covered = np.zeros(groups, dtype=np.int64)
    np.add.at(covered, merged.groups, lengths)
    return covered
