"""Throttled wall time: the union of throttle intervals per counter, and the engine's releases."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from state.throttled_time import Intervals, covered_ms, merge, release_ends

GROUPS = 3
#: (group, start, length) with small times, so that a brute-force set of milliseconds is cheap.
interval_rows = st.lists(
    st.tuples(st.integers(0, GROUPS - 1), st.integers(0, 200), st.integers(0, 60)), max_size=40
)


def intervals(rows: list[tuple[int, int, int]]) -> Intervals:
    groups, starts, lengths = (np.array([row[i] for row in rows], dtype=np.int64) for i in range(3))
    return Intervals(groups, starts, starts + lengths)


def milliseconds(rows: list[tuple[int, int, int]], group: int) -> set[int]:
    """Brute force: every millisecond some interval of ``group`` covers."""
    return {ms for g, start, length in rows if g == group for ms in range(start, start + length)}


def test_overlapping_throttles_count_once_and_touching_ones_join() -> None:
    merged = merge(
        Intervals(
            groups=np.array([0, 0, 0, 0, 1], dtype=np.int64),
            starts=np.array([0, 500, 1200, 1500, 100], dtype=np.int64),
            ends=np.array([1000, 800, 1500, 1600, 100], dtype=np.int64),
        )
    )
    assert merged.groups.tolist() == [0, 0]  # group 1's only interval is empty
    assert list(zip(merged.starts.tolist(), merged.ends.tolist(), strict=True)) == [
        (0, 1000),
        (1200, 1600),
    ]


def test_covered_ms_clips_to_the_span() -> None:
    throttles = Intervals(
        groups=np.array([0, 1, 1], dtype=np.int64),
        starts=np.array([-500, 100, 900], dtype=np.int64),
        ends=np.array([300, 400, 5000], dtype=np.int64),
    )
    assert covered_ms(throttles, 3, (0, 1000)).tolist() == [300, 300 + 100, 0]


def test_a_newer_decision_replaces_the_pending_throttle() -> None:
    # Group 0: a 40 s throttle superseded 12 s later by a decision without one, which the next
    # decision replaces in turn. Group 1: a throttle shortened by a newer, shorter one, whose own
    # throttle runs out before the next decision. Group 2's only decision keeps its whole throttle.
    groups = np.array([0, 1, 0, 1, 2, 0, 1], dtype=np.int64)
    ts = np.array([0, 0, 12_000, 1_000, 0, 50_000, 9_000], dtype=np.int64)
    throttle = np.array([40_000, 10_000, 0, 2_000, 700, 0, 0], dtype=np.int64)
    assert release_ends(groups, ts, throttle).tolist() == [
        12_000,
        1_000,
        12_000,
        3_000,
        700,
        50_000,
        9_000,
    ]


def test_a_late_decision_ends_the_pending_throttle_at_once() -> None:
    # The engine replaces the pending throttle when the late decision arrives: never before the
    # replaced one started.
    groups = np.zeros(2, dtype=np.int64)
    ts = np.array([5_000, 1_000], dtype=np.int64)
    assert release_ends(groups, ts, np.array([3_000, 500], dtype=np.int64)).tolist() == [
        5_000,
        1_500,
    ]


@given(interval_rows)
def test_union_length_equals_a_brute_force_count_of_milliseconds(
    rows: list[tuple[int, int, int]],
) -> None:
    covered = covered_ms(intervals(rows), GROUPS, (-1_000, 10_000))
    assert covered.tolist() == [len(milliseconds(rows, group)) for group in range(GROUPS)]


@given(interval_rows, st.integers(0, 260), st.integers(0, 260))
def test_union_is_at_most_the_sum_and_the_span(
    rows: list[tuple[int, int, int]], low: int, width: int
) -> None:
    throttles = intervals(rows)
    covered = covered_ms(throttles, GROUPS, (low, low + width))
    summed = np.zeros(GROUPS, dtype=np.int64)
    np.add.at(summed, throttles.groups, throttles.ends - throttles.starts)
    assert (covered <= summed).all()
    assert (covered <= width).all()
    assert (covered >= 0).all()


@given(interval_rows, st.randoms(use_true_random=False))
def test_merged_intervals_do_not_depend_on_the_order(
    rows: list[tuple[int, int, int]], rng: random.Random
) -> None:
    shuffled = list(rows)
    rng.shuffle(shuffled)
    merged, again = merge(intervals(rows)), merge(intervals(shuffled))
    for field in ("groups", "starts", "ends"):
        assert getattr(merged, field).tolist() == getattr(again, field).tolist()
    # Disjoint and sorted within each group, with a gap between neighbours.
    same = merged.groups[1:] == merged.groups[:-1]
    assert (merged.starts[1:][same] > merged.ends[:-1][same]).all()
    assert (merged.ends > merged.starts).all()


@given(st.lists(st.tuples(st.integers(0, GROUPS - 1), st.integers(0, 50)), max_size=30))
def test_releases_in_event_time_order_never_overlap(rows: list[tuple[int, int]]) -> None:
    """Decisions one per 10 ms: each throttle ends by the group's next decision, so the released
    intervals are disjoint and their sum is their union."""
    groups = np.array([row[0] for row in rows], dtype=np.int64)
    throttle = np.array([row[1] for row in rows], dtype=np.int64)
    ts = np.arange(len(rows), dtype=np.int64) * 10
    ends = release_ends(groups, ts, throttle)
    assert (ends >= ts).all()
    assert (ends <= ts + throttle).all()
    released = Intervals(groups, ts, ends)
    summed = np.zeros(GROUPS, dtype=np.int64)
    np.add.at(summed, groups, ends - ts)
    assert covered_ms(released, GROUPS, (0, 10_000)).tolist() == summed.tolist()
