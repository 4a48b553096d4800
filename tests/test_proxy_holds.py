"""The proxy's holds against a real Redis: each client held until its decision's end measured
with the bytes the proxy forwarded, as the window is when it is asked (``Holds.held_until``).

The clocks are injected: the holds are computed from ``decided_at`` and the forwarded bytes'
times, which the test sets to the millisecond."""

from __future__ import annotations

import uuid

import pytest

from quotastream.cache import CachedQuotaClient
from quotastream.client import QuotaClient
from quotastream.proxy.hold_window import ClientKey
from quotastream.proxy.holds import Holds
from quotastream.proxy.settings import DecisionSettings
from quotastream.redis_contract import Decision
from state.config import parse_quota_config
from streaming.services import LocalService
from tests.support.proxy import write_decision

QUOTA_BYTES_PER_S = 300_000
SAMPLE_MS = 1000
#: The window's span: a byte forwarded this long ago counts in no window.
SPAN_MS = 12 * SAMPLE_MS
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
            clock=self.clock,
        )
        self.holds = Holds(
            decisions,
            refresh_ms=settings.refresh_ms,
            idle_ms=60_000,
            clock=self.clock,
        )

    def decide(self, key: ClientKey, window_bytes: int, at_ms: int) -> None:
        """Writes the engine's decision for ``key``'s counter at ``at_ms`` with ``window_bytes``
        in its window: 10 samples and the elapsed part of the current one (no overlapping
        sample counts in these tests)."""
        entity = QuotaClient.connect(
            self.server.host, self.server.port, self.prefix, CONFIG
        ).entity_of_client(*key)
        window_ms = 10 * SAMPLE_MS + at_ms % SAMPLE_MS
        rate = window_bytes * 1000 / window_ms
        throttle = max(round((rate - QUOTA_BYTES_PER_S) / QUOTA_BYTES_PER_S * window_ms), 0)
        decision = Decision(
            quota=key[0],
            entity=entity,
            throttle_ms=throttle,
            until=at_ms + throttle,
            rate=rate,
            limit=float(QUOTA_BYTES_PER_S),
            exceeded=throttle > 0,
            window_ms=window_ms,
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
    holds.forwarded.record(on_broker_1, 500_000, NOW_MS - 5, SAMPLE_MS)  # counted by the decision
    holds.forwarded.record(on_broker_1, 1_000_000, NOW_MS + 10, SAMPLE_MS)
    scene.refresh_at(NOW_MS + 100)
    assert holds.remaining_ms(on_broker_1) == holds.remaining_ms(on_broker_2) == 0  # headroom
    # 1.8 MB unseen over both brokers: 3.3 MB in the window, 10% over, held 1 s from decided_at.
    holds.forwarded.record(on_broker_2, 800_000, NOW_MS + 120, SAMPLE_MS)
    scene.refresh_at(NOW_MS + 200)
    assert holds.remaining_ms(on_broker_1) in range(800, 802)
    assert holds.remaining_ms(on_broker_2) in range(800, 802)
    # The engine's next decision has counted the first megabyte: only the rest is added to it
    # (3.3 MB again, held 1 s past 10.05 s of window from its decided_at).
    scene.decide(on_broker_2, 2_500_000, NOW_MS + 50)
    scene.refresh_at(NOW_MS + 300)
    assert holds.remaining_ms(on_broker_1) in range(700, 702)


def test_a_client_not_decided_yet_is_measured_from_nothing(scene: Scene) -> None:
    """Before the engine's first decision, the bytes this proxy forwarded are the client's
    window, as a broker measures a client it has just met; kept while a window counts them."""
    holds = scene.holds
    key: ClientKey = ("fetch", "ANONYMOUS", "undecided", 1)
    assert holds.remaining_ms(key) == 0
    holds.forwarded.record(key, 1_100_000, NOW_MS, SAMPLE_MS)
    holds.forwarded.record(key, 1_000_000, NOW_MS + 1, SAMPLE_MS)
    holds.forwarded.record(
        key, 1_200_000, NOW_MS + 1, SAMPLE_MS
    )  # the same millisecond: one bucket
    # 3.3 MB over 10.1 s (Kafka's padding of a fresh window): held 0.9 s.
    scene.refresh_at(NOW_MS + 100)
    assert holds.remaining_ms(key) in range(900, 902)
    assert holds.over_quota_with(key, 300_000) in range(1900, 1902)
    scene.refresh_at(NOW_MS + SPAN_MS)
    assert holds.forwarded.samples([key], SAMPLE_MS, NOW_MS) == (
        {NOW_MS // SAMPLE_MS: (1_100_000, NOW_MS)},
        {NOW_MS // SAMPLE_MS: (3_300_000, NOW_MS + 1)},
    )
    assert holds.remaining_ms(key) == 0
    scene.refresh_at(NOW_MS + 2 * SPAN_MS)  # no window counts them any more
    assert holds.forwarded.samples([key], SAMPLE_MS, NOW_MS) == ({}, {})


def test_a_burst_leaving_the_window_releases_the_client_before_a_decision_says_so(
    scene: Scene,
) -> None:
    """A greedy consumer's burst: ten windows' worth at once, then held until its sample leaves
    the window (as a broker serves the next fetch then), not a decision's latency later."""
    holds = scene.holds
    key: ClientKey = ("fetch", "ANONYMOUS", "greedy", 1)
    burst_at = NOW_MS + 200
    holds.forwarded.record(key, 3_300_000, burst_at, SAMPLE_MS)  # 11 s of quota
    scene.decide(key, 3_300_000, burst_at)  # throttled 0.8 s (3.3 MB over 10.2 s)
    holds.remaining_ms(key)
    scene.refresh_at(burst_at + 100)
    assert holds.remaining_ms(key) in range(700, 702)
    # Held on, as its decision said: the window grows by the time passed, bytes stay in it.
    scene.refresh_at(NOW_MS + 11_000)  # the burst's sample overlaps the window
    assert holds.remaining_ms(key) == 0
    assert holds.over_quota_with(key, 100_000) in range(332, 335)  # 3.4 MB over 11 s
    scene.refresh_at(burst_at + 11_000)  # its last byte is 11 s old: the sample is gone
    assert holds.over_quota_with(key, 2_900_000) == 0  # 10.2 s of window: room for 3.06 MB
    assert holds.over_quota_with(key, 3_100_000) in range(132, 135)


def test_bytes_a_decision_counted_are_kept_while_its_window_counts_them(scene: Scene) -> None:
    """A decision a second or two old still counts a sample that the window at the time of the
    refresh has left: this proxy's bytes in it are the decision's, not another proxy's."""
    holds = scene.holds
    key: ClientKey = ("fetch", "ANONYMOUS", "late", 1)
    holds.forwarded.record(key, 3_300_000, NOW_MS, SAMPLE_MS)
    scene.decide(key, 3_300_000, NOW_MS + 10_500)  # the oldest sample of its window
    holds.remaining_ms(key)
    scene.refresh_at(NOW_MS + 10_600)
    assert holds.remaining_ms(key) in range(400, 402)  # as decided: 0.5 s from decided_at
    scene.refresh_at(NOW_MS + 12_000)  # the burst has left the window since
    assert holds.remaining_ms(key) == 0
    assert holds.over_quota_with(key, 2_900_000) == 0


def test_bytes_other_proxies_forwarded_leave_the_window_as_a_steady_streams_would(
    scene: Scene,
) -> None:
    """The decision's bytes this proxy did not forward: where in the window they came is not
    known, so they are placed evenly over it, and leave it as it slides."""
    holds = scene.holds
    key: ClientKey = ("fetch", "ANONYMOUS", "spread", 1)
    holds.forwarded.record(key, 1_000_000, NOW_MS, SAMPLE_MS)
    # The engine counted 3.3 MB over 10 s at NOW_MS: this proxy's 1 MB and 2.3 MB through others.
    scene.decide(key, 3_300_000, NOW_MS)
    holds.remaining_ms(key)
    scene.refresh_at(NOW_MS + 100)
    assert holds.remaining_ms(key) in range(900, 902)  # as decided: 1 s from decided_at
    # 5 s on, six of the others' ten seconds are still in the window (and the overlapping
    # sample): 1.38 MB, this proxy's megabyte, and 1 MB more: 3.38 MB over 11 s.
    scene.refresh_at(NOW_MS + 5_000)
    assert holds.remaining_ms(key) == 0
    assert holds.over_quota_with(key, 1_000_000) in range(266, 269)
    # 11 s on, the whole window has slid past them.
    scene.refresh_at(NOW_MS + 11_000)
    assert holds.over_quota_with(key, 2_999_999) == 0


def test_a_fetch_response_that_would_break_the_quota_is_known_before_it_is_sent(
    scene: Scene,
) -> None:
    """``over_quota_with``: what a broker asks of a Fetch response before it sends it, counting
    the bytes forwarded since the decision without waiting for a refresh."""
    holds = scene.holds
    key: ClientKey = ("fetch", "ANONYMOUS", "consumer", 1)
    scene.decide(key, 2_500_000, NOW_MS)  # 0.5 MB of headroom
    assert holds.over_quota_with(key, 10**9) == 0  # never seen (its first refresh is woken)
    holds.remaining_ms(key)
    scene.refresh_at(NOW_MS + 100)
    assert holds.over_quota_with(key, 400_000) == 0
    # 100 kB over: a third of a second from decided_at, 100 ms of which have passed.
    assert holds.over_quota_with(key, 600_000) in range(233, 235)
    holds.forwarded.record(key, 400_000, NOW_MS + 150, SAMPLE_MS)
    assert holds.over_quota_with(key, 200_000) in range(233, 235)


def test_a_produce_request_that_breaks_the_quota_holds_the_client_as_it_is_recorded(
    scene: Scene,
) -> None:
    """``record_forwarded``: record, then check, as a broker does with each request. Within the
    headroom the last measure found, no hold; the request that spends it is measured with the
    window as it is then and holds the client (on every broker of a cluster-wide quota) for
    exactly what the window is over, without waiting for the next refresh."""
    holds = scene.holds
    on_broker_1: ClientKey = ("produce", "ANONYMOUS", "backlog", 1)
    on_broker_2: ClientKey = ("produce", "ANONYMOUS", "backlog", 2)
    scene.decide(on_broker_1, 2_500_000, NOW_MS)  # 0.5 MB of headroom over 10 s
    for key in (on_broker_1, on_broker_2):
        holds.remaining_ms(key)
    scene.refresh_at(NOW_MS + 100)  # 30 kB more room as the window grew: 530 kB
    assert holds.record_forwarded(on_broker_1, 300_000, NOW_MS + 100) == 0
    assert holds.record_forwarded(on_broker_2, 200_000, NOW_MS + 100) == 0
    assert holds.remaining_ms(on_broker_1) == 0
    # 60 kB over the quota's 530 kB: 200 ms.
    assert holds.record_forwarded(on_broker_1, 90_000, NOW_MS + 100) in range(200, 202)
    assert holds.remaining_ms(on_broker_2) in range(200, 202)
    # Spent: the next request is measured again. 20 ms on, the window has 6 kB more room and
    # 30 kB more bytes: 3.12 MB over 10.12 s, 280 ms over.
    scene.clock.ms = NOW_MS + 120
    assert holds.record_forwarded(on_broker_2, 30_000, NOW_MS + 120) in range(280, 282)
    assert holds.remaining_ms(on_broker_1) in range(280, 282)
