"""The Redis key contract, both ends: the sink's writer and the agents' lookup client."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pyarrow as pa
import pytest
import redis

from quotastream import Decision, QuotaClient, TimerStats
from quotastream.keys import release_channel
from state.config import parse_quota_config
from streaming.services import LocalService, start_redis
from streaming.sinks import SinkSettings, write_batches
from streaming.stages import DECISION_SCHEMA, TIMERS, USAGE

CONFIG = parse_quota_config(
    {"clients": [{"user": "alice", "producer_byte_rate": 100}]}, "contract config"
)


@pytest.fixture(scope="module")
def server() -> Iterator[LocalService]:
    with start_redis() as service:
        yield service


def decision_row(
    entity: str, ts: int, throttle_ms: int, mode: str = "enforced", config_version: int = 3
) -> dict[str, object]:
    return {
        "row_type": USAGE,
        "quota": "produce",
        "entity": entity,
        "ts": ts,
        "rate": 150.0,
        "limit": 100.0,
        "throttle_ms": throttle_ms,
        "until": ts + throttle_ms,
        "exceeded": throttle_ms > 0,
        "window_ms": 10_000,
        "config_version": config_version,
        "mode": mode,
        "released_at": None,
        "notice": None,
        "topic": None,
        "partition": None,
        "offset": None,
        "payload": None,
        "reason": None,
        "detail": None,
    }


def write(server: LocalService, rows: list[dict[str, object]], keep_ms: int = 30_000) -> None:
    settings = SinkSettings.local(server.host, server.port, key_prefix="qs", keep_ms=keep_ms)
    batch = pa.RecordBatch.from_pylist(rows, schema=DECISION_SCHEMA)
    counts = list(write_batches(iter([batch]), settings))
    assert counts[0].to_pylist() == [{"decisions": len(rows), "rejects": 0}]


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
    assert decision.throttle_ms_now(now_ms=now + 6000) == 0
    assert client.lookup("produce", "user=nobody,broker=1") is None


@pytest.mark.parametrize("mode", ["shadow", "exempt", "disabled"])
def test_a_decision_not_enforced_reports_its_delay_but_never_binds(
    server: LocalService, mode: str
) -> None:
    now = int(time.time() * 1000)
    write(server, [decision_row("user=shadowed,broker=1", now, 5000, mode=mode)])
    client = QuotaClient.connect(server.host, server.port, prefix="qs")
    decision = client.lookup("produce", "user=shadowed,broker=1")
    assert decision is not None
    assert (decision.mode, decision.enforced, decision.config_version) == (mode, False, 3)
    assert decision.throttle_ms == 5000  # what would apply, reported
    assert decision.throttle_ms_now(now_ms=now) == 0


def test_keys_expire_when_the_throttle_ends_but_not_before_keep_ms(server: LocalService) -> None:
    now = int(time.time() * 1000)
    write(
        server,
        [decision_row("user=a,broker=1", now, 60_000), decision_row("user=b,broker=1", now, 0)],
        keep_ms=20_000,
    )
    raw = redis.Redis(host=server.host, port=server.port)
    ttl_a, ttl_b = raw.pttl("qs:produce:user=a,broker=1"), raw.pttl("qs:produce:user=b,broker=1")
    assert isinstance(ttl_a, int)
    assert isinstance(ttl_b, int)
    assert 55_000 < ttl_a <= 60_000
    assert 15_000 < ttl_b <= 20_000


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
