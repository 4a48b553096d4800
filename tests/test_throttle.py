"""Kafka's throttle-time formula."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from state.throttle import MAX_THROTTLE_MS, java_round, throttle_ms, throttle_of


def one(rate: float, limit: float, window_ms: int) -> int:
    return int(throttle_ms(np.array([rate]), np.array([limit]), np.array([window_ms]))[0])


def test_java_round_rounds_half_up() -> None:
    assert java_round(np.array([0.5, 1.5, 2.5, -0.5, 2.4999])).tolist() == [1, 2, 3, 0, 2]


def test_reference_formula() -> None:
    assert one(600, 500, 10_500) == 2100


def test_unlimited_never_throttles() -> None:
    assert one(1e18, float("inf"), 10_000) == 0


def test_a_tiny_overshoot_still_throttles_one_ms() -> None:
    # Kafka would round 0.1 ms to 0 while reporting a violation.
    assert one(500.001, 500, 10_000) == 1


def test_absurd_ratios_are_capped() -> None:
    assert one(1e300, 1e-300, 10_000) == MAX_THROTTLE_MS


@given(
    rate=st.floats(0, 1e15, allow_nan=False),
    limit=st.floats(1e-3, 1e12, allow_nan=False),
    window_ms=st.integers(1, 3_600_000),
)
def test_throttle_is_zero_exactly_when_within_quota(
    rate: float, limit: float, window_ms: int
) -> None:
    delay = one(rate, limit, window_ms)
    assert delay >= 0
    assert (delay == 0) == (rate <= limit)


@given(
    rate=st.floats(0, 1e15, allow_nan=False),
    limit=st.floats(1e-3, 1e12, allow_nan=False),
    window_ms=st.integers(1, 3_600_000),
)
def test_one_window_at_a_time_throttles_as_the_engines_columns_do(
    rate: float, limit: float, window_ms: int
) -> None:
    """The proxy's scalar form of the formula (``throttle_of``) and the engine's columnar one
    give the same throttle for the same window."""
    assert throttle_of((rate - limit) / limit * window_ms) == one(rate, limit, window_ms)


def test_the_scalar_formula_rounds_half_up_with_a_floor_of_one_ms() -> None:
    assert [throttle_of(x) for x in (-5.0, 0.0, 0.2, 0.5, 1.5, 2.4999, math.inf)] == [
        0,
        0,
        1,
        1,
        2,
        2,
        MAX_THROTTLE_MS,
    ]
