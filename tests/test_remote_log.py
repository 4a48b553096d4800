"""Remote log sizes (KIP-852): sizes per epoch, idempotent lifecycle events, retention, encoding."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from state.leader_epochs import breach as kafka_breach
from state.remote_log import (
    _SCHEMA_1,
    CHANGE_COLUMNS,
    COPY_FINISHED,
    DELETE_FINISHED,
    EVENT_COLUMNS,
    LINEAGE,
    RemoteLogDecodeError,
    RemoteLogSizes,
)

T0 = 1_700_000_000_000
S = 8 * 1024 * 1024
Event = dict[str, Any]


def copy(
    segment_id: str,
    nbytes: int,
    epoch: int = 0,
    ts: int = T0,
    topic: str = "orders",
    partition: int = 0,
) -> Event:
    return {
        "ts": ts,
        "topic": topic,
        "partition": partition,
        "leader_epoch": epoch,
        "segment_id": segment_id,
        "bytes": nbytes,
        "state": COPY_FINISHED,
        "epochs": None,
        "end_offset": -1,
        "log_end_offset": -1,
    }


def delete(segment_id: str, nbytes: int, epoch: int = 0, ts: int = T0, **where: Any) -> Event:
    return {**copy(segment_id, nbytes, epoch, ts, **where), "state": DELETE_FINISHED}


def frame(events: Iterable[Event]) -> pd.DataFrame:
    return pd.DataFrame(list(events), columns=list(EVENT_COLUMNS))


def applied(*events: Event) -> RemoteLogSizes:
    sizes = RemoteLogSizes()
    sizes.apply(frame(events))
    return sizes


def changed(changes: pd.DataFrame) -> dict[tuple[str, int], tuple[int, int]]:
    assert tuple(changes.columns) == CHANGE_COLUMNS
    return {
        (str(topic), int(partition)): (int(total), int(count))
        for topic, partition, total, count in changes.itertuples(index=False)
    }


# ---------------------------------------------------------------------- sizes per epoch


def test_segments_of_one_epoch_add_up() -> None:
    sizes = applied(copy("a", S), copy("b", 2 * S), copy("c", 3 * S))
    assert sizes.size("orders", 0, 0) == 6 * S
    assert sizes.partition_total("orders", 0) == 6 * S
    assert sizes.epoch_sizes("orders", 0) == {0: 6 * S}
    assert len(sizes) == 3
    assert sizes.tombstones == 0


def test_segments_spread_over_epochs_are_sized_per_epoch() -> None:
    sizes = applied(copy("a", S, epoch=0), copy("b", 2 * S, epoch=1), copy("c", 3 * S, epoch=2))
    assert [sizes.size("orders", 0, epoch) for epoch in (0, 1, 2)] == [S, 2 * S, 3 * S]
    assert sizes.partition_total("orders", 0) == 6 * S
    assert sizes.epoch_sizes("orders", 0) == {0: S, 1: 2 * S, 2: 3 * S}


def test_unknown_epochs_and_partitions_are_empty() -> None:
    sizes = applied(copy("a", S, epoch=1))
    assert sizes.size("orders", 0, 0) == 0
    assert sizes.size("orders", 0, 7) == 0
    assert sizes.size("orders", 1, 1) == 0
    assert sizes.size("payments", 0, 1) == 0
    assert sizes.partition_total("orders", 1) == 0
    assert sizes.epoch_sizes("payments", 0) == {}
    assert sizes.live_segments("payments", 0).empty
    assert sizes.retention_breach("payments", 0, local_only_bytes=10, retention_bytes=0) == []


def test_an_epoch_whose_segments_are_all_deleted_is_unknown_again() -> None:
    sizes = applied(copy("a", S, epoch=0), copy("b", 2 * S, epoch=1), delete("a", S, epoch=0))
    assert sizes.epoch_sizes("orders", 0) == {1: 2 * S}
    assert sizes.size("orders", 0, 0) == 0
    assert (len(sizes), sizes.tombstones) == (1, 1)


def test_a_delete_subtracts_the_size_the_segment_was_copied_with() -> None:
    sizes = applied(copy("a", 3 * S), copy("b", S), delete("a", 999))
    assert sizes.partition_total("orders", 0) == S


def test_a_delete_before_its_copy_leaves_a_tombstone_that_ignores_the_copy() -> None:
    sizes = applied(delete("a", S, ts=T0 + 5), copy("b", 2 * S))
    assert (len(sizes), sizes.tombstones) == (1, 1)
    changes = sizes.apply(frame([copy("a", S, ts=T0)]))
    assert changes.empty
    assert sizes.partition_total("orders", 0) == 2 * S
    segments = sizes.segments().set_index("segment_id")
    assert segments["live"].to_dict() == {"a": False, "b": True}
    assert segments["copied_at"].isna().to_dict() == {"a": True, "b": False}  # a's never counted
    assert segments.at["a", "last_event_ts"] == T0 + 5
    # Within one batch, input order decides which event created the segment.
    delete_first = applied(delete("a", S, ts=T0 + 5), copy("a", S, ts=T0)).segments()
    copy_first = applied(copy("a", S, ts=T0), delete("a", S, ts=T0 + 5)).segments()
    assert delete_first["copied_at"].isna().tolist() == [True]
    assert copy_first["copied_at"].tolist() == [T0]


def test_apply_reports_the_partitions_whose_live_segments_changed() -> None:
    sizes = RemoteLogSizes()
    first = sizes.apply(
        frame(
            [
                copy("a", S, partition=1),
                copy("b", 2 * S, topic="payments", partition=0),
                copy("c", S, partition=0),
                delete("c", S, partition=0),  # copied and deleted in one batch: no net change
            ]
        )
    )
    assert changed(first) == {("orders", 1): (S, 1), ("payments", 0): (2 * S, 1)}
    # Duplicates change nothing, and a changed partition reports its size after the batch.
    second = sizes.apply(frame([copy("a", S, partition=1), delete("b", 2 * S, topic="payments")]))
    assert changed(second) == {("payments", 0): (0, 0)}
    assert sizes.apply(frame([copy("a", S, partition=1)])).empty
    assert sizes.apply(frame([])).empty


def test_live_segments_are_ordered_by_copy_time_then_segment_id() -> None:
    sizes = applied(
        copy("d", 4, epoch=2, ts=T0 + 30),
        copy("b", 2, epoch=0, ts=T0 + 10),
        copy("c", 3, epoch=1, ts=T0 + 10),  # same copy time as b: the id decides
        copy("a", 1, epoch=3, ts=T0 + 20),
        copy("z", 9, epoch=0, ts=T0, partition=2),
    )
    live = sizes.live_segments("orders", 0)
    assert live["segment_id"].tolist() == ["b", "c", "a", "d"]
    assert live["leader_epoch"].tolist() == [0, 1, 3, 2]
    assert live["bytes"].tolist() == [2, 3, 1, 4]
    assert live["copied_at"].tolist() == [T0 + 10, T0 + 10, T0 + 20, T0 + 30]


def test_invalid_events_are_refused() -> None:
    sizes = RemoteLogSizes()
    with pytest.raises(ValueError, match="unknown remote segment states"):
        sizes.apply(frame([{**copy("a", S), "state": "copy_started"}]))
    with pytest.raises(ValueError, match="lack columns"):
        sizes.apply(frame([copy("a", S)]).drop(columns="leader_epoch"))
    with pytest.raises(ValueError, match="bytes"):
        sizes.apply(frame([copy("a", -1)]))
    assert len(sizes) == 0


# ---------------------------------------------------------------------- duplicates, reordering

TOPIC_PARTITIONS = [("orders", 0), ("orders", 1), ("payments", 0)]
LIFECYCLES = ["copy", "copy+delete", "delete"]
_SEGMENT = st.tuples(
    st.sampled_from(TOPIC_PARTITIONS),
    st.integers(0, 3),  # leader epoch
    st.integers(0, 5 * S),  # size
    st.sampled_from(LIFECYCLES),
    st.integers(0, 50),  # copy time, ms after T0: ties happen
    st.integers(0, 50),  # delete delay after the copy
)


def _lifecycle_events(specs: Sequence[tuple[Any, ...]]) -> list[Event]:
    events = []
    for index, ((topic, partition), epoch, nbytes, lifecycle, copied, delay) in enumerate(specs):
        where = {"topic": topic, "partition": partition}
        segment_id = f"seg-{index}"
        if lifecycle != "delete":
            events.append(copy(segment_id, nbytes, epoch, T0 + copied, **where))
        if lifecycle != "copy":
            events.append(delete(segment_id, nbytes, epoch, T0 + copied + delay, **where))
    return events


def _key(event: Event) -> tuple[str, int, str]:
    return event["topic"], event["partition"], event["segment_id"]


def _model(seen: Sequence[Event]) -> dict[tuple[str, int], list[Event]]:
    """Live segments per partition: those whose copy arrived and whose delete never did."""
    deleted = {_key(e) for e in seen if e["state"] == DELETE_FINISHED}
    live = {_key(e): e for e in seen if e["state"] == COPY_FINISHED and _key(e) not in deleted}
    by_partition: dict[tuple[str, int], list[Event]] = {key: [] for key in TOPIC_PARTITIONS}
    for (topic, partition, _), event in live.items():
        by_partition[(topic, partition)].append(event)
    return by_partition


def _assert_sizes_match(sizes: RemoteLogSizes, seen: Sequence[Event]) -> None:
    model = _model(seen)
    assert len(sizes) == sum(map(len, model.values()))
    assert sizes.tombstones == len({_key(e) for e in seen if e["state"] == DELETE_FINISHED})
    for topic, partition in [*TOPIC_PARTITIONS, ("unknown", 0)]:
        mine = model.get((topic, partition), [])
        per_epoch: dict[int, int] = {}
        for event in mine:
            epoch = event["leader_epoch"]
            per_epoch[epoch] = per_epoch.get(epoch, 0) + event["bytes"]
        assert sizes.epoch_sizes(topic, partition) == dict(sorted(per_epoch.items()))
        for epoch in range(5):
            assert sizes.size(topic, partition, epoch) == per_epoch.get(epoch, 0)
        assert sizes.partition_total(topic, partition) == sum(e["bytes"] for e in mine)
        oldest_first = sorted(mine, key=lambda e: (e["ts"], e["segment_id"]))
        live = sizes.live_segments(topic, partition)
        assert live["segment_id"].tolist() == [e["segment_id"] for e in oldest_first]
        assert live["copied_at"].tolist() == [e["ts"] for e in oldest_first]


def _live_sets(seen: Sequence[Event]) -> dict[tuple[str, int], set[str]]:
    return {key: {e["segment_id"] for e in live} for key, live in _model(seen).items()}


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_duplicates_reordering_and_batching_do_not_change_sizes(data: st.DataObject) -> None:
    events = _lifecycle_events(data.draw(st.lists(_SEGMENT, max_size=30), label="segments"))
    repeats = data.draw(st.lists(st.integers(1, 3), min_size=len(events), max_size=len(events)))
    stream = data.draw(
        st.permutations([event for event, n in zip(events, repeats, strict=True) for _ in range(n)])
    )
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8), label="cuts"))
    bounds = list(zip([0, *cuts], [*cuts, len(stream)], strict=True))

    direct, restored = RemoteLogSizes(), RemoteLogSizes()
    for start, end in bounds:
        batch = frame(stream[start:end])
        before, after = _live_sets(stream[:start]), _live_sets(stream[:end])
        changes = direct.apply(batch)
        assert set(changed(changes)) == {key for key in before if before[key] != after[key]}
        pd.testing.assert_frame_equal(restored.apply(batch), changes)
        _assert_sizes_match(direct, stream[:end])
        # A restart at this batch boundary: the decoded state goes on exactly like the live one.
        restored = RemoteLogSizes.decode(restored.encode())
        pd.testing.assert_frame_equal(restored.segments(), direct.segments())
        _assert_sizes_match(restored, stream[:end])


# ---------------------------------------------------------------------- retention


def _kafka_walk(
    segment_ids: Sequence[str],
    sizes: Sequence[int],
    remote_total: int,
    local_only_bytes: int,
    retention_bytes: int,
) -> list[str]:
    """``RemoteLogManager``'s size-retention walk, one segment at a time."""
    total = local_only_bytes + remote_total
    if retention_bytes < 0 or total <= retention_bytes:
        return []
    remaining, deleted = total - retention_bytes, []
    for segment_id, size in zip(segment_ids, sizes, strict=True):
        if not (remaining > 0 and remaining - size >= 0):
            break
        remaining -= size
        deleted.append(segment_id)
    return deleted


