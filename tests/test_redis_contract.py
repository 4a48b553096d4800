"""The Redis key contract, both ends: the sink's writer and the agents' lookup client."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from quotastream import Decision, QuotaClient, TimerStats
from quotastream.redis_contract import (
    CorruptValueError,
    decode_decision,
    decode_remote_log,
    release_channel,
    remote_log_value,
)
from state.config import parse_quota_config
from state.events import EventBounds
from state.remote_log_view import RemoteLog, RetentionView
from streaming.commands.live_view import Snapshot
from streaming.engine.batch_summary import throttled_at
from streaming.engine.decision_values import decision_values
from streaming.engine.shard_layout import ShardLayout
from streaming.engine.sinks import SinkSettings, write_batches
from streaming.engine.source_records import KafkaRecords
from streaming.engine.stages import (
    DECISION,
    DECISION_SCHEMA,
    TIMERS,
    StageSettings,
    staged_batches,
    update_shard,
)
from streaming.services import LocalService, start_redis
from tests.support.agents import CONFIG, FakeClock
from tests.support.factories import BASE, decision_row, produce


@pytest.fixture(scope="module")
def server() -> Iterator[LocalService]:
    with start_redis() as service:
        yield service


def write(server: LocalService, rows: list[dict[str, object]]) -> None:
    settings = SinkSettings.local(server.host, server.port, key_prefix="qs")
    batch = pa.RecordBatch.from_pylist(rows, schema=DECISION_SCHEMA)
    counts = list(write_batches(iter([batch]), settings))
    written = sum(bool(row["write"]) for row in rows)
    assert counts[0].to_pylist() == [{"decisions": written, "rejects": 0}]


def test_a_written_decision_reads_back_in_one_lookup(server: LocalService) -> None:
    now = int(time.time() * 1000)
    write(server, [decision_row("user=alice,broker=1", now, 5000)])
    client = QuotaClient.connect(server.host, server.port, prefix="qs", config=CONFIG)
    decision = client.for_client("produce", user="alice", client_id="any", broker=1)
    assert decision is not None
    assert (decision.entity, decision.throttle_ms, decision.until) == (
        "user=alice,broker=1",
        5000,
        now + 5000,
    )
    assert (decision.rate, decision.limit, decision.exceeded) == (150.0, 100.0, True)
    assert 4000 < decision.throttle_ms_now() <= 5000
    assert decision.throttle_ms_now(FakeClock(now + 6000)) == 0
    assert client.lookup("produce", "user=nobody,broker=1") is None


@pytest.mark.parametrize("mode", ["shadow", "exempt", "disabled"])
def test_a_decision_not_enforced_reports_its_delay_but_never_binds(
    server: LocalService, mode: str
) -> None:
    now = int(time.time() * 1000)
    row = decision_row("user=shadowed,broker=1", now, 5000, mode=mode, config_version=3)
    write(server, [row])
    client = QuotaClient.connect(server.host, server.port, prefix="qs")
    decision = client.lookup("produce", "user=shadowed,broker=1")
    assert decision is not None
    assert (decision.mode, decision.enforced, decision.config_version) == (mode, False, 3)
    assert decision.throttle_ms == 5000  # what would apply, reported
    assert decision.throttle_ms_now(FakeClock(now)) == 0


def test_keys_expire_when_the_throttle_ends_but_not_before_keep_ms(server: LocalService) -> None:
    now = int(time.time() * 1000)
    write(
        server,
        [
            decision_row("user=a,broker=1", now, 60_000, keep_ms=20_000),
            decision_row("user=b,broker=1", now, 0, keep_ms=20_000),
        ],
    )
    raw = redis.Redis(host=server.host, port=server.port)
    ttl_a, ttl_b = raw.pttl("qs:produce:user=a,broker=1"), raw.pttl("qs:produce:user=b,broker=1")
    assert isinstance(ttl_a, int)
    assert isinstance(ttl_b, int)
    assert 55_000 < ttl_a <= 60_000
    assert 15_000 < ttl_b <= 20_000


def test_a_decision_redis_does_not_need_is_not_written(server: LocalService) -> None:
    now = int(time.time() * 1000)
    write(
        server,
        [
            decision_row("user=needed,broker=1", now, 5000),
            decision_row("user=quiet,broker=1", now, rate=10.0, exceeded=False, write=False),
        ],
    )
    client = QuotaClient.connect(server.host, server.port, prefix="qs")
    assert client.lookup("produce", "user=needed,broker=1") is not None
    assert client.lookup("produce", "user=quiet,broker=1") is None


def test_resolving_a_client_needs_the_config(server: LocalService) -> None:
    client = QuotaClient.connect(server.host, server.port)
    with pytest.raises(ValueError, match="needs the quota config"):
        client.for_client("produce", user="alice", client_id="x", broker=1)


def test_a_release_is_published_and_wakes_a_waiting_agent(server: LocalService) -> None:
    now = int(time.time() * 1000)
    entity = "user=waiter,broker=1"
    write(server, [decision_row(entity, now, 60_000)])
    client = QuotaClient.connect(server.host, server.port, prefix="qs")
    woken: list[Decision | None] = []
    waiter = threading.Thread(
        target=lambda: woken.append(client.wait_until_released("produce", entity, 30.0))
    )
    subscriber = redis.Redis(host=server.host, port=server.port)
    listener = subscriber.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    listener.subscribe(release_channel("qs", "produce", entity))
    began = time.monotonic()
    waiter.start()
    # The waiter is blocked on a 60 s throttle until the release below.
    released = decision_row(entity, now, 60_000) | {"released_at": now + 5, "notice": "released"}
    write(server, [released])
    waiter.join(timeout=30)
    assert not waiter.is_alive()
    assert time.monotonic() - began < 10  # woken by the notice, not by the 60 s throttle ending
    assert woken[0] is not None
    assert woken[0].released_at == now + 5
    assert woken[0].throttle_ms_now() == 0
    # The first read may only consume the subscription's confirmation.
    message = listener.get_message(timeout=5) or listener.get_message(timeout=5)
    assert message is not None
    assert json.loads(message["data"]) == {
        "quota": "produce",
        "entity": entity,
        "reason": "released",
        "released_at": now + 5,
        "until": now + 60_000,
    }
    listener.close()


def test_timer_counts_sum_over_shards(server: LocalService) -> None:
    def counts(shard: int, pending: int, fired: int, cancelled: int) -> dict[str, object]:
        row = dict.fromkeys(DECISION_SCHEMA.names)
        return row | {
            "row_type": TIMERS,
            "shard": shard,
            "timers_pending": pending,
            "timers_fired": fired,
            "timers_cancelled": cancelled,
        }

    settings = SinkSettings.local(server.host, server.port, key_prefix="timers-test")
    rows = [counts(0, 3, 10, 1), counts(1, 2, 5, 0)]
    batch = pa.RecordBatch.from_pylist(rows, schema=DECISION_SCHEMA)
    list(write_batches(iter([batch]), settings))
    later = pa.RecordBatch.from_pylist([counts(1, 0, 7, 0)], schema=DECISION_SCHEMA)
    list(write_batches(iter([later]), settings))  # a shard's latest counts replace its earlier
    client = QuotaClient.connect(server.host, server.port, prefix="timers-test")
    assert client.timer_counts() == TimerStats(pending=3, fired=17, cancelled=1)


# --- The values, without Redis: one definition each, read the same way by every reader -----
_MODES = st.sampled_from(["enforced", "shadow", "exempt", "disabled"])


@given(
    throttle_ms=st.integers(0, 60_000),
    released=st.booleans(),
    mode=_MODES,
    limit=st.none() | st.floats(0.0, 1e12),
    now_offset=st.integers(-1_000, 70_000),
)
def test_a_written_value_reads_back_as_the_row_and_throttles_as_its_columns_say(
    throttle_ms: int, released: bool, mode: str, limit: float | None, now_offset: int
) -> None:
    row = decision_row("user=a", 1_000_000, throttle_ms, mode=mode) | {
        "limit": limit,
        "released_at": 1_000_500 if released else None,
    }
    batch = pa.RecordBatch.from_pylist([row], schema=DECISION_SCHEMA)
    (value,) = decision_values(batch)
    decision = decode_decision("k", value, ("produce", "user=a"))
    assert decision == Decision(
        quota="produce",
        entity="user=a",
        throttle_ms=throttle_ms,
        until=1_000_000 + throttle_ms,
        rate=150.0,
        limit=limit,
        exceeded=throttle_ms > 0,
        window_ms=10_000,
        decided_at=1_000_000,
        enforced=mode == "enforced",
        mode=mode,
        config_version=0,
        released_at=1_000_500 if released else None,
    )
    now = 1_000_000 + now_offset
    # The summary's column form of "throttled now" is the value's.
    assert throttled_at(batch, now).tolist() == [decision.throttle_ms_at(now) > 0]


def test_unlimited_is_null_from_the_core_to_every_reader() -> None:
    """The core computes with inf; its decision rows, the value and the readers say None."""
    config = parse_quota_config({"clients": []}, "no quotas")
    stage = StageSettings(config, EventBounds(), 65_536, clock=FakeClock(wall_ms=BASE))
    event = json.dumps(produce("alice", "app1", 500, BASE - 100)).encode()
    reads = [KafkaRecords("events", 0, [0], [event], 0)]
    staged = staged_batches(reads, stage, ShardLayout(1, 1))
    rows = pa.Table.from_batches(list(staged)).to_pandas()
    update = update_shard(None, rows, stage, 0, stage.now_ms())
    table = pa.Table.from_batches(update.batches)
    decisions = table.filter(pc.equal(table.column("row_type"), DECISION)).combine_chunks()
    (decisions,) = decisions.to_batches()
    assert decisions.column("limit").to_pylist() == [None]
    (value,) = decision_values(decisions)
    assert json.loads(value)["limit"] is None
    decision = decode_decision("k", value)
    assert (decision.limit, decision.utilisation) == (None, None)


def test_a_value_missing_or_mistyping_a_field_is_corrupt_and_new_fields_are_ignored() -> None:
    (value,) = decision_values(
        pa.RecordBatch.from_pylist([decision_row("user=a", 1, 0)], schema=DECISION_SCHEMA)
    )
    document = json.loads(value)
    assert decode_decision("k", json.dumps(document | {"later": [1]}).encode()).entity == "user=a"
    with pytest.raises(CorruptValueError, match="k does not hold a quotastream value"):
        decode_decision("k", json.dumps(document | {"until": "soon"}).encode())
    with pytest.raises(CorruptValueError, match="rate"):
        decode_decision("k", json.dumps({k: v for k, v in document.items() if k != "rate"}))
    with pytest.raises(CorruptValueError, match="decision of produce 'user=a'"):
        decode_decision("k", value, ("produce", "user=b"))


def test_a_remote_log_value_round_trips_and_an_old_one_counts_every_segment() -> None:
    remote_log = RemoteLog(
        "orders",
        3,
        300,
        {0: 200, 1: 100},
        [("a", 0, 100), ("b", 0, 100), ("c", 1, 100)],
        RetentionView([(0, 0), (1, 50)], 120, 200, [("a", 100, True), ("b", 100, False)]),
    )
    value = remote_log_value(remote_log)
    assert json.loads(value)["epochs"] == {"0": 200, "1": 100}  # JSON keys: docs/redis.md
    assert decode_remote_log("k", value) == remote_log
    # Written before lineages were reported: no "retention"; every live segment counts, in order.
    old = {k: v for k, v in json.loads(value).items() if k != "retention"}
    read = decode_remote_log("k", json.dumps(old).encode())
    assert (read.lineage, read.retention_bytes) == (None, 300)
    assert read.retention_walk == [("a", 100, True), ("b", 100, True), ("c", 100, True)]
    with pytest.raises(CorruptValueError, match="segments"):
        decode_remote_log("k", json.dumps(old | {"segments": [["a", 0]]}).encode())


def test_the_live_view_counts_only_what_an_agent_would_enforce_as_throttled() -> None:
    now = 1_000_000

    def over(entity: str, **fields: object) -> Decision:
        base = {"throttle_ms": 5_000, "until": now + 5_000, "rate": 300.0, "limit": 100.0}
        return Decision(
            **{"quota": "produce", "entity": entity, "exceeded": True, "window_ms": 10_000}
            | {"decided_at": now}
            | base
            | fields  # type: ignore[arg-type]
        )

    view = Snapshot(
        [
            over("user=enforced"),
            over("user=shadow", enforced=False, mode="shadow"),
            over("user=released", released_at=now),
            over("user=over-already", until=now - 1),
        ],
        taken_at_ms=now,
    )
    assert [d.entity for d in view.throttled] == ["user=enforced"]
    assert view.summary() == "4 entities written; over limit: produce=4; throttled now: produce=1"
