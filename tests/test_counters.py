"""Deltas of the brokers' cumulative counters (quotastream/brokers/counters.py): restarts,
resets, counters that appear and brokers that cannot be scraped."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from quotastream.brokers.counters import CounterDeltas, Scrape


def test_the_first_scrape_is_a_baseline_then_each_one_gives_what_grew() -> None:
    deltas: CounterDeltas[str] = CounterDeltas()
    assert deltas.update(1, Scrape(100.0, {"in": 500.0, "out": 10.0})) == {}
    assert deltas.update(1, Scrape(100.0, {"in": 800.0, "out": 10.0})) == {"in": 300.0}
    assert deltas.update(2, Scrape(50.0, {"in": 7.0})) == {}  # another broker: its own baseline


def test_a_restart_or_a_reset_counts_the_whole_value_and_a_new_counter_too() -> None:
    deltas: CounterDeltas[str] = CounterDeltas()
    deltas.update(1, Scrape(100.0, {"in": 500.0, "out": 400.0}))
    # A reset without a restart: "out" went down.
    assert deltas.update(1, Scrape(100.0, {"in": 600.0, "out": 30.0})) == {"in": 100.0, "out": 30.0}
    # Restarted: counters start over, even one that has grown past its old value.
    assert deltas.update(1, Scrape(200.0, {"in": 900.0, "out": 5.0})) == {"in": 900.0, "out": 5.0}
    # A topic's meters registered since the last scrape.
    assert deltas.update(1, Scrape(200.0, {"in": 900.0, "out": 5.0, "new": 70.0})) == {"new": 70.0}


def test_an_unreachable_broker_is_counted_at_the_next_scrape_that_reaches_it() -> None:
    deltas: CounterDeltas[str] = CounterDeltas()
    deltas.update(1, Scrape(100.0, {"in": 500.0}))
    # Nothing is scraped while it is down; its last values are kept.
    assert deltas.update(1, Scrape(100.0, {"in": 2_500.0})) == {"in": 2_000.0}


# A broker's life, step by step: bytes counted on a counter, a restart, a scrape that reaches
# it, or one that does not.
steps = st.lists(
    st.one_of(
        st.tuples(st.just("count"), st.sampled_from(["a", "b", "c"]), st.integers(1, 1_000)),
        st.tuples(st.just("restart")),
        st.tuples(st.just("scrape")),
        st.tuples(st.just("down")),
    ),
    max_size=60,
)


@given(steps)
def test_every_byte_counted_between_two_scrapes_is_one_delta(life: list[tuple]) -> None:  # type: ignore[type-arg]
    """The deltas add up to the bytes counted after the first scrape, less those counted after
    the last scrape before each restart (which no scrape saw): never more, never twice."""
    deltas: CounterDeltas[str] = CounterDeltas()
    counters: dict[str, int] = {}
    started, seen = 0.0, False
    pending = 0  # counted since the last scrape that reached the broker
    expected = published = 0.0
    for step in life:
        if step[0] == "count":
            counters[step[1]] = counters.get(step[1], 0) + step[2]
            pending += step[2]
        elif step[0] == "restart":
            counters, started, pending = {}, started + 1, 0
        elif step[0] == "scrape":
            published += sum(deltas.update(1, Scrape(started, dict(counters))).values())
            expected += pending if seen else 0
            seen, pending = True, 0
    assert published == expected
