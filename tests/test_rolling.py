"""The columnar rolling table against Kafka's examples and a one-event-at-a-time model."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from state.encoding import StateDecodeError, StoredTables, decode_tables, encode_tables
from state.quota_types import WindowRule
from state.rolling import Measurement, RollingTable
from state.window import Window, WindowSpec, spread_over, window_at
from tests.support.oracle import KafkaRate, Measured, OracleWindow

BASE = 1_700_000_000_000  # epoch ms, a multiple of 1000
KAFKA = WindowSpec(samples=11, window_ms=1000, rule=WindowRule.RATE)


@dataclass(frozen=True)
class Event:
    entity: int
    ts: int
    nbytes: int


def record(table: RollingTable, events: list[Event]) -> Measurement:
    keys = np.array([f"e{i}" for i in range(max((e.entity for e in events), default=0) + 1)])
    return table.record_and_measure(
        keys.astype(object),
        np.array([e.entity for e in events], dtype=np.int64),
        np.array([e.ts for e in events], dtype=np.int64),
        np.array([e.nbytes for e in events], dtype=np.int64),
    )


def rows(measurement: Measurement) -> list[Measured]:
    return list(
        zip(
            measurement.clock_ms.tolist(),
            measurement.window_bytes.tolist(),
            measurement.window_size_ms.tolist(),
            measurement.recorded.tolist(),
            strict=True,
        )
    )


def oracle_rows(spec: WindowSpec, events: list[Event]) -> list[Measured]:
    """The engine's event-time model, one event at a time."""
    windows: dict[int, OracleWindow] = {}
    result = []
    for event in events:
        window = windows.setdefault(
            event.entity, OracleWindow(spec.samples, spec.window_ms, spec.rule)
        )
        result.append(window.record_and_measure(event.ts, event.nbytes))
    return result


def kafka_rows(spec: WindowSpec, events: list[Event], *, aligned: bool) -> list[Measured]:
    """Kafka's own SampledStat / Rate / SimpleRate, one record at a time (in time order)."""
    rates: dict[int, KafkaRate] = {}
    result = []
    for event in events:
        rate = rates.setdefault(
            event.entity, KafkaRate(spec.samples, spec.window_ms, spec.rule, aligned=aligned)
        )
        result.append(rate.record_and_measure(event.ts, event.nbytes))
    return result


def table_state(table: RollingTable) -> dict[str, tuple[int | None, dict[int, tuple[int, int]]]]:
    return {key: (table.clock_of(key), table.retained(key)) for key in table.keys}


# ---------------------------------------------------------------------------- Kafka's examples
def test_reference_example_throttles_2100_ms() -> None:
    """Reference §2: 400 B at t = 0..9 s, then 2300 B at 10.5 s against 500 B/s."""
    table = RollingTable(KAFKA)
    events = [Event(0, BASE + i * 1000, 400) for i in range(10)]
    events.append(Event(0, BASE + 10_500, 2300))
    measured = record(table, events)
    assert measured.rate[:10].tolist() == [40.0 * (i + 1) for i in range(10)]
    assert measured.window_bytes[-1] == 6300
    assert measured.window_size_ms[-1] == 10_500
    assert measured.rate[-1] == pytest.approx(600.0)