# 50 segments oldest first: 100 bytes each, except the 11th (1000 bytes).
_IDS = [f"seg-{index:02d}" for index in range(50)]
_SIZES = [1000 if index == 10 else 100 for index in range(50)]
_TOTAL = sum(_SIZES)  # 5900


@pytest.fixture(scope="module")
def fifty_segments() -> RemoteLogSizes:
    """The 50 segments over 5 epochs, copied 1 s apart (30 and 31 at the same time), shuffled."""
    copied_at = [T0 + 1000 * (index - (index == 31)) for index in range(50)]
    events = [
        copy(segment_id, size, epoch=index // 10, ts=ts)
        for index, (segment_id, size, ts) in enumerate(zip(_IDS, _SIZES, copied_at, strict=True))
    ]
    order = np.random.default_rng(852).permutation(len(events))
    return applied(*[events[i] for i in order])


@pytest.mark.parametrize(
    ("local_only_bytes", "retention_bytes", "oldest"),
    [
        (0, -1, 0),  # retention.bytes disabled
        (0, 10_000, 0),
        (0, _TOTAL, 0),  # at the limit, not above it
        (0, _TOTAL - 50, 0),  # a breach smaller than the oldest segment
        (0, _TOTAL - 350, 3),
        (300, _TOTAL, 3),  # local-only bytes count toward the breach
        (0, _TOTAL - 1500, 10),  # the big 11th segment stops the walk: younger ones would fit
        (0, _TOTAL - 2000, 11),  # ... unless the breach covers it
        (0, _TOTAL - 2250, 13),
        (0, 0, 50),
        (1000, 0, 50),
    ],
)
def test_retention_deletes_the_oldest_segments_that_fit_in_the_breach(
    fifty_segments: RemoteLogSizes, local_only_bytes: int, retention_bytes: int, oldest: int
) -> None:
    assert fifty_segments.partition_total("orders", 0) == _TOTAL
    assert fifty_segments.live_segments("orders", 0)["segment_id"].tolist() == _IDS
    breach = fifty_segments.retention_breach("orders", 0, local_only_bytes, retention_bytes)
    assert breach == _IDS[:oldest]
    assert breach == _kafka_walk(_IDS, _SIZES, _TOTAL, local_only_bytes, retention_bytes)


def retention_breach(
    ids: Sequence[str], sizes: Sequence[int], remote: int, local_only: int, retention: int
) -> list[str]:
    """The walk over segments all within the lineage, oldest first."""
    walk = [(segment, size, True) for segment, size in zip(ids, sizes, strict=True)]
    return kafka_breach(walk, remote, local_only, retention)


def test_retention_stops_once_the_breach_is_covered_even_for_empty_segments() -> None:
    # Kafka deletes only while some breach remains: the empty segment after an exact fit stays.
    assert retention_breach(["a", "b", "c"], [10, 0, 5], 15, 0, 5) == ["a"]
    assert retention_breach(["a", "b", "c"], [0, 10, 5], 15, 0, 5) == ["a", "b"]
    assert retention_breach([], [], 0, 100, 10) == []


def test_retention_breach_refuses_negative_sizes() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        retention_breach(["a"], [-1], 1, 0, 0)


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 20), max_size=40),
    extra_remote=st.integers(0, 30),
    local_only_bytes=st.integers(0, 100),
    retention_bytes=st.integers(-1, 600),
)
def test_retention_breach_is_kafkas_walk(
    sizes: list[int], extra_remote: int, local_only_bytes: int, retention_bytes: int
) -> None:
    ids = [f"s{i}" for i in range(len(sizes))]
    remote_total = sum(sizes) + extra_remote  # e.g. segments outside the listed epochs
    assert retention_breach(
        ids, sizes, remote_total, local_only_bytes, retention_bytes
    ) == _kafka_walk(ids, sizes, remote_total, local_only_bytes, retention_bytes)


