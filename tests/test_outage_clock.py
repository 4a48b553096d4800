"""The outage clock every caller rides outages out with (``quotastream/outage.py``)."""

from __future__ import annotations

import logging
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quotastream.outage import Outage, OutageError, OutageStatus, run_passes
from tests.support.agents import FakeClock

#: The wall clock (ms) when the fake clock's monotonic seconds read 1000.
WALL_MS = (1000 + 1_700_000_000) * 1000


def outage_with(
    clock: FakeClock, max_outage_s: float | None, logger_name: str = "test.outage"
) -> tuple[Outage, list[OutageStatus]]:
    changes: list[OutageStatus] = []
    outage = Outage(
        "Kafka at h:9092",
        max_outage_s,
        clock=clock,
        on_change=changes.append,
        logger=logging.getLogger(logger_name),
    )
    return outage, changes


def test_one_warning_as_an_outage_begins_and_one_as_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(WALL_MS)
    outage, changes = outage_with(clock, 60)
    with caplog.at_level(logging.WARNING, logger="test.outage"):
        assert outage.failed(ConnectionRefusedError("111 ECONNREFUSED")) is True
        for _ in range(9):
            clock.now += 2
            assert outage.failed(TimeoutError("no answer")) is False
        assert outage.down
        assert outage.down_for_s() == 18
        clock.now += 1.5
        assert outage.recovered() == 19.5
        assert outage.recovered() is None  # no outage to end
    messages = [record.getMessage() for record in caplog.records]
    assert messages == [
        "Kafka at h:9092 unreachable (111 ECONNREFUSED); waiting up to 60 s for it",
        "Kafka at h:9092 reachable again after 19.5 s (10 failed attempts)",
    ]
    assert (outage.outages, outage.failures, outage.down) == (1, 10, False)
    # Every failed attempt and the end are reported; the outage began at the first failure.
    assert len(changes) == 11
    assert {c.since_ms for c in changes[:10]} == {WALL_MS}
    assert changes[-1] == OutageStatus(since_ms=None, outages=1, failures=10)


def test_gives_up_after_max_outage_naming_the_server_and_the_last_error() -> None:
    clock = FakeClock(WALL_MS)
    outage, _ = outage_with(clock, 5)
    outage.failed(TimeoutError("first"))
    clock.now += 4.9
    outage.failed(TimeoutError("second"))
    clock.now += 0.1
    with pytest.raises(OutageError) as error:
        outage.failed(TimeoutError("Failed to get offsets by timestamps in 2000 ms"))
    assert str(error.value) == (
        "Kafka at h:9092 unreachable for more than 5 s (3 failed attempts): "
        "Failed to get offsets by timestamps in 2000 ms"
    )


def test_each_outage_is_timed_from_its_own_beginning() -> None:
    clock = FakeClock(WALL_MS)
    outage, _ = outage_with(clock, 5)
    outage.failed(TimeoutError("a"))
    clock.now += 4
    outage.recovered()
    clock.now += 100
    outage.failed(TimeoutError("b"))
    clock.now += 4
    outage.failed(TimeoutError("c"))  # 4 s into the second outage: not yet
    assert (outage.outages, outage.failures) == (2, 3)


def test_without_a_limit_the_first_failure_is_raised_as_it_is() -> None:
    outage, changes = outage_with(FakeClock(WALL_MS), None)
    error = TimeoutError("config records 0..3 not received within 10000 ms")
    with pytest.raises(TimeoutError) as raised:
        outage.failed(error)
    assert raised.value is error
    assert (outage.outages, outage.failures, changes) == (0, 0, [])


class Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


# A step: fail or succeed, after some time.
steps = st.lists(st.tuples(st.booleans(), st.floats(0, 10)), max_size=60)


@given(steps)
def test_counts_and_messages_follow_the_transitions(history: list[tuple[bool, float]]) -> None:
    clock = FakeClock(WALL_MS)
    handler = Recorder()
    records = handler.records
    logger = logging.getLogger("test.outage.property")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        outage, changes = outage_with(clock, 1e9, logger.name)
        began = ended = failures = 0
        down = False
        for failing, pause in history:
            clock.now += pause
            if failing:
                failures += 1
                began += not down
                down = True
                outage.failed(TimeoutError("x"))
            else:
                ended += down
                down = False
                outage.recovered()
        assert (outage.outages, outage.failures, outage.down) == (began, failures, down)
        assert len(records) == began + ended  # one line as each begins, one as each ends
        assert len(changes) == failures + ended
        assert (outage.status().since_ms is None) == (not down)
    finally:
        logger.removeHandler(handler)


def test_an_agents_passes_ride_out_their_errors_and_stop_at_others() -> None:
    """run_passes: a failing pass counts toward the outage and the next one runs; an error
    the agent does not expect ends the loop."""
    clock = FakeClock(WALL_MS)
    outage, _ = outage_with(clock, max_outage_s=60)
    stopped = threading.Event()
    outcomes = iter([OSError("refused"), OSError("refused"), None, None, KeyError("a bug")])

    def one_pass() -> None:
        outcome = next(outcomes)
        if outcome is not None:
            raise outcome

    with pytest.raises(KeyError, match="a bug"):
        run_passes(one_pass, every_s=0, stopped=stopped, outage=outage, errors=(OSError,))
    assert (outage.outages, outage.failures, outage.down) == (1, 2, False)
    stopped.set()
    run_passes(one_pass, every_s=0, stopped=stopped, outage=outage, errors=(OSError,))  # at once
