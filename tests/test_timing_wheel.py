"""The hierarchical timing wheel: Kafka's TimerTest, and properties against a plain model."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from state.timing_wheel import TimingWheel, WheelDecodeError

START = 1_700_000_000_123


def fire_all(wheel: TimingWheel) -> list[tuple[int, int, int]]:
    """Advances bucket by bucket, as Kafka's reaper does: (handle, fired_at, advanced_to)."""
    fired = []
    while (expiration := wheel.next_expiration()) is not None:
        result = wheel.advance(expiration)
        fired += [
            (h, at, expiration) for h, at in zip(result.handles, result.fired_at, strict=True)
        ]
    return fired


def test_already_expired_tasks_run_at_once() -> None:
    # Kafka's TimerTest.testAlreadyExpiredTask: delays -5..-1 run at add, before any advance.
    wheel = TimingWheel(tick_ms=1, wheel_size=3, start_ms=START)
    added = wheel.add(np.array([START + delay for delay in range(-5, 0)]))
    assert added.due.tolist() == [True] * 5
    assert len(wheel) == 0
    assert wheel.fired_total == 5
    assert wheel.advance(START).handles.tolist() == []


def test_task_expiration_in_order() -> None:
    # Kafka's TimerTest.testTaskExpiration: delays 0-4 once, 10-99 twice, 100-499 once, submitted
    # in random order; every one fires, in order of its delay.
    delays = [*range(5), *(d for d in range(10, 100) for _ in range(2)), *range(100, 500)]
    random.Random(7).shuffle(delays)
    wheel = TimingWheel(tick_ms=1, wheel_size=3, start_ms=START)
    added = wheel.add(np.array([START + d for d in delays]))
    delay_of = dict(zip(added.handles.tolist(), delays, strict=True))
    output = [delay_of[h] for h in added.handles[added.due].tolist()]
    output += [delay_of[h] for h, _, _ in fire_all(wheel)]
    assert output == sorted(delays)
    assert added.due.sum() == 1  # delay 0 is due at once
    assert wheel.levels > 1  # 500 ms does not fit a 3 ms wheel
    assert len(wheel) == wheel.held_by_buckets() == 0


def test_overflow_wheels_cascade_over_hours_at_one_millisecond() -> None:
    rng = np.random.default_rng(3)
    expirations = START + rng.integers(1, 6 * 3_600_000, size=2000)
    wheel = TimingWheel(tick_ms=1, wheel_size=20, start_ms=START)
    added = wheel.add(expirations)
    assert not added.due.any()
    assert wheel.levels == 6  # 20 ms, 400 ms, 8 s, 160 s, 53 min, 17.8 h
    fired = fire_all(wheel)
    at_of = {h: at for h, at, _ in fired}
    assert sorted(at_of) == sorted(added.handles.tolist())
    # Each fires exactly when advanced to its own expiration, never at a cascade.
    assert all(at == advanced for _, at, advanced in fired)
    assert [at_of[h] for h in added.handles.tolist()] == expirations.tolist()


def test_cancel_is_exact_and_stale_handles_do_nothing() -> None:
    wheel = TimingWheel(tick_ms=1, wheel_size=4, start_ms=0)
    added = wheel.add(np.arange(1, 101))
    handles = added.handles
    # The first handle again, in the same call: it cancels once.
    cancelled = wheel.cancel(np.concatenate([handles[::2], handles[:1]]))
    assert cancelled.tolist() == [True] * 50 + [False]
    assert len(wheel) == wheel.held_by_buckets() == 50
    assert wheel.cancelled_total == 50
    fired = wheel.advance(1000)
    assert fired.handles.tolist() == handles[1::2].tolist()
    assert wheel.cancel(handles).tolist() == [False] * 100  # all fired or cancelled already
    # A slot taken again by a new timer is not reachable through the old handle.
    new = wheel.add(np.array([2000])).handles
    assert wheel.cancel(handles).sum() == 0
    assert wheel.is_pending(new).tolist() == [True]


def test_fired_at_is_floor_of_expiration_by_tick() -> None:
    wheel = TimingWheel(tick_ms=10, wheel_size=5, start_ms=0)
    added = wheel.add(np.array([15, 19, 20, 27, 1234]))
    assert wheel.advance(9).handles.tolist() == []
    fired = wheel.advance(14)  # the clock moves to 10: 15 and 19 round down to it
    assert fired.fired_at.tolist() == [10, 10]
    assert fired.expirations.tolist() == [15, 19]
    assert wheel.advance(29).fired_at.tolist() == [20, 20]
    assert wheel.advance(1229).handles.tolist() == []
    assert wheel.advance(1230).fired_at.tolist() == [1230]
    assert len(wheel) == 0
    assert added.due.tolist() == [False] * 5


def test_bad_parameters_and_bytes_are_refused() -> None:
    with pytest.raises(ValueError, match="tick_ms"):
        TimingWheel(tick_ms=0)
    with pytest.raises(ValueError, match="wheel_size"):
        TimingWheel(wheel_size=1)
    with pytest.raises(WheelDecodeError):
        TimingWheel.decode(b"not a wheel")