# ---------------------------------------------------------------------- tombstones


def test_evicting_tombstones_bounds_memory() -> None:
    sizes = RemoteLogSizes()
    max_past_ms = 60_000
    for minute in range(30):
        now = T0 + minute * 60_000
        churn = [copy(f"m{minute}-{i}", S, ts=now) for i in range(100)]
        churn += [delete(f"m{minute}-{i}", S, ts=now + 30_000) for i in range(100)]
        sizes.apply(frame([*churn, copy(f"keep-{minute}", S, ts=now, partition=1)]))
        sizes.evict_tombstones(now - max_past_ms)
        # This minute's and the previous minute's deletions are within the horizon.
        assert sizes.tombstones == 100 * min(minute + 1, 2)
    assert len(sizes) == 30
    assert len(sizes.segments()) == 230  # not the 3030 segments ever seen
    assert sizes.partition_total("orders", 1) == 30 * S
    assert sizes.partition_total("orders", 0) == 0


def test_eviction_keeps_live_segments_and_renumbered_partitions_working() -> None:
    sizes = applied(
        copy("a", S, ts=T0, topic="alpha"),
        copy("gone", S, ts=T0, topic="beta"),
        delete("gone", S, ts=T0 + 10, topic="beta"),
        copy("c", 3 * S, ts=T0, topic="gamma", epoch=2),
    )
    assert sizes.evict_tombstones(T0 + 11) == 1
    assert sizes.segments()["topic"].tolist() == ["alpha", "gamma"]  # beta is forgotten
    changes = sizes.apply(
        frame(
            [
                copy("c2", S, ts=T0 + 20, topic="gamma", epoch=2),
                delete("a", S, ts=T0 + 20, topic="alpha"),
                copy("b2", 2 * S, ts=T0 + 20, topic="beta"),
            ]
        )
    )
    assert changed(changes) == {
        ("alpha", 0): (0, 0),
        ("beta", 0): (2 * S, 1),
        ("gamma", 0): (4 * S, 2),
    }
    assert sizes.epoch_sizes("gamma", 0) == {2: 4 * S}
    assert sizes.evict_tombstones(T0) == 0  # every tombstone is newer than that


