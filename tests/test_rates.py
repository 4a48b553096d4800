"""The closed loop's measure of a held client's rate (``tests/support/rates.py``): a client held in
cycles a quota span long gets the same figure wherever its run is cut."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from tests.support.rates import Acks, achieved_rate, longest_gap_s, mean_rate

SPAN_S = 11.0


def cycles(burst: list[tuple[float, int]], count: int, period_s: float) -> Acks:
    """``burst`` ((offset within the cycle, bytes) pairs) repeated ``count`` times."""
    return sorted((k * period_s + offset, n) for k in range(count) for offset, n in burst)


bursts = st.lists(
    st.tuples(st.floats(0, SPAN_S, exclude_max=True), st.integers(1, 10_000_000)),
    min_size=1,
    max_size=20,
)


@given(
    burst=bursts,
    count=st.integers(3, 8),
    after_s=st.floats(0, SPAN_S),
    cut=st.floats(0, 1),
)
def test_a_client_held_in_cycles_of_the_span_gets_its_cycles_rate_wherever_the_run_is_cut(
    burst: list[tuple[float, int]], count: int, after_s: float, cut: float
) -> None:
    acks = cycles(burst, count, SPAN_S)
    first, last = acks[0][0], acks[-1][0]
    earliest_end = first + after_s + SPAN_S + 1e-6
    end = earliest_end + cut * (last - earliest_end)
    kept = [(at, n) for at, n in acks if at <= end]
    if kept[-1][0] - first - after_s <= SPAN_S + 1e-6:
        return  # the cut left less than one span past `after_s`: no cycle to measure
    per_cycle = sum(n for _, n in burst)
    assert math.isclose(achieved_rate(kept, SPAN_S, after_s), per_cycle / SPAN_S, rel_tol=1e-9)


def test_a_cut_moves_the_rate_from_one_moment_to_another_but_not_the_spans_mean() -> None:
    # Kafka's held producer: a burst of 20 MB over 3 s, then held for the rest of its 11-s cycle.
    burst = [(second * 0.1, 2_000_000 // 3) for second in range(30)]
    acks = cycles(burst, 4, SPAN_S)
    after_burst = [(at, n) for at, n in acks if at <= 3 * SPAN_S + 2.95]
    after_hold = [(at, n) for at, n in acks if at <= 3 * SPAN_S + 0.05]
    rates = [achieved_rate(cut, SPAN_S, after_s=1) for cut in (after_burst, after_hold)]
    assert rates[0] == rates[1] or math.isclose(*rates, rel_tol=1e-9)
    from_the_first_window = [
        mean_rate([(at, n) for at, n in cut if at >= 1]) for cut in (after_burst, after_hold)
    ]
    assert from_the_first_window[0] > 1.2 * from_the_first_window[1]


@given(rate=st.integers(1_000, 10_000_000), seconds=st.integers(12, 60), after_s=st.floats(0, 1))
def test_a_steady_client_gets_its_rate(rate: int, seconds: int, after_s: float) -> None:
    acks = [(tenth / 10, rate // 10) for tenth in range(seconds * 10 + 1)]
    assert math.isclose(achieved_rate(acks, SPAN_S, after_s), rate // 10 * 10, rel_tol=0.02)


def test_a_run_shorter_than_a_span_is_its_bytes_over_its_length() -> None:
    acks = [(0.0, 100), (1.0, 100), (2.0, 100), (4.0, 100)]
    assert achieved_rate(acks, SPAN_S, after_s=1.0) == 300 / 3.0
    assert mean_rate(acks) == 400 / 4.0
    assert achieved_rate([(2.0, 5)], SPAN_S) == mean_rate([(2.0, 5)]) == 0.0
    assert achieved_rate([], SPAN_S) == mean_rate([]) == 0.0


def test_the_longest_gap_is_the_longest_hold() -> None:
    assert longest_gap_s([(5.0, 1), (0.0, 1), (1.0, 1), (3.5, 1)]) == 2.5
    assert longest_gap_s([(1.0, 1)]) == 0.0
