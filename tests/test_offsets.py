"""Offset planning and option parsing for the Kafka source (no broker needed)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streaming.engine.offsets import (
    OffsetRange,
    SourceOptionError,
    SourceOptions,
    from_json,
    group_ranges,
    limit_end,
    plan_ranges,
    records_read,
    to_json,
)


def test_offsets_round_trip_through_the_checkpoint_form() -> None:
    offsets = {("events", 1): 7, ("events", 0): 3, ("other", 2): 0}
    assert to_json(offsets) == {"events": {"0": 3, "1": 7}, "other": {"2": 0}}
    assert from_json(to_json(offsets)) == offsets


def test_plan_ranges_skips_partitions_without_new_offsets() -> None:
    start = {("t", 0): 5, ("t", 1): 9}
    end = {("t", 0): 8, ("t", 1): 9, ("t", 2): 4}  # partition 2 is new: read from 0
    assert plan_ranges(start, end) == [OffsetRange("t", 0, 5, 8), OffsetRange("t", 2, 0, 4)]


backlogs = st.dictionaries(
    st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 5)),
    st.tuples(st.integers(0, 1000), st.integers(0, 5000)),
    min_size=1,
)


@given(backlogs=backlogs, limit=st.integers(1, 3000))
def test_limit_end_reads_at_most_about_the_limit_and_never_starves(
    backlogs: dict[tuple[str, int], tuple[int, int]], limit: int
) -> None:
    start = {tp: begin for tp, (begin, _) in backlogs.items()}
    available = {tp: begin + extra for tp, (begin, extra) in backlogs.items()}
    end = limit_end(start, available, limit)
    for tp, until in available.items():
        assert start[tp] <= end[tp] <= until
        if until > start[tp]:
            assert end[tp] > start[tp]  # every partition with a backlog advances
    read = sum(end[tp] - start[tp] for tp in available)
    partitions_behind = sum(1 for tp in available if available[tp] > start[tp])
    assert read <= max(limit, 0) + partitions_behind  # rounding up gives each at most one more


def test_no_limit_reads_everything() -> None:
    assert limit_end({("t", 0): 1}, {("t", 0): 100}, None) == {("t", 0): 100}


def test_options_parse_with_defaults_and_pass_client_settings() -> None:
    options = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": "127.0.0.1:9092",
            "subscribe": "events, more",
            "startingOffsets": '{"events": {"0": 5}}',
            "maxOffsetsPerTrigger": "1000",
            "failOnDataLoss": "false",
            "maxOutageSeconds": "2.5",
            "statusFile": "/run/qs/kafka-source.json",
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.plain.password": "hunter2",
            "kafka.request.timeout.ms": "5000",
        }
    )
    assert options.topics == ("events", "more")
    assert options.starting_offsets == {("events", 0): 5}
    assert (options.max_offsets_per_trigger, options.fail_on_data_loss) == (1000, False)
    assert (options.max_outage_s, options.status_file) == (2.5, "/run/qs/kafka-source.json")
    assert options.client == {
        "security_protocol": "SASL_SSL",
        "sasl_plain_password": "hunter2",
        "request_timeout_ms": 5000,
    }
    assert "hunter2" not in repr(options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "t"}, "option 'kafka.bootstrap.servers' is required"),
        ({"kafka.bootstrap.servers": "x"}, "option 'subscribe' is required"),
        (
            {"kafka.bootstrap.servers": "x", "subscribe": "t", "startingOffsets": "soon"},
            "must be earliest, latest or JSON",
        ),
        (
            {"kafka.bootstrap.servers": "x", "subscribe": "t", "maxOffsetsPerTrigger": "0"},
            "'maxOffsetsPerTrigger' must be >= 1",
        ),
        (
            {"kafka.bootstrap.servers": "x", "subscribe": "t", "maxOffsetsPerTrigger": "1.5"},
            "'maxOffsetsPerTrigger' must be a whole number, got '1.5'",
        ),
        *(
            (
                {"kafka.bootstrap.servers": "x", "subscribe": "t", "maxOutageSeconds": bad},
                f"'maxOutageSeconds' must be {what}, got '{bad}'",
            )
            for bad, what in [
                ("0", "> 0"),
                ("-3", "> 0"),
                ("inf", "> 0"),
                ("nan", "> 0"),
                ("soon", "a number"),
            ]
        ),
        (
            {"kafka.bootstrap.servers": "x", "subscribe": "t", "failOnDataLoss": "maybe"},
            "'failOnDataLoss' must be true or false",
        ),
        (
            {"kafka.bootstrap.servers": "x", "subscribe": "t", "kafka.sasl.jaas.config": "..."},
            "'kafka.sasl.jaas.config' is not a kafka-python consumer setting",
        ),
    ],
)
def test_bad_options_are_named(options: dict[str, str], message: str) -> None:
    with pytest.raises(SourceOptionError, match=message):
        SourceOptions.parse(options)


@given(
    sizes=st.lists(st.integers(1, 50_000), max_size=12),
    tasks=st.integers(1, 8),
    min_records=st.integers(1, 10_000),
)
def test_group_ranges_reads_every_range_once_in_few_enough_balanced_tasks(
    sizes: list[int], tasks: int, min_records: int
) -> None:
    ranges = [OffsetRange("t", p, 100, 100 + size) for p, size in enumerate(sizes)]
    groups = group_ranges(ranges, tasks, min_records)
    flat = [r for group in groups for r in group]
    assert sorted(flat, key=lambda r: r.partition) == ranges  # each range once
    assert all(groups)
    total = sum(sizes)
    assert len(groups) <= max(1, min(tasks, total // min_records))
    if ranges:
        loads = [sum(r.size for r in group) for group in groups]
        # Greedy largest-first: no task exceeds the ideal share by more than the largest range.
        assert max(loads) <= total / len(groups) + max(sizes)
        assert len(groups) == max(1, min(len(ranges), tasks, total // min_records))


def test_a_tiny_batch_is_one_read_task_and_a_large_one_fills_the_cores() -> None:
    tiny = [OffsetRange("t", p, 0, 1) for p in range(4)]
    assert len(group_ranges(tiny, tasks=2, min_records=2_000)) == 1
    large = [OffsetRange("t", p, 0, 100_000) for p in range(4)]
    assert [len(group) for group in group_ranges(large, tasks=2, min_records=2_000)] == [2, 2]


def test_records_read_counts_the_event_topics_from_progress_offsets() -> None:
    start = '{"events": {"0": 10, "1": 50}, "config": {"0": 4}}'
    end = {"events": {"0": 25, "1": 3, "2": 7}, "config": {"0": 9}}
    # Partition 1 restarted below the start: its 3 records count; partition 2 is new.
    assert records_read(start, end, ["events"]) == 15 + 3 + 7
    assert records_read(start, end) == 15 + 3 + 7 + 5
    assert records_read("{not json", end, ["events"]) == 25 + 3 + 7
    assert records_read(start, "12", ["events"]) == 0