def test_a_copy_older_than_the_eviction_horizon_counts_again() -> None:
    """Why the horizon must be the event validator's ``max_past_ms``.

    A tombstone within the horizon ignores a late copy. Once forgotten, the same late copy makes
    the deleted segment live again; the engine is safe only because it rejects events older than
    the horizon (a copy is never later, in event time, than the delete of its segment).
    """
    sizes = applied(copy("a", S, ts=T0), delete("a", S, ts=T0 + 1000))
    assert sizes.evict_tombstones(T0 + 1000) == 0
    sizes.apply(frame([copy("a", S, ts=T0)]))
    assert sizes.partition_total("orders", 0) == 0

    assert sizes.evict_tombstones(T0 + 1001) == 1
    assert sizes.tombstones == 0
    sizes.apply(frame([copy("a", S, ts=T0)]))
    assert sizes.partition_total("orders", 0) == S  # counted again: the horizon was too short


# ---------------------------------------------------------------------- encoding


def test_encoding_round_trips_live_segments_and_tombstones() -> None:
    sizes = applied(
        copy("a", S, epoch=1, ts=T0 + 1),
        copy("b", 2 * S, epoch=2, ts=T0 + 2, topic="payments", partition=3),
        delete("c", 5, ts=T0 + 3),
        copy("d", 0, ts=T0 + 4),
        delete("d", 0, ts=T0 + 9),
    )
    restored = RemoteLogSizes.decode(sizes.encode())
    pd.testing.assert_frame_equal(restored.segments(), sizes.segments())
    assert (len(restored), restored.tombstones) == (2, 2)
    assert restored.epoch_sizes("orders", 0) == {1: S}
    assert restored.size("payments", 3, 2) == 2 * S
    assert restored.apply(frame([copy("c", 5, ts=T0)])).empty  # the tombstone still holds
    assert restored.encode() == sizes.encode()


