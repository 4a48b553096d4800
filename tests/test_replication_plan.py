"""KIP-73's throttle planning: MoveRatio, MoveTime and the sanity bound IN < T < N - IN/R."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from state.replication_plan import (
    bytes_to_move,
    estimate_move,
    move_ratio,
    move_time_s,
    throttle_bound,
)

MB = 1_000_000
GB = 1_000_000_000
rates = st.floats(min_value=1.0, max_value=1e12, allow_nan=False, allow_infinity=False)
bytes_in_rates = st.floats(min_value=0.0, max_value=1e12, allow_nan=False, allow_infinity=False)
sizes = st.floats(min_value=0.0, max_value=1e15, allow_nan=False, allow_infinity=False)


def test_move_ratio_is_the_share_of_partitions_moved() -> None:
    assert move_ratio(10, 40) == 0.25
    assert move_ratio(0, 7) == 0.0
    assert move_ratio(7, 7) == 1.0


def test_move_time_follows_the_kip_formula() -> None:
    # 0.25 x 100 GB per broker x 3 brokers / (10 MB/s - 2 MB/s) = 75 GB / 8 MB/s = 9375 s
    assert move_time_s(0.25, 100 * GB, 3, 10 * MB, 2 * MB) == pytest.approx(9375.0)
    # No inbound traffic: the whole throttle catches up.
    assert move_time_s(1.0, 50 * MB, 2, 10 * MB, 0.0) == pytest.approx(10.0)
    # Nothing to move takes no time, whatever the rate.
    assert move_time_s(0.0, 100 * GB, 3, 10 * MB, 2 * MB) == 0.0


@pytest.mark.parametrize("bytes_in", [10 * MB, 12 * MB])
def test_a_throttle_no_higher_than_bytes_in_never_completes(bytes_in: float) -> None:
    assert move_time_s(0.25, 100 * GB, 3, 10 * MB, bytes_in) == math.inf
    estimate = estimate_move(
        partitions_moved=10,
        total_partitions=40,
        log_size_per_broker=100 * GB,
        brokers=3,
        rate=10 * MB,
        max_bytes_in=bytes_in,
    )
    assert not estimate.completes
    assert estimate.spare_rate == 10 * MB - bytes_in
    assert estimate.bytes_to_move == pytest.approx(75 * GB)


def test_an_estimate_collects_its_parts() -> None:
    estimate = estimate_move(
        partitions_moved=10,
        total_partitions=40,
        log_size_per_broker=100 * GB,
        brokers=3,
        rate=10 * MB,
        max_bytes_in=2 * MB,
    )
    assert (estimate.move_ratio, estimate.spare_rate, estimate.completes) == (0.25, 8 * MB, True)
    assert estimate.seconds == pytest.approx(9375.0)


def test_the_bound_names_the_broken_side() -> None:
    # IN = 2 MB/s, N = 12 MB/s, R = 3: 2 MB/s < T < 11.333 MB/s.
    holds = throttle_bound(10 * MB, 2 * MB, 12 * MB, 3)
    assert (holds.holds, holds.too_low, holds.too_high, holds.satisfiable) == (
        True,
        False,
        False,
        True,
    )
    assert holds.upper == pytest.approx(12 * MB - 2 * MB / 3)
    low = throttle_bound(1 * MB, 2 * MB, 12 * MB, 3)
    assert (low.holds, low.too_low, low.too_high) == (False, True, False)
    high = throttle_bound(11.5 * MB, 2 * MB, 12 * MB, 3)
    assert (high.holds, high.too_low, high.too_high) == (False, False, True)
    # Both ends are strict.
    assert throttle_bound(2 * MB, 2 * MB, 12 * MB, 3).too_low
    assert throttle_bound(11 * MB, 3 * MB, 12 * MB, 3).too_high
    # A saturated network: no throttle fits, and a throttle can break both sides at once.
    saturated = throttle_bound(9 * MB, 10 * MB, 12 * MB, 1)
    assert not saturated.satisfiable
    assert (saturated.too_low, saturated.too_high) == (True, True)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: move_ratio(1, 0), "total partition count must be > 0"),
        (lambda: move_ratio(-1, 5), "between 0 and the total"),
        (lambda: move_ratio(6, 5), "between 0 and the total"),
        (lambda: bytes_to_move(1.5, 1.0, 1), "move ratio must be between 0 and 1"),
        (lambda: bytes_to_move(0.5, -1.0, 1), "log size per broker must be >= 0"),
        (lambda: bytes_to_move(0.5, 1.0, 0), "broker count must be >= 1"),
        (lambda: move_time_s(0.5, 1.0, 1, 0.0, 0.0), "throttle rate must be > 0"),
        (lambda: move_time_s(0.5, 1.0, 1, math.inf, 0.0), "throttle rate must be a finite"),
        (lambda: move_time_s(0.5, 1.0, 1, 5.0, -1.0), "inbound rate (max BytesIn) must be >= 0"),
        (lambda: move_time_s(0.5, math.nan, 1, 5.0, 0.0), "must be a finite number"),
        (lambda: throttle_bound(5.0, 1.0, 0.0, 3), "network throughput must be > 0"),
        (lambda: throttle_bound(5.0, 1.0, 10.0, 0), "replication factor must be >= 1"),
        (lambda: throttle_bound(-5.0, 1.0, 10.0, 3), "throttle rate must be >= 0"),
    ],
)
def test_invalid_inputs_are_refused(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


@given(st.integers(0, 10_000), st.integers(1, 10_000))
def test_the_ratio_is_a_share(moved: int, total: int) -> None:
    assume(moved <= total)
    ratio = move_ratio(moved, total)
    assert 0.0 <= ratio <= 1.0
    assert ratio * total == pytest.approx(moved)


@given(
    st.floats(0.0, 1.0), sizes, st.integers(1, 1000), rates, bytes_in_rates, st.floats(1.01, 100.0)
)
def test_a_higher_throttle_never_slows_a_move(
    ratio: float, size: float, brokers: int, rate: float, bytes_in: float, factor: float
) -> None:
    slower = move_time_s(ratio, size, brokers, rate, bytes_in)
    faster = move_time_s(ratio, size, brokers, rate * factor, bytes_in)
    assert faster <= slower
    assert math.isinf(slower) == (rate <= bytes_in)
    if math.isfinite(slower):
        # The time is the data divided by the spare rate, so it moves the data at that rate.
        assert slower * (rate - bytes_in) == pytest.approx(ratio * size * brokers, rel=1e-9)


@given(st.floats(0.0, 1.0), sizes, st.integers(1, 1000), rates, bytes_in_rates)
def test_move_time_scales_with_the_data(
    ratio: float, size: float, brokers: int, rate: float, bytes_in: float
) -> None:
    assume(rate > bytes_in)
    once = move_time_s(ratio, size, brokers, rate, bytes_in)
    twice = move_time_s(ratio, size, brokers * 2, rate, bytes_in)
    assert twice == pytest.approx(2 * once, rel=1e-9, abs=1e-12)


@given(rates, bytes_in_rates, rates, st.integers(1, 10))
def test_the_bound_is_the_two_strict_inequalities(
    rate: float, bytes_in: float, network: float, replication_factor: int
) -> None:
    bound = throttle_bound(rate, bytes_in, network, replication_factor)
    upper = network - bytes_in / replication_factor
    assert bound.too_low == (rate <= bytes_in)
    assert bound.too_high == (rate >= upper)
    assert bound.holds == (bytes_in < rate < upper)
    if bound.holds:
        assert bound.satisfiable
    # A throttle that holds the bound leaves room to catch up: the move completes.
    if bound.holds:
        assert math.isfinite(move_time_s(1.0, 1.0, 1, rate, bytes_in))