def test_admit_is_shown_only_the_keys_the_table_does_not_hold_and_may_refuse_them() -> None:
    table = RollingTable(KAFKA)
    record(table, [Event(0, BASE, 100)])
    shown: list[list[str]] = []

    def admit(keys: np.ndarray) -> None:
        shown.append(keys.tolist())
        if "e2" in shown[-1]:
            raise ValueError("e2 is not admitted")

    def events_of(*entities: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        count = len(entities)
        return (
            np.array([f"e{entity}" for entity in entities], dtype=object),
            np.arange(count, dtype=np.int64),
            np.full(count, BASE + 500, dtype=np.int64),
            np.full(count, 10, dtype=np.int64),
        )

    table.record_and_measure(*events_of(0), admit=admit)
    assert shown == []  # held already: nothing to show
    table.record_and_measure(*events_of(0, 1), admit=admit)
    assert shown == [["e1"]]
    with pytest.raises(ValueError, match="e2 is not admitted"):
        table.record_and_measure(*events_of(1, 2), admit=admit)
    assert shown[-1] == ["e2"]
    assert table.keys.tolist() == ["e0", "e1"]  # the refused batch added nothing
    assert table.retained("e0") == {BASE // 1000: (120, BASE + 500)}


def test_rate_pads_a_fresh_entity_but_simple_rate_does_not() -> None:
    """A fresh entity: Rate divides by (samples - 1) windows, SimpleRate by one window."""
    event = [Event(0, BASE + 200, 5000)]
    rate = record(RollingTable(KAFKA), event)
    simple = record(RollingTable(WindowSpec(11, 1000, WindowRule.SIMPLE_RATE)), event)
    assert rate.window_size_ms.tolist() == [10_200]
    assert simple.window_size_ms.tolist() == [1000]
    assert simple.rate[0] == pytest.approx(5000.0)
    assert rate.rate[0] == pytest.approx(5000 / 10.2)


def test_simple_rate_grows_with_the_oldest_retained_sample() -> None:
    spec = WindowSpec(11, 1000, WindowRule.SIMPLE_RATE)
    measured = record(RollingTable(spec), [Event(0, BASE, 100), Event(0, BASE + 3_500, 100)])
    assert measured.window_size_ms.tolist() == [1000, 3_500]


def test_samples_leave_the_window_after_samples_times_window() -> None:
    table = RollingTable(KAFKA)
    measured = record(table, [Event(0, BASE, 1000), Event(0, BASE + 10_999, 0)])
    assert measured.window_bytes.tolist() == [1000, 1000]
    measured = record(table, [Event(0, BASE + 11_000, 0)])
    assert measured.window_bytes.tolist() == [0]
    # Zero-byte events measure without adding, but they do open their samples; the purged one
    # is kept while a late event could still land in it.
    first = BASE // 1000
    assert table.retained("e0") == {
        first: (1000, BASE),
        first + 10: (0, BASE + 10_999),
        first + 11: (0, BASE + 11_000),
    }
    record(table, [Event(0, BASE + 12_000, 0)])
    assert first not in table.retained("e0")


def test_a_sample_overlapping_the_window_counts_until_its_last_event_is_old() -> None:
    """Kafka 3.8+ (SampledStat keeps samples + 1): the sample before the window counts, whole,
    while its last event is less than samples x window old; Rate then measures one more window."""
    table = RollingTable(KAFKA)
    measured = record(
        table,
        [
            Event(0, BASE, 1000),
            Event(0, BASE + 700, 500),
            Event(0, BASE + 11_000, 0),
            Event(0, BASE + 11_700, 0),
        ],
    )
    assert measured.window_bytes.tolist() == [1000, 1500, 1500, 0]
    assert measured.window_size_ms.tolist() == [10_000, 10_700, 11_000, 10_700]


def test_an_event_older_than_the_window_is_measured_but_not_recorded() -> None:
    table = RollingTable(KAFKA)
    measured = record(table, [Event(0, BASE + 20_000, 10), Event(0, BASE, 999)])
    assert measured.recorded.tolist() == [True, False]
    assert measured.clock_ms.tolist() == [BASE + 20_000, BASE + 20_000]
    assert measured.window_bytes.tolist() == [10, 10]


def test_late_event_inside_the_window_counts() -> None:
    table = RollingTable(KAFKA)
    measured = record(table, [Event(0, BASE + 5_000, 10), Event(0, BASE + 1_000, 20)])
    assert measured.recorded.tolist() == [True, True]
    assert measured.window_bytes.tolist() == [10, 30]
    assert table.retained("e0") == {
        BASE // 1000 + 5: (10, BASE + 5_000),
        BASE // 1000 + 1: (20, BASE + 1_000),
    }


def test_entities_are_independent() -> None:
    table = RollingTable(KAFKA)
    measured = record(table, [Event(0, BASE, 10), Event(1, BASE, 20), Event(0, BASE, 5)])
    assert measured.window_bytes.tolist() == [10, 20, 15]


def test_evict_idle_drops_only_entities_with_empty_windows() -> None:
    table = RollingTable(KAFKA)
    record(table, [Event(0, BASE, 10), Event(1, BASE + 5_000, 20)])
    assert table.evict_idle(BASE + 10_999) == 0
    assert table.evict_idle(BASE + 11_000) == 1
    assert list(table.keys) == ["e1"]
    # A fresh start for an evicted entity equals what purging would have left.
    measured = record(table, [Event(0, BASE + 11_000, 7)])
    assert measured.window_bytes.tolist() == [7]


def test_very_wide_batches_are_split_and_stay_exact() -> None:
    """Events centuries apart would overflow the composite keys; the batch is split instead."""
    spec = WindowSpec(3, 1, WindowRule.SIMPLE_RATE)
    far = 2**61
    events = [Event(0, 0, 1), Event(1, far, 2), Event(0, far, 3), Event(1, 5, 4), Event(2, 9, 1)]
    assert rows(record(RollingTable(spec), events)) == oracle_rows(spec, events)


def test_mismatched_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="same length"):
        RollingTable(KAFKA).record_and_measure(
            np.array(["a"], dtype=object),
            np.zeros(2, dtype=np.int64),
            np.zeros(1, dtype=np.int64),
            np.zeros(1, dtype=np.int64),
        )


# ---------------------------------------------------------------------------- properties
specs = st.builds(
    WindowSpec,
    samples=st.integers(1, 12),
    window_ms=st.sampled_from([1, 7, 1000]),
    rule=st.sampled_from(list(WindowRule)),
)


@st.composite
def event_streams(draw: st.DrawFn, max_events: int = 80) -> tuple[WindowSpec, list[Event]]:
    spec = draw(specs)
    horizon = draw(st.sampled_from([3, 30, 400])) * spec.window_ms
    events = draw(
        st.lists(
            st.builds(
                Event,
                entity=st.integers(0, 5),
                ts=st.integers(BASE, BASE + horizon),
                nbytes=st.integers(0, 10**9),
            ),
            min_size=1,
            max_size=max_events,
        )
    )
    return spec, events


def split(events: list[Event], cuts: list[int]) -> list[list[Event]]:
    bounds = [0, *sorted(set(cuts)), len(events)]
    return [events[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def measured_in_batches(spec: WindowSpec, events: list[Event], cuts: list[int]) -> list[Measured]:
    """Every event's measurement, the events recorded in the batches ``cuts`` makes."""
    table = RollingTable(spec)
    measured = []
    for batch in split(events, [c for c in cuts if c < len(events)]):
        measured += rows(record(table, batch))
    return measured


@settings(max_examples=400, deadline=None)
@given(stream=event_streams(), cuts=st.lists(st.integers(0, 80), max_size=8))
def test_any_batch_split_matches_the_event_at_a_time_model(
    stream: tuple[WindowSpec, list[Event]], cuts: list[int]
) -> None:
    spec, events = stream
    assert measured_in_batches(spec, events, cuts) == oracle_rows(spec, events)


@settings(max_examples=400, deadline=None)
@given(stream=event_streams(), cuts=st.lists(st.integers(0, 80), max_size=8))
def test_time_ordered_traffic_measures_as_kafka_with_aligned_samples(
    stream: tuple[WindowSpec, list[Event]], cuts: list[int]
) -> None:
    """Records anywhere in their samples, in time order as a broker records them: Kafka's own
    classes, with each sample starting at its aligned start, give the same numbers."""
    spec, events = stream
    events = sorted(events, key=lambda e: e.ts)
    assert measured_in_batches(spec, events, cuts) == kafka_rows(spec, events, aligned=True)


@settings(max_examples=300, deadline=None)
@given(stream=event_streams(), cuts=st.lists(st.integers(0, 80), max_size=8))
def test_records_at_sample_starts_measure_exactly_as_kafka(
    stream: tuple[WindowSpec, list[Event]], cuts: list[int]
) -> None:
    """Where the record that opens each sample is at its aligned start (the others anywhere in
    it), aligned sampling is Kafka's own."""
    spec, events = stream
    window = spec.window_ms
    opened: set[tuple[int, int]] = set()
    aligned = []
    for event in sorted(events, key=lambda e: e.ts):
        sample = (event.entity, event.ts // window)
        ts = event.ts if sample in opened else event.ts - event.ts % window
        opened.add(sample)
        aligned.append(Event(event.entity, ts, event.nbytes))
    assert measured_in_batches(spec, aligned, cuts) == kafka_rows(spec, aligned, aligned=False)


@settings(max_examples=300, deadline=None)
@given(stream=event_streams(), seed=st.integers(0, 2**32 - 1))
def test_order_inside_a_sample_does_not_change_state_or_final_decision(
    stream: tuple[WindowSpec, list[Event]], seed: int
) -> None:
    spec, events = stream
    in_order = sorted(events, key=lambda e: e.ts // spec.window_ms)
    shuffled = sorted(
        random.Random(seed).sample(in_order, len(in_order)), key=lambda e: e.ts // spec.window_ms
    )
    first, second = RollingTable(spec), RollingTable(spec)
    a, b = record(first, in_order), record(second, shuffled)
    assert table_state(first) == table_state(second)
    last_a = {e.entity: row for e, row in zip(in_order, rows(a), strict=True)}
    last_b = {e.entity: row for e, row in zip(shuffled, rows(b), strict=True)}
    assert last_a == last_b


@settings(max_examples=200, deadline=None)
@given(stream=event_streams())
def test_rates_are_never_negative_and_windows_never_empty(
    stream: tuple[WindowSpec, list[Event]],
) -> None:
    spec, events = stream
    measured = record(RollingTable(spec), events)
    assert (measured.rate >= 0).all()
    assert (measured.window_size_ms >= 1).all()


@settings(max_examples=200, deadline=None)
@given(
    streams=st.lists(event_streams(), min_size=1, max_size=3),
    cut=st.integers(0, 80),
    compression=st.sampled_from(["zstd", None]),
)
def test_encode_decode_round_trips_and_resumes_identically(
    streams: list[tuple[WindowSpec, list[Event]]], cut: int, compression: str | None
) -> None:
    """Several tables (one per quota type in a shard) in one blob, some of them empty."""
    kept: dict[str, RollingTable] = {}
    tails: dict[str, list[Event]] = {}
    for index, (spec, events) in enumerate(streams):
        name = f"quota{index}"
        kept[name] = RollingTable(spec)
        head = events[: cut % len(events)]
        tails[name] = events[cut % len(events) :]
        if head:
            record(kept[name], head)
    restored = decode_tables(encode_tables(kept, compression=compression))  # type: ignore[arg-type]
    assert list(restored) == list(kept)
    for name, table in kept.items():
        assert restored[name].spec == table.spec
        assert table_state(restored[name]) == table_state(table)
        assert rows(record(restored[name], tails[name])) == rows(record(table, tails[name]))
    assert encode_tables(restored) == encode_tables(kept)


def test_encoding_no_tables_and_empty_tables() -> None:
    assert decode_tables(encode_tables({})) == {}
    empty = decode_tables(encode_tables({"produce": RollingTable(KAFKA)}))
    assert len(empty["produce"]) == 0
    assert empty["produce"].spec == KAFKA


def test_decode_refuses_foreign_bytes() -> None:
    with pytest.raises(StateDecodeError):
        decode_tables(b"definitely not arrow")


@settings(max_examples=300, deadline=None)
@given(stream=event_streams(), seed=st.integers(0, 2**32 - 1))
def test_final_state_and_decision_do_not_depend_on_event_order(
    stream: tuple[WindowSpec, list[Event]], seed: int
) -> None:
    """What pre-aggregating a micro-batch per (entity, sample) relies on: after all events, the
    windows and each entity's decision at its clock are the same in any arrival order."""
    spec, events = stream
    shuffled = random.Random(seed).sample(events, len(events))
    first, second = RollingTable(spec), RollingTable(spec)
    record(first, events)
    record(second, shuffled)
    assert table_state(first) == table_state(second)
    probe = [
        Event(e, max(x.ts for x in events if x.entity == e), 0) for e in {x.entity for x in events}
    ]
    assert rows(record(first, probe)) == rows(record(second, probe))


def keyed_table(keys: list[str]) -> RollingTable:
    """One event per key, a sample apart."""
    table = RollingTable(KAFKA)
    count = np.arange(len(keys), dtype=np.int64)
    table.record_and_measure(np.array(keys, dtype=object), count, 1_000 * count, count)
    return table


@settings(max_examples=100, deadline=None)
@given(
    keys=st.lists(st.text(min_size=0, max_size=6), min_size=1, max_size=30, unique=True),
    wanted=st.lists(st.text(min_size=0, max_size=6), max_size=10),
)
def test_stored_rows_are_found_by_key(keys: list[str], wanted: list[str]) -> None:
    table = keyed_table(keys)
    stored = StoredTables.decode(encode_tables({"produce": table}))
    asked = np.array(list(dict.fromkeys(wanted + keys[::2])), dtype=object)
    rows = stored.rows_of("produce", asked)
    found = stored.table("produce", rows[rows >= 0])
    assert list(found.keys) == [key for key, row in zip(asked, rows, strict=True) if row >= 0]
    assert set(found.keys) == set(keys) & set(asked)
    for key in found.keys:
        assert table_state(found)[key] == table_state(table)[key]


@settings(max_examples=400, deadline=None)
@given(stream=event_streams())
def test_an_entitys_kept_samples_measure_its_window_as_the_table_does(
    stream: tuple[WindowSpec, list[Event]],
) -> None:
    """``window_at``, one entity's window from its samples (what an enforcement point measures
    its own count by), is the table's measurement at the entity's last event."""
    spec, events = stream
    table = RollingTable(spec)
    measured = record(table, events)
    last = {e.entity: i for i, e in enumerate(events)}
    for entity, i in last.items():
        clock = int(measured.clock_ms[i])
        window = window_at(table.retained(f"e{entity}"), clock, spec)
        assert (window.nbytes, window.size_ms) == (
            measured.window_bytes[i],
            measured.window_size_ms[i],
        )


def test_a_window_forgets_a_sample_as_it_slides_past_it() -> None:
    """An entity's window later than its last event: a burst leaves it whole once its sample is
    older than the window and the overlapping sample's last event is old enough."""
    samples = {BASE // 1000: (5_000, BASE + 400), BASE // 1000 + 3: (100, BASE + 3_000)}
    assert window_at(samples, BASE + 10_999, KAFKA) == Window(5_100, 10_999)
    # BASE's sample overlaps the window from BASE + 11 s until its last event is 11 s old.
    assert window_at(samples, BASE + 11_399, KAFKA) == Window(5_100, 11_399)
    assert window_at(samples, BASE + 11_400, KAFKA) == Window(100, 10_400)
    # A sample not begun at the clock is not counted.
    assert window_at(samples, BASE + 2_000, KAFKA) == Window(5_000, 10_000)


@settings(max_examples=300, deadline=None)
@given(
    spec=st.builds(
        WindowSpec,
        samples=st.integers(1, 12),
        window_ms=st.sampled_from([1, 7, 1000]),
        rule=st.just(WindowRule.RATE),
    ),
    clock=st.integers(BASE, BASE + 50_000),
    nbytes=st.integers(1, 10**9),
    kept=st.dictionaries(st.integers(0, 5), st.integers(0, 10**6), max_size=4),
)
def test_bytes_spread_over_a_window_are_all_in_it_and_leave_it_as_it_slides(
    spec: WindowSpec, clock: int, nbytes: int, kept: dict[int, int]
) -> None:
    """``spread_over`` a client quota's window measured at ``clock`` (its ``size_ms`` up to the
    clock): every byte counted there, over the same window; none once it has slid past."""
    width = spec.window_ms
    samples = {
        clock // width - back: (n, (clock // width - back) * width) for back, n in kept.items()
    }
    before = window_at(samples, clock, spec)
    start = clock + 1 - before.size_ms
    spread = spread_over(samples, nbytes, start, clock + 1, width)
    assert sum(n for n, _ in spread.values()) == pytest.approx(
        nbytes + sum(n for n, _ in samples.values())
    )
    after = window_at(spread, clock, spec)
    assert after.nbytes == pytest.approx(before.nbytes + nbytes)
    assert after.size_ms == before.size_ms
    gone = window_at(spread, clock + spec.span_ms, spec)
    assert gone.nbytes == 0
