"""The proxy's holds against a real Redis: each client held until its decision's end with the
bytes the proxy forwarded since the engine's last count (``Holds``, ``Decision.until_with``).

The clocks are injected: the holds are computed from ``decided_at`` and the forwarded bytes'
times, which the test sets to the millisecond."""

from __future__ import annotations

import uuid

import msgspec
import pytest
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


class Scene:
    """The proxy's holds on a Redis of their own (a key prefix), with injected clocks, refreshed
    every 100 ms: each pass (the clock moved 100 ms) reads Redis."""

    def __init__(self, server: LocalService) -> None:
        self.server, self.prefix, self.clock = server, f"holds-{uuid.uuid4().hex[:8]}", Clock()
        settings = DecisionSettings(refresh_ms=100)
        decisions = CachedQuotaClient.connect(
            server.host,
            server.port,
            self.prefix,
            CONFIG,
            settings.cache(),
            clock=self.clock.monotonic,
            wall_clock_ms=self.clock.wall_ms,
        )
        self.holds = Holds(
            decisions,
            refresh_ms=settings.refresh_ms,
            idle_ms=60_000,
            clock=self.clock.monotonic,
            wall_clock_ms=self.clock.wall_ms,
        )

    def decide(self, key: ClientKey, window_bytes: int, at_ms: int) -> None:
        """Writes the engine's decision for ``key``'s counter at ``at_ms`` with ``window_bytes``
        in a 10 s window."""
        entity = QuotaClient.connect(
            self.server.host, self.server.port, self.prefix, CONFIG
        ).entity_of_client(*key)
        rate = window_bytes * 1000 / WINDOW_MS
        throttle = max(round((rate - QUOTA_BYTES_PER_S) / QUOTA_BYTES_PER_S * WINDOW_MS), 0)
        decision = Decision(
            quota=key[0],
            entity=entity,
            throttle_ms=throttle,
            until=at_ms + throttle,
            rate=rate,
            limit=float(QUOTA_BYTES_PER_S),
            exceeded=throttle > 0,
            window_ms=WINDOW_MS,
            decided_at=at_ms,
        )
        write_decision(self.server, self.prefix, decision)

    def refresh_at(self, ms: int) -> None:
        self.clock.ms = ms
        self.holds.refresh()


@pytest.fixture
def scene(redis_server: LocalService) -> Scene:
    return Scene(redis_server)


def test_a_client_is_held_for_the_bytes_forwarded_on_any_broker_since_its_decision(
    scene: Scene,
) -> None:
    holds = scene.holds
    on_broker_1: ClientKey = ("produce", "ANONYMOUS", "c", 1)
    on_broker_2: ClientKey = ("produce", "ANONYMOUS", "c", 2)
    # One counter for both (scope: cluster), half the quota's window: 1.5 MB of headroom.
    scene.decide(on_broker_1, 1_500_000, NOW_MS)
    for key in (on_broker_1, on_broker_2):
        assert holds.remaining_ms(key) == 0  # seen: refreshed from now on
    holds.forwarded.record(on_broker_1, 500_000, NOW_MS - 5)  # counted by the decision
    holds.forwarded.record(on_broker_1, 1_000_000, NOW_MS + 10)
    scene.refresh_at(NOW_MS + 100)
    assert holds.remaining_ms(on_broker_1) == holds.remaining_ms(on_broker_2) == 0  # headroom
    # 1.8 MB unseen over both brokers: 3.3 MB in the window, 10% over, held 1 s from decided_at.
    holds.forwarded.record(on_broker_2, 800_000, NOW_MS + 120)
    scene.refresh_at(NOW_MS + 200)
    assert holds.remaining_ms(on_broker_1) in range(800, 802)
    assert holds.remaining_ms(on_broker_2) in range(800, 802)
    # The engine's next decision has counted the first megabyte: only the rest is added to it
    # (3.3 MB again, held 1 s from its decided_at).
    scene.decide(on_broker_2, 2_500_000, NOW_MS + 50)
    scene.refresh_at(NOW_MS + 300)
    assert holds.remaining_ms(on_broker_1) in range(750, 752)
    assert holds.forwarded.since([on_broker_1, on_broker_2], 0) == 800_000  # the rest dropped


def test_bytes_no_decision_has_counted_are_kept_for_a_horizon_only(scene: Scene) -> None:
    holds = scene.holds
    key: ClientKey = ("produce", "ANONYMOUS", "undecided", 1)
    assert holds.remaining_ms(key) == 0
    holds.forwarded.record(key, 100, NOW_MS)
    holds.forwarded.record(key, 200, NOW_MS + 1)
    holds.forwarded.record(key, 300, NOW_MS + 1)  # the same millisecond: one bucket
    scene.refresh_at(NOW_MS + FORWARDED_HORIZON_MS)
    assert holds.forwarded.since([key], 0) == 500
    assert holds.remaining_ms(key) == 0


def test_a_fetch_response_that_would_break_the_quota_is_known_before_it_is_sent(
    scene: Scene,
) -> None:
    """``over_quota_with``: what a broker asks of a Fetch response before it sends it, counting
    the bytes forwarded since the decision without waiting for a refresh."""
    holds = scene.holds
    key: ClientKey = ("fetch", "ANONYMOUS", "consumer", 1)
    scene.decide(key, 2_500_000, NOW_MS)  # 0.5 MB of headroom
    assert holds.over_quota_with(key, 10**9) == 0  # not decided yet: never refused
    holds.remaining_ms(key)
    scene.refresh_at(NOW_MS + 100)
    assert holds.over_quota_with(key, 400_000) == 0
    # 100 kB over: a third of a second from decided_at, 100 ms of which have passed.
    assert holds.over_quota_with(key, 600_000) in range(233, 235)
    holds.forwarded.record(key, 400_000, NOW_MS + 150)
    assert holds.over_quota_with(key, 200_000) in range(233, 235)