def test_an_empty_state_round_trips() -> None:
    restored = RemoteLogSizes.decode(RemoteLogSizes().encode())
    assert (len(restored), restored.tombstones) == (0, 0)
    assert restored.segments().empty


def test_encoding_is_compact() -> None:
    rng = np.random.default_rng(10_000)
    count = 10_000
    # Kafka's segment ids are UUIDs, printed as 22 base64 characters.
    ids = [base64.urlsafe_b64encode(rng.bytes(16)).decode().rstrip("=") for _ in range(count)]
    events = pd.DataFrame(
        {
            "ts": T0 + np.sort(rng.integers(0, 86_400_000, count)),
            "topic": rng.choice([f"topic-{i}" for i in range(20)], count),
            "partition": rng.integers(0, 12, count),
            "leader_epoch": rng.integers(0, 5, count),
            "segment_id": ids,
            "bytes": rng.integers(1 << 20, 1 << 30, count),
            "state": np.where(rng.random(count) < 0.2, DELETE_FINISHED, COPY_FINISHED),
            "epochs": None,
            "end_offset": rng.integers(0, 1 << 40, count),
            "log_end_offset": -1,
        }
    )
    sizes = RemoteLogSizes()
    sizes.apply(events)
    assert len(sizes) + sizes.tombstones == count
    # ~40 bytes a segment: 22 of them the id, 8 its end offset
    assert len(sizes.encode()) < 48 * count


