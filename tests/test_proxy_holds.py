"""The proxy's holds against a real Redis: each client held until its decision's end with the
bytes the proxy forwarded since the engine's last count (``Holds``, ``Decision.until_with``).

The clocks are injected: the holds are computed from ``decided_at`` and the forwarded bytes'
times, which the test sets to the millisecond."""

from __future__ import annotations

import uuid

import msgspec
import redis

from quotastream.cache import CachedQuotaClient
from quotastream.client import QuotaClient
from quotastream.proxy.holds import FORWARDED_HORIZON_MS, ClientKey, Holds
from quotastream.proxy.settings import DecisionSettings
from quotastream.redis_contract import Decision, decision_key
from state.config import parse_quota_config
from streaming.services import LocalService

QUOTA_BYTES_PER_S = 300_000
WINDOW_MS = 10_000
#: One quota for a client over every broker: its connections to brokers 1 and 2 share a counter.
CONFIG = parse_quota_config(
    {
        "quota_types": {
            "produce": {"samples": 11, "window_ms": 1000, "scope": "cluster"},
            "fetch": {"samples": 11, "window_ms": 1000, "scope": "cluster"},
        },
        "clients": [
            {
                "client_id": "<default>",
                "producer_byte_rate": QUOTA_BYTES_PER_S,
                "consumer_byte_rate": QUOTA_BYTES_PER_S,
            }
        ],
    },
    "holds",
)
NOW_MS = 2_000_000_000_000


def write_decision(server: LocalService, prefix: str, decision: Decision) -> None:
    """Writes ``decision`` as the engine's sink does (``docs/redis.md``)."""
    redis.Redis(server.host, server.port).set(
        decision_key(prefix, decision.quota, decision.entity), msgspec.json.encode(decision)
    )


class Clock:
    """Both clocks of the holds and the cache: wall milliseconds, and monotonic seconds."""

    def __init__(self) -> None:
        self.ms = NOW_MS

    def wall_ms(self) -> int:
        return self.ms

    def monotonic(self) -> float:
        return self.ms / 1000


def holds_on(server: LocalService, prefix: str, clock: Clock) -> Holds:
    """The proxy's holds, refreshed every 100 ms: each pass (the clock moved 100 ms) reads
    Redis."""
    settings = DecisionSettings(refresh_ms=100)
    decisions = CachedQuotaClient.connect(
        server.host,
        server.port,
        prefix,
        CONFIG,
        settings.cache(),
        clock=clock.monotonic,
        wall_clock_ms=clock.wall_ms,
    )
    return Holds(
        decisions,
        refresh_ms=settings.refresh_ms,
        idle_ms=60_000,
        clock=clock.monotonic,
        wall_clock_ms=clock.wall_ms,
    )


def decided(entity: str, window_bytes: int, at_ms: int, quota: str = "produce") -> Decision:
    """The engine's decision at ``at_ms`` with ``window_bytes`` in a 10 s window."""
    rate = window_bytes * 1000 / WINDOW_MS
    throttle = max(round((rate - QUOTA_BYTES_PER_S) / QUOTA_BYTES_PER_S * WINDOW_MS), 0)
    return Decision(
        quota=quota,
        entity=entity,
        throttle_ms=throttle,
        until=at_ms + throttle,
        rate=rate,
        limit=float(QUOTA_BYTES_PER_S),
        exceeded=throttle > 0,
        window_ms=WINDOW_MS,
        decided_at=at_ms,
    )