# ---------------------------------------------------------------------- properties
@dataclass
class Model:
    """Pending timers as a plain dict; what fires by ``to`` is everything below its next tick."""

    tick: int
    now: int
    pending: dict[int, int] = field(default_factory=dict)

    def advance(self, to: int) -> list[int]:
        self.now = max(self.now, to - to % self.tick)
        due = sorted((exp, h) for h, exp in self.pending.items() if exp < self.now + self.tick)
        for _, handle in due:
            del self.pending[handle]
        return [h for _, h in due]


Operation = tuple[str, list[int]]
operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(st.integers(-50, 5000), max_size=40)),
        st.tuples(st.just("cancel"), st.lists(st.integers(0, 200), max_size=20)),
        st.tuples(st.just("advance"), st.lists(st.integers(0, 700), min_size=1, max_size=1)),
        st.tuples(st.just("reload"), st.just([])),
    ),
    max_size=40,
)


def run(tick: int, size: int, script: list[Operation]) -> tuple[TimingWheel, Model, list[int]]:
    """Runs ``script`` on a wheel and the model side by side; returns the handles fired."""
    wheel, model = TimingWheel(tick, size, 0), Model(tick, 0)
    handles: list[int] = []
    fired: list[int] = []
    for name, args in script:
        if name == "add":
            expirations = np.array([model.now + a for a in args], dtype=np.int64)
            added = wheel.add(expirations)
            handles += added.handles.tolist()
            assert added.due.tolist() == (expirations < model.now + tick).tolist()
            fired += added.handles[added.due].tolist()
            model.pending.update(
                (h, e)
                for h, e, d in zip(added.handles, expirations, added.due, strict=True)
                if not d
            )
        elif name == "cancel":
            chosen = np.array([handles[i] for i in args if i < len(handles)], dtype=np.int64)
            cancelled = wheel.cancel(chosen)
            expected = [model.pending.pop(h, None) is not None for h in chosen.tolist()]
            assert cancelled.tolist() == expected
        elif name == "advance":
            to = model.now + args[0]
            result = wheel.advance(to)
            assert result.handles.tolist() == model.advance(to)
            assert (result.fired_at == result.expirations - result.expirations % tick).all()
            assert (result.fired_at <= to).all()
            fired += result.handles.tolist()
        else:
            wheel = TimingWheel.decode(wheel.encode())
        assert len(wheel) == wheel.held_by_buckets() == len(model.pending)
        assert wheel.now_ms == model.now
    return wheel, model, fired


@settings(max_examples=300, deadline=None)
@given(
    tick=st.sampled_from([1, 2, 7]),
    size=st.sampled_from([2, 3, 20]),
    script=operations,
)
def test_wheel_matches_model(tick: int, size: int, script: list[Operation]) -> None:
    wheel, model, fired = run(tick, size, script)
    assert len(fired) == len(set(fired))  # each timer fires at most once
    pending, expirations = wheel.pending()
    assert dict(zip(pending.tolist(), expirations.tolist(), strict=True)) == model.pending
    # Whatever is left fires, each exactly at its rounded expiration.
    rest = fire_all(wheel)
    assert sorted(h for h, _, _ in rest) == sorted(model.pending)
    assert all(at == advanced for _, at, advanced in rest)
    assert not set(fired) & {h for h, _, _ in rest}


@settings(max_examples=200, deadline=None)
@given(
    expirations=st.lists(st.integers(0, 100_000), max_size=60),
    cuts=st.lists(st.integers(0, 120_000), max_size=8),
)
def test_results_do_not_depend_on_how_advance_is_split(
    expirations: list[int], cuts: list[int]
) -> None:
    def fired_by(points: list[int]) -> dict[int, int]:
        wheel = TimingWheel(1, 20, 0)
        handles = wheel.add(np.array(expirations, dtype=np.int64)).handles
        order = {h: i for i, h in enumerate(handles.tolist())}
        seen: dict[int, int] = {}
        for point in points:
            result = wheel.advance(point)
            seen.update(
                {
                    order[h]: at
                    for h, at in zip(result.handles.tolist(), result.fired_at, strict=True)
                }
            )
        return seen

    end = 120_001
    assert fired_by([*sorted(cuts), end]) == fired_by([end])
    # Expiration 0 is due when added, so no advance reports it.
    assert fired_by([end]) == {i: e for i, e in enumerate(expirations) if e > 0}


def test_encoding_is_compact() -> None:
    wheel = TimingWheel(1, 20, START)
    wheel.add(START + np.random.default_rng(1).integers(1, 60_000, size=100_000))
    encoded = wheel.encode()
    assert len(encoded) < 100_000 * 8  # well under two int64 per timer
    restored = TimingWheel.decode(encoded)
    assert len(restored) == 100_000
    assert restored.next_expiration() == wheel.next_expiration()
