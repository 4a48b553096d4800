"""The one validator: every payload is either accepted or rejected with a reason."""

from __future__ import annotations

import base64
import json
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from state.event_contract import RejectReason
from state.events import EVENT_COLUMNS, EventBounds, parse_events
from tests.support.factories import BASE, fetch, produce, remote, remote_segment, replication
from tests.support.replay import ReplayRunner

SEGMENT = {
    "kind": "remote_segment",
    "broker": 1,
    "topic": "t",
    "partition": 3,
    "leader_epoch": 2,
    "segment_id": "AAAA-1",
    "state": "copy_finished",
    "bytes": 1024,
    "ts": BASE,
}

VALID: list[dict[str, Any]] = [
    produce("alice", "app1", 10, BASE),
    fetch("alice", "", 0, BASE),  # empty client-id and zero bytes are legal
    remote("remote_copy", 1, 100, BASE),
    {**remote("remote_fetch", 1, 100, BASE), "client_id": "c"},
    replication(1, "leader", "orders", 0, 2, True, 5, BASE),
    SEGMENT,
    {**produce("alice", "app1", 10_000, BASE), "count": 42},  # a per-second summary
    {**produce("alice", "app1", 1, BASE), "extra": {"nested": [1, 2]}},  # unknown fields ignored
]


def encode(event: dict[str, Any]) -> bytes:
    return json.dumps(event).encode()


def test_valid_events_of_every_kind_are_accepted_with_their_values() -> None:
    parsed = parse_events([encode(e) for e in VALID])
    assert parsed.rejected.empty
    accepted = parsed.accepted
    assert list(accepted.columns) == list(EVENT_COLUMNS)
    assert accepted["position"].tolist() == list(range(len(VALID)))
    assert accepted["kind"].tolist() == [e["kind"] for e in VALID]
    assert accepted["bytes"].tolist() == [e["bytes"] for e in VALID]
    assert accepted["count"].tolist() == [1, 1, 1, 1, 1, 1, 42, 1]
    assert accepted["broker"].tolist() == [1] * 8
    assert accepted["partition"].tolist() == [-1, -1, 0, 0, 0, 3, -1, -1]
    assert accepted["in_sync"].tolist() == [False, False, False, False, True, False, False, False]
    assert accepted["client_id"].tolist() == ["app1", "", None, "c", None, None, "app1", "app1"]
    assert accepted["leader_epoch"].tolist()[5] == 2
    assert accepted["ts"].dtype == np.int64


def with_(event: dict[str, Any], **changes: Any) -> bytes:
    return encode({**event, **changes})


def without(event: dict[str, Any], field: str) -> bytes:
    return encode({k: v for k, v in event.items() if k != field})


