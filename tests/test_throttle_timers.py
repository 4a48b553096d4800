"""Release timers for throttle decisions: expiry, replacement, encoding."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from state.throttle_timers import EXPIRED, SUPERSEDED, ThrottleTimers, TimersDecodeError

NOW = 1_700_000_000_000


def decisions(*rows: tuple[str, int, int]) -> pd.DataFrame:
    """(key, throttle_ms, until) rows, with a payload column to carry along."""
    frame = pd.DataFrame(
        {
            "throttle_ms": [r[1] for r in rows],
            "until": [r[2] for r in rows],
            "rate": [float(r[1]) for r in rows],
        },
        index=pd.Index([r[0] for r in rows], dtype=object),
    )
    return frame.astype({"throttle_ms": np.int64, "until": np.int64})


def notices(frame: pd.DataFrame) -> dict[str, tuple[object, object]]:
    return {
        str(key): (row["notice"], None if pd.isna(row["released_at"]) else int(row["released_at"]))
        for key, row in frame.iterrows()
    }


def test_a_throttle_expires_once_with_its_decision() -> None:
    timers = ThrottleTimers.empty(tick_ms=1, wheel_size=20, now_ms=NOW)
    first = timers.step(NOW, decisions(("a", 500, NOW + 500), ("b", 0, NOW)))
    assert notices(first) == {"a": (None, None), "b": (None, None)}
    assert timers.stats().pending == 1
    assert timers.next_expiration() is not None
    assert len(timers.step(NOW + 499, decisions())) == 0
    expired = timers.step(NOW + 503, decisions())
    assert notices(expired) == {"a": (EXPIRED, NOW + 503)}  # released when the step ran
    assert expired.loc["a", "rate"] == 500.0  # the decision it ends, for the reader
    assert timers.stats().pending == 0
    assert timers.stats().fired == 1
    assert len(timers.step(NOW + 10_000, decisions())) == 0


def test_newer_decisions_replace_or_supersede() -> None:
    timers = ThrottleTimers.empty(1, 20, NOW)
    timers.step(NOW, decisions(("a", 500, NOW + 500), ("b", 800, NOW + 800)))
    changed = timers.step(NOW + 100, decisions(("a", 900, NOW + 1000), ("b", 0, NOW + 100)))
    # a: replaced by a later throttle, silently; b: no delay any more, so it ended early.
    assert notices(changed) == {"a": (None, None), "b": (SUPERSEDED, None)}
    assert timers.stats().pending == 1
    assert timers.stats().cancelled == 2
    assert notices(timers.step(NOW + 999, decisions())) == {}
    assert notices(timers.step(NOW + 1000, decisions())) == {"a": (EXPIRED, NOW + 1000)}


def test_a_decision_already_over_is_released_at_once() -> None:
    timers = ThrottleTimers.empty(1, 20, NOW)
    rows = timers.step(NOW, decisions(("late", 300, NOW - 200)))
    assert notices(rows) == {"late": (None, NOW)}
    assert timers.stats().pending == 0


def test_expiry_and_new_decision_in_one_step_report_the_decision() -> None:
    timers = ThrottleTimers.empty(1, 20, NOW)
    timers.step(NOW, decisions(("a", 50, NOW + 50)))
    rows = timers.step(NOW + 60, decisions(("a", 400, NOW + 460)))
    assert list(rows.index) == ["a"]
    assert rows.loc["a", "until"] == NOW + 460
    assert rows.loc["a", "notice"] == EXPIRED
    assert timers.stats().pending == 1


def test_expiries_with_and_without_a_new_decision_in_one_step() -> None:
    """The decisions come first (one of them an expiry's); then the other expiries, in the order
    their timers fired."""
    timers = ThrottleTimers.empty(1, 20, NOW)
    timers.step(NOW, decisions(("a", 30, NOW + 30), ("b", 20, NOW + 20), ("c", 10, NOW + 10)))
    rows = timers.step(NOW + 60, decisions(("d", 0, NOW + 60), ("b", 400, NOW + 460)))
    assert list(rows.index) == ["d", "b", "c", "a"]
    assert notices(rows) == {
        "d": (None, None),
        "b": (EXPIRED, None),
        "c": (EXPIRED, NOW + 60),
        "a": (EXPIRED, NOW + 60),
    }
    assert rows.loc["a", "until"] == NOW + 30  # the decision its expiry ends
    assert timers.stats().pending == 1


def test_encoding_round_trip_keeps_timers_and_payload() -> None:
    timers = ThrottleTimers.empty(1, 20, NOW)
    many = [(f"k{i}", 100 + i, NOW + 100 + i) for i in range(1000)]
    timers.step(NOW, decisions(*many))
    restored = ThrottleTimers.decode(timers.encode())
    assert restored.stats() == timers.stats()
    assert restored.next_expiration() == timers.next_expiration()
    expired = restored.step(NOW + 2000, decisions())
    assert sorted(expired.index) == sorted(k for k, _, _ in many)
    assert (expired["released_at"].to_numpy(dtype=np.int64) == NOW + 2000).all()
    with pytest.raises(TimersDecodeError):
        ThrottleTimers.decode(b"garbage")