def _rewritten(data: bytes, change: Any) -> bytes:
    """``data`` with its table passed through ``change`` (the format tag kept unless replaced)."""
    table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    changed_table = change(table)
    if changed_table.schema.metadata is None:
        changed_table = changed_table.replace_schema_metadata(table.schema.metadata)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, changed_table.schema) as writer:
        writer.write_table(changed_table)
    return bytes(sink.getvalue().to_pybytes())


def _set_column(name: str, values: pa.Array) -> Any:
    def change(table: pa.Table) -> pa.Table:
        return table.set_column(table.schema.get_field_index(name), name, values)

    return change


def _good() -> bytes:
    return applied(copy("a", S), delete("b", S), copy("c", S, partition=1)).encode()


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda good: b"", id="empty"),
        pytest.param(lambda good: b"not arrow at all", id="garbage"),
        pytest.param(lambda good: good[: len(good) // 2], id="truncated"),
        pytest.param(
            lambda good: _rewritten(
                good, lambda t: t.replace_schema_metadata({b"format": b"other.1"})
            ),
            id="other-format",
        ),
        pytest.param(
            lambda good: _rewritten(good, lambda t: t.drop_columns(["live"])), id="missing-column"
        ),
        pytest.param(
            lambda good: _rewritten(good, lambda t: pa.concat_tables([t, t])), id="listed-twice"
        ),
        pytest.param(
            lambda good: _rewritten(good, _set_column("live", pa.array([True] * 3))),
            id="live-without-copy",
        ),
        pytest.param(
            lambda good: _rewritten(good, _set_column("bytes", pa.array([1, -1, 1], pa.int64()))),
            id="negative-size",
        ),
        pytest.param(
            lambda good: _rewritten(
                good, _set_column("segment_id", pa.array(["a", None, "c"], pa.string()))
            ),
            id="null-segment-id",
        ),
    ],
)
def test_corrupt_bytes_raise_a_decode_error(damage: Any) -> None:
    good = _good()
    RemoteLogSizes.decode(good)  # the damage, not the base, is what fails
    with pytest.raises(RemoteLogDecodeError):
        RemoteLogSizes.decode(damage(good))


def test_flipped_bytes_never_escape_as_another_error() -> None:
    good = applied(*(copy(f"s{i}", i * S, epoch=i % 3, ts=T0 + i) for i in range(40))).encode()
    for position in range(0, len(good), 7):
        damaged = bytearray(good)
        damaged[position] ^= 0xFF
        with contextlib.suppress(RemoteLogDecodeError):
            RemoteLogSizes.decode(bytes(damaged))