P = produce("alice", "app1", 10, BASE)
R = replication(1, "leader", "orders", 0, 2, False, 5, BASE)
SEGMENT = {
    **remote_segment("orders", 0, "a", 10, "copy_finished", BASE, leader_epoch=7),
    "segment_leader_epochs": {"5": 14, "7": 15},
    "end_offset": 99,
}
LINEAGE = {
    "kind": "leader_epochs",
    "ts": BASE,
    "broker": 1,
    "topic": "orders",
    "partition": 0,
    "epochs": {"0": 0, "3": 120},
    "log_end_offset": 400,
}
# One generator per way of being wrong, each with the reason it must be rejected for.
BAD: list[tuple[RejectReason, Any]] = [
    (RejectReason.INVALID_JSON, lambda i: b"not json " + str(i).encode()),
    (RejectReason.INVALID_JSON, lambda i: encode(P)[: -1 - i % 5]),  # truncated
    (RejectReason.INVALID_JSON, lambda i: encode(P) + b" trailing"),
    (RejectReason.INVALID_JSON, lambda i: b""),
    (RejectReason.INVALID_JSON, lambda i: encode(P).replace(b"10", b"NaN")),
    (RejectReason.INVALID_JSON, lambda i: encode(P).replace(b"10", b"Infinity")),
    (RejectReason.INVALID_UTF8, lambda i: encode(P).replace(b"alice", b"al\xffice")),
    (
        RejectReason.TOO_DEEP,
        lambda i: encode(P)[:-1] + b',"x":' + b"[" * 10_000 + b"]" * 10_000 + b"}",
    ),
    (RejectReason.TOO_LARGE, lambda i: with_(P, user="u" * 70_000)),
    (RejectReason.NOT_AN_OBJECT, lambda i: json.dumps(f"text {i}").encode()),
    (RejectReason.NOT_AN_OBJECT, lambda i: b"42"),
    (RejectReason.UNKNOWN_KIND, lambda i: with_(P, kind=f"produce{i}")),
    (RejectReason.MISSING_FIELD, lambda i: without(P, "kind")),
    (RejectReason.MISSING_FIELD, lambda i: without(P, "user")),
    (RejectReason.MISSING_FIELD, lambda i: without(P, "ts")),
    (RejectReason.MISSING_FIELD, lambda i: without(R, "in_sync")),
    (RejectReason.MISSING_FIELD, lambda i: without(R, "partition")),  # all four or none
    (RejectReason.WRONG_TYPE, lambda i: with_(P, bytes=str(i))),
    (RejectReason.WRONG_TYPE, lambda i: with_(P, bytes=1.5)),
    (RejectReason.WRONG_TYPE, lambda i: with_(P, ts=float(BASE))),
    (RejectReason.WRONG_TYPE, lambda i: with_(P, broker=True)),
    (RejectReason.WRONG_TYPE, lambda i: with_(P, user=None)),
    (RejectReason.WRONG_TYPE, lambda i: with_(R, in_sync="yes")),
    (RejectReason.WRONG_TYPE, lambda i: with_(P, kind=7)),
    (RejectReason.INVALID_VALUE, lambda i: with_(P, bytes=2**64 + i)),  # overflows int64
    (RejectReason.INVALID_VALUE, lambda i: with_(P, broker=-1 - i)),
    (RejectReason.INVALID_VALUE, lambda i: with_(P, user="")),
    (RejectReason.INVALID_VALUE, lambda i: with_(P, count=0)),
    (RejectReason.INVALID_VALUE, lambda i: with_(R, role="boss")),
    (RejectReason.INVALID_VALUE, lambda i: with_(R, partition=-1)),
    (RejectReason.NEGATIVE_BYTES, lambda i: with_(P, bytes=-1 - i)),
    (RejectReason.TS_OUT_OF_BOUNDS, lambda i: with_(P, ts=BASE // 1000)),  # seconds, not ms
    (RejectReason.TS_OUT_OF_BOUNDS, lambda i: with_(P, ts=-5)),
    (RejectReason.TS_OUT_OF_BOUNDS, lambda i: with_(P, ts=10**16)),
    (RejectReason.INVALID_VALUE, lambda i: with_(SEGMENT, leader_epoch=5)),  # not its last
    (
        RejectReason.INVALID_VALUE,
        lambda i: with_(SEGMENT, segment_leader_epochs={"5": 16, "7": 15}),
    ),
    (RejectReason.INVALID_VALUE, lambda i: with_(SEGMENT, segment_leader_epochs={})),
    (RejectReason.INVALID_VALUE, lambda i: with_(LINEAGE, epochs={"0": 5, "1": 4})),
    (RejectReason.INVALID_VALUE, lambda i: with_(LINEAGE, log_end_offset=-1)),
    (RejectReason.MISSING_FIELD, lambda i: without(LINEAGE, "epochs")),
    (RejectReason.WRONG_TYPE, lambda i: with_(SEGMENT, segment_leader_epochs={"x": 1})),
    (RejectReason.INVALID_TOPIC, lambda i: with_(R, topic="bad topic!")),
    (RejectReason.INVALID_TOPIC, lambda i: with_(R, topic="")),
]


@pytest.mark.parametrize(("reason", "make"), BAD, ids=[f"{r}-{i}" for i, (r, _) in enumerate(BAD)])
def test_each_kind_of_bad_payload_is_rejected_with_its_reason(
    reason: RejectReason, make: Any
) -> None:
    payload = make(3)
    parsed = parse_events([encode(P), payload, encode(P)])
    assert parsed.accepted["position"].tolist() == [0, 2]
    assert parsed.rejected["position"].tolist() == [1]
    assert parsed.rejected["reason"].tolist() == [reason]
    assert parsed.rejected["payload"].tolist() == [payload]
    assert parsed.rejected["detail"].iloc[0]


def test_bounds_narrow_around_a_clock() -> None:
    bounds = EventBounds().around(now_ms=BASE, max_past_ms=60_000, max_future_ms=1_000)
    parsed = parse_events(
        [
            with_(P, ts=BASE - 60_001),
            with_(P, ts=BASE - 60_000),
            with_(P, ts=BASE + 1_000),
            with_(P, ts=BASE + 1_001),
        ],
        bounds,
    )
    assert parsed.accepted["position"].tolist() == [1, 2]
    assert parsed.rejected["reason"].tolist() == [RejectReason.TS_OUT_OF_BOUNDS] * 2


def test_malformed_file_every_bad_line_rejected_every_good_line_decided(
    replay_cli: ReplayRunner,
) -> None:
    rng = random.Random(7)
    lines: list[bytes] = []
    expected_reason: dict[int, str] = {}
    good: list[int] = []
    for i in range(3000):
        if rng.random() < 0.45:
            reason, make = BAD[i % len(BAD)]
            lines.append(make(i))
            expected_reason[len(lines)] = reason.value
        else:
            event = rng.choice(VALID[:5])
            lines.append(with_(event, ts=BASE + i, bytes=rng.randrange(0, 10**6)))
            good.append(len(lines))
    assert len(expected_reason) >= 1000
    run = replay_cli({}, lines, "--batch-size", "500")
    assert run.exit_code == 0
    assert {r["line"]: r["reason"] for r in run.rejected} == expected_reason
    assert [d["line"] for d in run.decisions] == good
    assert f"{len(lines)} lines, {len(good)} decided, {len(expected_reason)} rejected" in run.stderr
    # The dead letter keeps the original payload (base64 where it is not UTF-8).
    by_line = {r["line"]: r for r in run.rejected}
    for line, record in by_line.items():
        original = lines[line - 1]
        if "payload" in record:
            assert record["payload"].encode() == original
        else:
            assert base64.b64decode(record["payload_base64"], validate=True) == original
            with pytest.raises(UnicodeDecodeError):
                original.decode("utf-8")
    assert any("payload_base64" in record for record in by_line.values())


def test_segment_epochs_and_lineage_reports_are_accepted_with_their_values() -> None:
    parsed = parse_events([encode(SEGMENT), encode(LINEAGE), encode(P)])
    assert parsed.rejected.empty
    accepted = parsed.accepted
    assert accepted["kind"].tolist() == ["remote_segment", "leader_epochs", "produce"]
    assert accepted["epochs"].tolist() == [((5, 14), (7, 15)), ((0, 0), (3, 120)), None]
    assert accepted["end_offset"].tolist() == [99, -1, -1]
    assert accepted["log_end_offset"].tolist() == [-1, 400, -1]


def test_rejected_kinds_cover_every_reason() -> None:
    assert {reason for reason, _ in BAD} == set(RejectReason)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=10,
)
fields = st.sampled_from(
    [
        "kind",
        "ts",
        "bytes",
        "count",
        "user",
        "client_id",
        "broker",
        "topic",
        "partition",
        "role",
        "replica",
        "in_sync",
        "leader_epoch",
        "segment_id",
        "state",
        "segment_leader_epochs",
        "end_offset",
        "epochs",
        "log_end_offset",
    ]
)


def _is_empty_batch(payload: bytes) -> bool:
    """JSON text of an empty array (UTF-8 without a byte-order mark, as the validator reads it)."""
    try:
        return bool(json.loads(payload.decode("utf-8")) == [])
    except ValueError:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return False


@settings(max_examples=300, deadline=None)
@given(
    base=st.sampled_from(VALID),
    changes=st.dictionaries(fields, json_values, max_size=3),
    raw=st.binary(max_size=40) | st.sampled_from([b"[]", b" [ ]\n", b"\xef\xbb\xbf[]", b"[{}]"]),
)
def test_any_payload_is_accepted_or_rejected_never_both_never_lost(
    base: dict[str, Any], changes: dict[str, Any], raw: bytes
) -> None:
    payloads = [encode({**base, **changes}), raw, encode(base)]
    parsed = parse_events(payloads)
    positions = parsed.accepted["position"].tolist() + parsed.rejected["position"].tolist()
    # ``raw`` may be a batched message of any number of events; an empty one holds none to decide
    # or reject (docs/events.md).
    assert sorted(set(positions)) == ([0, 2] if _is_empty_batch(raw) else [0, 1, 2])
    assert positions.count(0) == positions.count(2) == 1
    assert 2 in parsed.accepted["position"].tolist()
    assert set(parsed.rejected["reason"]) <= set(RejectReason)
    accepted = parsed.accepted
    assert (accepted["bytes"] >= 0).all()
    assert accepted["ts"].between(EventBounds.min_ts_ms, EventBounds.max_ts_ms).all()
    # What is accepted is what was sent: the unchanged event's values, and the changed one's
    # where it was accepted.
    for position, event in ((2, base), (0, {**base, **changes})):
        rows = accepted[accepted["position"] == position]
        if rows.empty:
            continue
        row = rows.iloc[0]
        assert row["kind"] == event["kind"]
        assert row["bytes"] == event["bytes"]
        assert row["ts"] == event["ts"]
        assert row["broker"] == event["broker"]
        assert row["count"] == event.get("count", 1)


def test_a_batched_message_is_decided_element_by_element() -> None:
    good = [produce("alice", "app1", 10, BASE + i) for i in range(3)]
    bad_elements: list[Any] = [42, with_(P, bytes=-1), {"kind": "produce"}]
    batched = (
        b"["
        + encode(good[0])
        + b","
        + b"42"
        + b","
        + encode(good[1])
        + b","
        + with_(P, bytes=-1)
        + b',{"kind": "produce"},'
        + encode(good[2])
        + b"]"
    )
    parsed = parse_events([encode(P), batched, b"  " + json.dumps([P]).encode()])
    accepted = parsed.accepted
    assert list(zip(accepted["position"], accepted["index"], strict=True)) == [
        (0, -1),
        (1, 0),
        (1, 2),
        (1, 5),
        (2, 0),
    ]
    assert accepted["ts"].tolist() == [BASE, BASE, BASE + 1, BASE + 2, BASE]
    rejected = parsed.rejected
    assert list(zip(rejected["position"], rejected["index"], strict=True)) == [
        (1, 1),
        (1, 3),
        (1, 4),
    ]
    assert rejected["reason"].tolist() == [
        RejectReason.NOT_AN_OBJECT,
        RejectReason.NEGATIVE_BYTES,
        RejectReason.MISSING_FIELD,
    ]
    # Each bad element's own bytes go to the dead letter, not the whole message.
    assert [json.loads(p) for p in rejected["payload"]] == [
        bad if not isinstance(bad, bytes) else json.loads(bad) for bad in bad_elements
    ]


def test_a_batched_message_that_is_not_json_is_one_reject() -> None:
    broken = b"[" + encode(P) + b","
    parsed = parse_events([broken, b"[]"])
    assert parsed.accepted.empty
    assert parsed.rejected[["position", "index", "reason"]].values.tolist() == [
        [0, -1, RejectReason.INVALID_JSON]
    ]
    assert parsed.rejected["payload"].tolist() == [broken]


def test_the_size_limit_applies_to_each_event_of_a_batched_message() -> None:
    small, large = encode(P), with_(P, user="u" * 200)
    parsed = parse_events([b"[" + b",".join([small] * 5 + [large]) + b"]"], max_payload_bytes=150)
    assert parsed.accepted["index"].tolist() == [0, 1, 2, 3, 4]
    assert parsed.rejected["reason"].tolist() == [RejectReason.TOO_LARGE]
    assert parsed.rejected["index"].tolist() == [5]


@settings(max_examples=200, deadline=None)
@given(
    messages=st.lists(
        st.one_of(
            st.tuples(st.just("single"), st.booleans()),
            st.tuples(st.just("batched"), st.lists(st.booleans(), max_size=6)),
        ),
        max_size=8,
    )
)
def test_batched_and_single_messages_account_for_every_event_once(
    messages: list[tuple[str, Any]],
) -> None:
    """Every event, single or in a batched message, is accepted or rejected exactly once, at
    its (position, index), and the accepted ones are the same events as sent one per message."""
    payloads: list[bytes] = []
    expected_good: list[tuple[int, int]] = []
    expected_bad: list[tuple[int, int]] = []
    for position, (shape, content) in enumerate(messages):
        if shape == "single":
            payloads.append(with_(P, ts=BASE + position) if content else b"nope")
            (expected_good if content else expected_bad).append((position, -1))
            continue
        elements = [
            with_(P, ts=BASE + position, bytes=index) if ok else with_(P, bytes=-1)
            for index, ok in enumerate(content)
        ]
        payloads.append(b"[" + b",".join(elements) + b"]")
        for index, ok in enumerate(content):
            (expected_good if ok else expected_bad).append((position, index))
    parsed = parse_events(payloads)
    accepted = list(zip(parsed.accepted["position"], parsed.accepted["index"], strict=True))
    rejected = list(zip(parsed.rejected["position"], parsed.rejected["index"], strict=True))
    assert accepted == expected_good
    assert sorted(rejected) == sorted(expected_bad)
    batched_bytes = parsed.accepted["bytes"].to_numpy()[parsed.accepted["index"].to_numpy() >= 0]
    assert batched_bytes.tolist() == [index for _, index in expected_good if index >= 0]


def test_replay_decides_a_batched_line_as_its_events_one_per_line(
    replay_cli: ReplayRunner,
) -> None:
    events = [with_(P, ts=BASE + i, bytes=1000 * i) for i in range(6)]
    bad = with_(P, bytes=-5)
    single = replay_cli({}, [*events, bad])
    batched = replay_cli({}, [events[0], b"[" + b",".join([*events[1:4], bad, *events[4:]]) + b"]"])
    assert single.exit_code == batched.exit_code == 0
    strip = [{k: v for k, v in d.items() if k != "line"} for d in single.decisions]
    assert [{k: v for k, v in d.items() if k != "line"} for d in batched.decisions] == strip
    assert [d["line"] for d in batched.decisions] == [1, 2, 2, 2, 2, 2]
    (reject,) = batched.rejected
    assert (reject["line"], reject["index"], reject["reason"]) == (2, 3, "negative_bytes")
    assert json.loads(reject["payload"]) == json.loads(bad)


def test_the_past_bound_narrows_for_traffic_not_for_what_storage_holds() -> None:
    """A bridge that starts on a cluster publishes segments uploaded long before the engine's
    clock: they are still in the remote store and count in its size."""
    bounds = EventBounds().around(now_ms=BASE, max_past_ms=60_000, max_future_ms=1_000)
    day_old = BASE - 86_400_000
    parsed = parse_events(
        [
            with_(P, ts=day_old),
            with_(SEGMENT, ts=day_old),
            with_(LINEAGE, ts=day_old),
            with_(SEGMENT, ts=BASE + 1_001),  # the future bound still holds
            with_(SEGMENT, ts=EventBounds().min_ts_ms - 1),  # and the absolute one
        ],
        bounds,
    )
    assert parsed.accepted["position"].tolist() == [1, 2]
    assert parsed.rejected["position"].tolist() == [0, 3, 4]
    assert set(parsed.rejected["reason"]) == {RejectReason.TS_OUT_OF_BOUNDS}
    assert "for remote_segment and leader_epochs" in parsed.rejected["detail"].iloc[0]


def test_counts_from_a_brokers_metrics_name_no_partition() -> None:
    """A broker's replication counter is broker-wide, its remote fetch counter per topic."""
    broker_wide = {"kind": "replication", "ts": BASE, "bytes": 5, "broker": 1, "role": "leader"}
    per_topic = {"kind": "remote_fetch", "ts": BASE, "bytes": 5, "broker": 1, "topic": "t"}
    parsed = parse_events([encode(broker_wide), encode(per_topic)])
    assert parsed.rejected.empty
    accepted = parsed.accepted
    assert accepted["topic"].tolist() == [None, "t"]
    assert accepted["partition"].tolist() == [-1, -1]
    assert accepted["replica"].tolist() == [-1, -1]
    assert accepted["in_sync"].tolist() == [False, False]


@settings(max_examples=150, deadline=None)
@given(
    messages=st.lists(
        st.lists(st.sampled_from([*VALID, SEGMENT, LINEAGE, R, None]), min_size=1, max_size=5)
        .map(lambda events: events[:1] if events[0] is None else events)
        .flatmap(lambda events: st.tuples(st.just(events), st.booleans())),
        max_size=8,
    )
)
def test_mixed_kinds_are_accepted_in_payload_order_as_each_alone(
    messages: list[tuple[list[dict[str, Any] | None], bool]],
) -> None:
    """Events of every kind, interleaved and in single or batched messages (None: a bad one), are
    accepted in payload order with the very values each gets when parsed alone."""
    payloads: list[bytes] = []
    alone: list[Any] = []
    for position, (events, batched) in enumerate(messages):
        single = len(events) == 1 and not batched
        encoded = [b"{}" if event is None else encode(event) for event in events]
        payloads.append(encoded[0] if single else b"[" + b",".join(encoded) + b"]")
        for index, (event, payload) in enumerate(zip(events, encoded, strict=True)):
            if event is None:
                continue
            row = parse_events([payload]).accepted.iloc[0].to_dict()
            alone.append({**row, "position": position, "index": -1 if single else index})
    parsed = parse_events(payloads)
    assert parsed.accepted.to_dict("records") == alone
    assert len(parsed.rejected) == sum(event is None for events, _ in messages for event in events)
