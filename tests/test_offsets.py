"""Offset planning and option parsing for the Kafka source (no broker needed)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streaming.offsets import (
    OffsetRange,
    SourceOptionError,
    SourceOptions,
    from_json,
    limit_end,
    plan_ranges,
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