# ---------------------------------------------------------------------- lineage (KIP-852)


def lineage_report(
    epochs: dict[int, int], log_end_offset: int, ts: int = T0, partition: int = 0
) -> Event:
    return {
        **copy("", 0, ts=ts, partition=partition),
        "segment_id": None,
        "state": LINEAGE,
        "epochs": tuple(sorted(epochs.items())),
        "log_end_offset": log_end_offset,
    }


def spanning(segment_id: str, nbytes: int, epochs: dict[int, int], end: int) -> Event:
    return {
        **copy(segment_id, nbytes, max(epochs)),
        "epochs": tuple(sorted(epochs.items())),
        "end_offset": end,
    }


def test_the_newest_lineage_report_wins_in_any_order() -> None:
    old = lineage_report({0: 0, 1: 100}, 300, ts=T0)
    new = lineage_report({0: 0, 2: 100}, 250, ts=T0 + 1)
    for order in ([old, new], [new, old]):
        sizes = applied(spanning("a", 10, {0: 0, 1: 100}, 120), *order)
        assert sizes.lineage("orders", 0) == (250, ((0, 0), (2, 100)))
        # Under the new lineage, a's epoch 1 is not in it: nothing to retain.
        assert sizes.retention("orders", 0).size == 0
    sizes = applied(spanning("a", 10, {0: 0, 1: 100}, 120))
    assert changed(sizes.apply(frame([old]))) == {("orders", 0): (10, 1)}
    assert changed(sizes.apply(frame([old]))) == {}  # the same report again changes nothing


def test_encoding_keeps_segment_epochs_end_offsets_and_lineages() -> None:
    sizes = applied(
        spanning("a", 10, {0: 0, 1: 100}, 120),
        lineage_report({0: 0, 1: 100}, 300),
        lineage_report({3: 7}, 9, partition=5),  # a lineage without segments is kept too
    )
    restored = RemoteLogSizes.decode(sizes.encode())
    assert restored.epoch_sizes("orders", 0) == {0: 10, 1: 10}
    assert restored.live_segments("orders", 0)["end_offset"].tolist() == [120]
    assert restored.lineage("orders", 0) == (300, ((0, 0), (1, 100)))
    assert restored.lineage("orders", 5) == (9, ((3, 7),))
    assert restored.retention("orders", 0) == sizes.retention("orders", 0)
    assert restored.encode() == sizes.encode()
    # Evicting tombstones keeps partitions that only have a lineage.
    restored.apply(frame([delete("a", 10, 1)]))
    restored.evict_tombstones(T0 + 1)
    assert restored.lineage("orders", 5) == (9, ((3, 7),))


def test_format_1_state_reads_each_segment_as_its_one_epoch() -> None:
    """State kept before segment epochs existed: one epoch from offset 0, end offset unknown."""
    table = pa.table(
        {
            "topic": pa.array(["orders", "orders"]).dictionary_encode(),
            "partition": pa.array([0, 0], pa.int32()),
            "segment_id": ["a", "b"],
            "leader_epoch": pa.array([0, 1], pa.int32()),
            "bytes": pa.array([10, 20], pa.int64()),
            "copied_at": pa.array([T0, T0], pa.int64()),
            "last_event_ts": pa.array([T0, T0], pa.int64()),
            "live": [True, True],
        }
    ).cast(_SCHEMA_1)
    sink = pa.BufferOutputStream()
    schema = table.schema.with_metadata({b"format": b"quotastream.remote_log.1"})
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_table(table.replace_schema_metadata(schema.metadata))
    sizes = RemoteLogSizes.decode(sink.getvalue().to_pybytes())
    assert sizes.epoch_sizes("orders", 0) == {0: 10, 1: 20}
    assert sizes.live_segments("orders", 0)["epochs"].tolist() == [((0, 0),), ((1, 0),)]
    assert sizes.retention_breach("orders", 0, 0, 15) == ["a"]