def test_a_client_is_held_for_the_bytes_forwarded_on_any_broker_since_its_decision(
    redis_server: LocalService,
) -> None:
    prefix, clock = f"holds-{uuid.uuid4().hex[:8]}", Clock()
    holds = holds_on(redis_server, prefix, clock)
    on_broker_1: ClientKey = ("produce", "ANONYMOUS", "c", 1)
    on_broker_2: ClientKey = ("produce", "ANONYMOUS", "c", 2)
    entity = QuotaClient.connect(
        redis_server.host, redis_server.port, prefix, CONFIG
    ).entity_of_client(*on_broker_1)
    assert entity == QuotaClient.connect(
        redis_server.host, redis_server.port, prefix, CONFIG
    ).entity_of_client(*on_broker_2)
    # Half the quota's window: 1.5 MB of headroom.
    write_decision(redis_server, prefix, decided(entity, 1_500_000, NOW_MS))
    for key in (on_broker_1, on_broker_2):
        assert holds.remaining_ms(key) == 0  # seen: refreshed from now on
    holds.forwarded.record(on_broker_1, 500_000, NOW_MS - 5)  # counted by the decision
    holds.forwarded.record(on_broker_1, 1_000_000, NOW_MS + 10)
    clock.ms = NOW_MS + 100
    holds.refresh()
    assert holds.remaining_ms(on_broker_1) == holds.remaining_ms(on_broker_2) == 0  # headroom
    # 1.8 MB unseen over both brokers: 3.3 MB in the window, 10% over, held 1 s from decided_at.
    holds.forwarded.record(on_broker_2, 800_000, NOW_MS + 120)
    clock.ms = NOW_MS + 200
    holds.refresh()
    assert holds.remaining_ms(on_broker_1) in range(800, 802)
    assert holds.remaining_ms(on_broker_2) in range(800, 802)
    # The engine's next decision has counted the first megabyte: only the rest is added to it
    # (3.3 MB again, held 1 s from its decided_at).
    write_decision(redis_server, prefix, decided(entity, 2_500_000, NOW_MS + 50))
    clock.ms = NOW_MS + 300
    holds.refresh()
    assert holds.remaining_ms(on_broker_1) in range(750, 752)
    assert holds.forwarded.since([on_broker_1, on_broker_2], 0) == 800_000  # the rest dropped


def test_bytes_no_decision_has_counted_are_kept_for_a_horizon_only(
    redis_server: LocalService,
) -> None:
    prefix, clock = f"holds-{uuid.uuid4().hex[:8]}", Clock()
    holds = holds_on(redis_server, prefix, clock)
    key: ClientKey = ("produce", "ANONYMOUS", "undecided", 1)
    assert holds.remaining_ms(key) == 0
    holds.forwarded.record(key, 100, NOW_MS)
    holds.forwarded.record(key, 200, NOW_MS + 1)
    holds.forwarded.record(key, 300, NOW_MS + 1)  # the same millisecond: one bucket
    clock.ms = NOW_MS + FORWARDED_HORIZON_MS
    holds.refresh()
    assert holds.forwarded.since([key], 0) == 500
    assert holds.remaining_ms(key) == 0


def test_a_fetch_response_that_would_break_the_quota_is_known_before_it_is_sent(
    redis_server: LocalService,
) -> None:
    """``over_quota_with``: what a broker asks of a Fetch response before it sends it, counting
    the bytes forwarded since the decision without waiting for a refresh."""
    prefix, clock = f"holds-{uuid.uuid4().hex[:8]}", Clock()
    holds = holds_on(redis_server, prefix, clock)
    key: ClientKey = ("fetch", "ANONYMOUS", "consumer", 1)
    entity = QuotaClient.connect(
        redis_server.host, redis_server.port, prefix, CONFIG
    ).entity_of_client(*key)
    # 2.5 MB in the window: 0.5 MB of headroom.
    write_decision(redis_server, prefix, decided(entity, 2_500_000, NOW_MS, quota="fetch"))
    assert holds.over_quota_with(key, 10**9) == 0  # not decided yet: never refused
    holds.remaining_ms(key)
    clock.ms = NOW_MS + 100
    holds.refresh()
    assert holds.over_quota_with(key, 400_000) == 0
    # 100 kB over: a third of a second from decided_at, 100 ms of which have passed.
    assert holds.over_quota_with(key, 600_000) in range(233, 235)
    holds.forwarded.record(key, 400_000, NOW_MS + 150)
    assert holds.over_quota_with(key, 200_000) in range(233, 235)
