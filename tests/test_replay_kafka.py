"""Kafka's own examples, reproduced through ``quotastream replay``."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.factories import BASE, fetch, produce, remote, replication
from tests.support.replay import ReplayRunner

DEFAULT = "<default>"


def test_reference_example_throttles_for_2100_ms(replay_cli: ReplayRunner) -> None:
    """Reference §2: quota 500 B/s, 400 B each second for 10 s, then 2300 B at 10.5 s."""
    events = [produce("alice", "app1", 400, BASE + i * 1000) for i in range(10)]
    events.append(produce("alice", "app1", 2300, BASE + 10_500))
    run = replay_cli({"clients": [{"user": "alice", "producer_byte_rate": 500}]}, events)
    assert run.exit_code == 0
    assert [d["throttle_ms"] for d in run.decisions] == [0] * 10 + [2100]
    last = run.decisions[-1]
    assert last["rate"] == pytest.approx(600.0)
    assert (last["limit"], last["window_ms"], last["exceeded"]) == (500, 10_500, True)
    assert last["entity"] == "user=alice,broker=1"


def test_kip13_delay_example(replay_cli: ReplayRunner) -> None:
    """KIP-13's text: a 10 s window at exactly 5 MB/s, then a 15 MB batch in the next second,
    60 MB in the window: delay = (60 - 50) / 5 = 2 s."""
    mb = 1_000_000
    events = [produce("bob", "app", 5 * mb, BASE + i * 1000) for i in range(1, 10)]
    events.append(produce("bob", "app", 15 * mb, BASE + 10_000))
    run = replay_cli({"clients": [{"client_id": DEFAULT, "producer_byte_rate": 5 * mb}]}, events)
    last = run.decisions[-1]
    assert (last["window_ms"], last["rate"]) == (10_000, 6 * mb)
    assert last["throttle_ms"] == 2000
    assert [d["throttle_ms"] for d in run.decisions[:-1]] == [0] * 9


# Precedence: entries for level L and every lower level, so L must win. Expected: the counter
# key (who shares usage) of (alice, app1) on broker 1.
LEVEL_ENTRIES: dict[int, dict[str, str]] = {
    1: {"user": "alice", "client_id": "app1"},
    2: {"user": "alice", "client_id": DEFAULT},
    3: {"user": "alice"},
    4: {"user": DEFAULT, "client_id": "app1"},
    5: {"user": DEFAULT, "client_id": DEFAULT},
    6: {"user": DEFAULT},
    7: {"client_id": "app1"},
    8: {"client_id": DEFAULT},
}
SHARED_COUNTER = {
    1: "user=alice,client-id=app1",
    2: "user=alice,client-id=app1",
    3: "user=alice",
    4: "user=alice,client-id=app1",
    5: "user=alice,client-id=app1",
    6: "user=alice",
    7: "client-id=app1",
    8: "client-id=app1",
}


@pytest.mark.parametrize("level", sorted(LEVEL_ENTRIES))
def test_precedence_picks_the_first_configured_level(replay_cli: ReplayRunner, level: int) -> None:
    clients = [
        {**LEVEL_ENTRIES[lower], "producer_byte_rate": 1000 * lower} for lower in range(level, 9)
    ]
    run = replay_cli({"clients": clients}, [produce("alice", "app1", 100, BASE)])
    decision = run.decisions[0]
    assert decision["level"] == level
    assert decision["limit"] == 1000 * level
    assert decision["entity"] == SHARED_COUNTER[level] + ",broker=1"


def test_no_configured_level_means_unlimited_per_client_id(replay_cli: ReplayRunner) -> None:
    """With user and client-id quotas both configured, a client no level matches is unlimited
    and counted per client-id (``quotaMetricTags``' last step)."""
    run = replay_cli(
        {
            "clients": [
                {"user": "bob", "producer_byte_rate": 1},
                {"client_id": "other", "producer_byte_rate": 1},
            ]
        },
        [produce("alice", "app1", 10**12, BASE)],
    )
    decision = run.decisions[0]
    assert (decision["level"], decision["limit"], decision["throttle_ms"]) == (None, None, 0)
    assert decision["entity"] == "client-id=app1,broker=1"
    assert decision["exceeded"] is False


@pytest.mark.parametrize(
    ("entry", "counter"),
    [
        ({"user": "bob"}, "user=alice"),
        ({"user": "bob", "client_id": "x"}, "user=alice,client-id={client}"),
        ({"client_id": "x"}, "client-id={client}"),
    ],
)
def test_unlimited_clients_are_counted_by_the_only_kind_of_quota_configured(
    replay_cli: ReplayRunner, entry: dict[str, str], counter: str
) -> None:
    """``quotaMetricTags``' shortcut: with only user, only (user, client-id) or only client-id
    quotas, every client's counter (and its reported rate) groups by that kind."""
    run = replay_cli(
        {"clients": [{**entry, "producer_byte_rate": 1}]},
        [produce("alice", "app1", 300, BASE), produce("alice", "app2", 500, BASE + 100)],
    )
    assert [d["entity"] for d in run.decisions] == [
        counter.format(client=client) + ",broker=1" for client in ("app1", "app2")
    ]
    assert [d["limit"] for d in run.decisions] == [None, None]
    shared = counter == "user=alice"
    assert run.decisions[1]["rate"] == pytest.approx((800 if shared else 500) / 10.1)


@pytest.mark.parametrize(
    ("clients", "expected"),
    [
        # Matched at level 2, but the tags (alice, "") take the user's levels: 3 ...
        (
            [
                {"user": "alice", "client_id": DEFAULT, "producer_byte_rate": 100},
                {"user": "alice", "producer_byte_rate": 500},
            ],
            (3, 500, "user=alice"),
        ),
        # ... then 6, and with neither the client is unlimited.
        (
            [
                {"user": DEFAULT, "client_id": DEFAULT, "producer_byte_rate": 100},
                {"user": DEFAULT, "producer_byte_rate": 700},
            ],
            (6, 700, "user=alice"),
        ),
        (
            [{"user": "alice", "client_id": DEFAULT, "producer_byte_rate": 100}],
            (None, None, "user=alice"),
        ),
        # Only client-id quotas: the tags ("", "") find no quota at all.
        ([{"client_id": DEFAULT, "producer_byte_rate": 100}], (None, None, "client-id=")),
    ],
)
def test_an_empty_client_id_takes_its_limit_from_its_metric_tags(
    replay_cli: ReplayRunner,
    clients: list[dict[str, Any]],
    expected: tuple[int | None, int | None, str],
) -> None:
    """``ClientQuotaManager.quotaLimit`` reads the limit from the matched tags; a non-empty
    client-id of the same user keeps the level it matched."""
    run = replay_cli(
        {"clients": clients},
        [produce("alice", "", 10_000, BASE), produce("alice", "app1", 10_000, BASE)],
    )
    empty = run.decisions[0]
    assert (empty["level"], empty["limit"], empty["entity"]) == (
        expected[0],
        expected[1],
        expected[2] + ",broker=1",
    )
    named = run.decisions[1]
    assert named["entity"] != empty["entity"]


@pytest.mark.parametrize(
    ("level", "shared"),
    [(3, True), (6, True), (1, False), (5, False)],
)
def test_shared_counter_sums_usage_of_its_members(
    replay_cli: ReplayRunner, level: int, shared: bool
) -> None:
    """Under levels 3 and 6 all of alice's clients share one counter; under 1 and 5 they do not."""
    entries = [{**LEVEL_ENTRIES[level], "producer_byte_rate": 10**9}]
    if level == 1:
        entries.append({"user": "alice", "client_id": "app2", "producer_byte_rate": 10**9})
    run = replay_cli(
        {"clients": entries},
        [produce("alice", "app1", 1000, BASE), produce("alice", "app2", 1000, BASE)],
    )
    second = run.decisions[1]
    assert second["rate"] == pytest.approx((2000 if shared else 1000) / 10)


def test_precedence_is_per_quota_type(replay_cli: ReplayRunner) -> None:
    config = {
        "clients": [
            {"user": "alice", "client_id": "app1", "producer_byte_rate": 100},
            {"user": DEFAULT, "consumer_byte_rate": 200},
        ]
    }
    run = replay_cli(config, [produce("alice", "app1", 1, BASE), fetch("alice", "app1", 1, BASE)])
    assert [(d["quota"], d["level"], d["limit"]) for d in run.decisions] == [
        ("produce", 1, 100),
        ("fetch", 6, 200),
    ]


def test_cluster_scope_sums_usage_over_brokers(replay_cli: ReplayRunner) -> None:
    events = [produce("alice", "app1", 1000, BASE, broker=b) for b in (1, 2, 3)]
    per_broker = replay_cli({"clients": [{"user": "alice", "producer_byte_rate": 10**6}]}, events)
    cluster = replay_cli(
        {
            "quota_types": {"produce": {"scope": "cluster"}},
            "clients": [{"user": "alice", "producer_byte_rate": 10**6}],
        },
        events,
    )
    assert [d["rate"] for d in per_broker.decisions] == [100.0, 100.0, 100.0]
    assert [d["rate"] for d in cluster.decisions] == [100.0, 200.0, 300.0]
    assert {d["entity"] for d in cluster.decisions} == {"user=alice"}


def test_simple_rate_and_rate_differ_for_a_fresh_entity(replay_cli: ReplayRunner) -> None:
    """5000 B against 1000 B/s: produce (Rate) divides by 10.2 s, copy (SimpleRate) by 1 s."""
    config = {
        "clients": [{"client_id": DEFAULT, "producer_byte_rate": 1000}],
        "brokers": {DEFAULT: {"remote.log.manager.copy.max.bytes.per.second": 1000}},
    }
    run = replay_cli(
        config, [produce("a", "c", 5000, BASE + 200), remote("remote_copy", 1, 5000, BASE + 200)]
    )
    client, copy = run.decisions
    assert (client["window_ms"], client["throttle_ms"]) == (10_200, 0)
    assert client["rate"] == pytest.approx(5000 / 10.2)
    assert (copy["window_ms"], copy["rate"], copy["entity"]) == (1000, 5000.0, "broker=1")
    assert copy["throttle_ms"] == 4000  # the next upload waits (5000 - 1000) / 1000 * 1 s


def test_remote_fetch_skips_remote_data_while_over_quota(replay_cli: ReplayRunner) -> None:
    config = {"brokers": {DEFAULT: {"remote.log.manager.fetch.max.bytes.per.second": 1000}}}
    run = replay_cli(
        config,
        [remote("remote_fetch", 1, 900, BASE), remote("remote_fetch", 1, 900, BASE + 100)],
    )
    assert [d["skip_remote"] for d in run.decisions] == [False, True]


def test_per_broker_override_beats_the_default(replay_cli: ReplayRunner) -> None:
    config = {
        "brokers": {
            DEFAULT: {"remote.log.manager.copy.max.bytes.per.second": 1000},
            2: {"remote.log.manager.copy.max.bytes.per.second": 9000},
        }
    }
    run = replay_cli(
        config, [remote("remote_copy", 1, 5000, BASE), remote("remote_copy", 2, 5000, BASE)]
    )
    assert [(d["entity"], d["limit"], d["exceeded"]) for d in run.decisions] == [
        ("broker=1", 1000, True),
        ("broker=2", 9000, False),
    ]


KIP73_CONFIG: dict[str, Any] = {
    "brokers": {DEFAULT: {"leader.replication.throttled.rate": 1000}},
    "topics": {"orders": {"leader.replication.throttled.replicas": "0:1"}},
}


def test_kip73_in_sync_replicas_count_but_are_never_left_out(replay_cli: ReplayRunner) -> None:
    events = [
        replication(1, "leader", "orders", 0, replica=2, in_sync=False, nbytes=800, ts=BASE),
        # In sync: its bytes push the throttled rate over the limit, yet it is not left out.
        replication(1, "leader", "orders", 0, replica=3, in_sync=True, nbytes=800, ts=BASE + 100),
        # Out of sync while over: left out.
        replication(1, "leader", "orders", 0, replica=2, in_sync=False, nbytes=0, ts=BASE + 200),
        # Partition 1 is not throttled: never left out, and its bytes do not count.
        replication(1, "leader", "orders", 1, replica=2, in_sync=False, nbytes=5000, ts=BASE + 300),
    ]
    run = replay_cli(KIP73_CONFIG, events)
    assert [d["rate"] for d in run.decisions] == [800.0, 1600.0, 1600.0, 1600.0]
    assert [d["exceeded"] for d in run.decisions] == [False, True, True, True]
    assert [d["throttled"] for d in run.decisions] == [True, True, True, False]
    assert [d["leave_out"] for d in run.decisions] == [False, False, True, False]
    # Replication delays nobody; throttle_ms only says how long the rate stays over (600 ms).
    assert run.decisions[2]["throttle_ms"] == round((1600 - 1000) / 1000 * 1000)


def test_a_broker_wide_replication_count_counts_while_its_side_has_a_throttled_list(
    replay_cli: ReplayRunner,
) -> None:
    """A broker's replication counter names no partition or replica (docs/events.md): its bytes
    are taken as the throttled replicas' while any topic lists some for its side, and as no
    quota's otherwise, as the follower records only throttled partitions."""

    def broker_wide(role: str, nbytes: int, ts: int) -> dict[str, Any]:
        return {"kind": "replication", "broker": 1, "role": role, "bytes": nbytes, "ts": ts}

    run = replay_cli(
        KIP73_CONFIG,
        [
            broker_wide("leader", 800, BASE),
            broker_wide("leader", 800, BASE + 100),
            broker_wide("follower", 800, BASE + 200),
        ],
    )
    assert [(d["quota"], d.get("exceeded"), d.get("leave_out")) for d in run.decisions] == [
        ("leader_replication", False, False),
        ("leader_replication", True, True),  # no replica is known to be in sync
        (None, None, None),  # no topic lists follower replicas: no quota's bytes
    ]


def test_a_per_topic_remote_fetch_count_measures_the_brokers_quota(
    replay_cli: ReplayRunner,
) -> None:
    config = {"brokers": {DEFAULT: {"remote.log.manager.fetch.max.bytes.per.second": 1000}}}
    per_topic = {"kind": "remote_fetch", "broker": 1, "topic": "orders", "bytes": 900}
    run = replay_cli(config, [per_topic | {"ts": BASE}, per_topic | {"ts": BASE + 100}])
    assert [(d["entity"], d["skip_remote"]) for d in run.decisions] == [
        ("broker=1", False),
        ("broker=1", True),
    ]


def test_kip73_lists_apply_per_role_and_broker(replay_cli: ReplayRunner) -> None:
    config = {
        "brokers": {DEFAULT: {"follower.replication.throttled.rate": 10}},
        "topics": {
            "orders": {"leader.replication.throttled.replicas": "0:1"},
            "audit": {"follower.replication.throttled.replicas": "*"},
        },
    }
    events = [
        replication(2, "follower", "orders", 0, 2, False, 500, BASE),  # orders: leader list only
        replication(2, "follower", "audit", 7, 2, False, 500, BASE),  # wildcard: any partition
        replication(1, "leader", "orders", 0, 2, False, 500, BASE),  # leader rate unlimited
    ]
    run = replay_cli(config, events)
    assert [(d["quota"], d.get("throttled"), d.get("leave_out")) for d in run.decisions] == [
        (None, None, None),  # the follower does not record an unthrottled partition
        ("follower_replication", True, True),
        ("leader_replication", True, False),
    ]


def test_kip73_a_follower_records_only_throttled_partitions(replay_cli: ReplayRunner) -> None:
    """``ReplicaFetcherThread`` records fetched bytes only for throttled partitions: a fetch of
    an unthrottled one does not open the SimpleRate window, which then starts at the first
    throttled fetch (one window: 5000 B/s here, not 5000 B over 5 s)."""
    config = {
        "brokers": {DEFAULT: {"follower.replication.throttled.rate": 1000}},
        "topics": {"audit": {"follower.replication.throttled.replicas": "*"}},
    }
    events = [
        replication(2, "follower", "orders", 0, 2, False, 9000, BASE),
        replication(2, "follower", "audit", 7, 2, False, 5000, BASE + 4000),
        replication(2, "follower", "orders", 1, 2, False, 9000, BASE + 4500),
        replication(2, "follower", "audit", 3, 2, False, 0, BASE + 4600),
    ]
    run = replay_cli(config, events)
    assert [d["quota"] for d in run.decisions] == [
        None,
        "follower_replication",
        None,
        "follower_replication",
    ]
    assert [run.decisions[i]["rate"] for i in (1, 3)] == [5000.0, 5000.0]
    assert [run.decisions[i]["window_ms"] for i in (1, 3)] == [1000, 1000]
    assert run.decisions[3]["leave_out"] is True


def test_zero_byte_events_probe_the_rate(replay_cli: ReplayRunner) -> None:
    config = {"clients": [{"user": "alice", "producer_byte_rate": 100}]}
    run = replay_cli(
        config,
        [
            produce("alice", "a", 5000, BASE),
            produce("alice", "a", 0, BASE + 5000),
            produce("alice", "a", 0, BASE + 20_000),
        ],
    )
    assert [d["rate"] for d in run.decisions] == [500.0, 500.0, 0.0]
    assert [d["throttle_ms"] > 0 for d in run.decisions] == [True, True, False]


def test_entity_names_are_escaped_so_keys_split_back(replay_cli: ReplayRunner) -> None:
    config = {"clients": [{"user": "<default>", "client_id": "<default>", "producer_byte_rate": 1}]}
    run = replay_cli(config, [produce("CN=a,O=b", "100%", 1, BASE), produce("plain", "c", 1, BASE)])
    assert [d["entity"] for d in run.decisions] == [
        "user=CN%3Da%2CO%3Db,client-id=100%25,broker=1",
        "user=plain,client-id=c,broker=1",
    ]


# Kafka's SampledStatTest and RateTest (clients/.../metrics/stats), through replay: a produce
# quota with the tests' MetricConfig, records of 1 B, and a 0 B record to measure at a time.
def sampled_config(samples: int, window_s: int) -> dict[str, Any]:
    return {
        "quota_types": {"produce": {"samples": samples, "window_ms": window_s * 1000}},
        "clients": [{"user": "alice", "producer_byte_rate": 10**9}],
    }


def complete_sample(at: int, window_ms: int = 1000) -> list[dict[str, Any]]:
    """SampledStatTest.completeSample: events at a sample's start and end."""
    return [produce("alice", "a", 1, at), produce("alice", "a", 1, at + window_ms - 1)]


@pytest.mark.parametrize(
    ("events", "measured_at", "window_bytes", "window_ms"),
    [
        # testSampleIsPurgedIfDoesntOverlap: 2 x 1 s, measured 2.5 s after the sample.
        (complete_sample(BASE), BASE + 3500, 0, 1500),
        # testSampleIsKeptIfOverlaps: measured 1.5 s after it, its last event is 1.501 s old.
        (complete_sample(BASE), BASE + 2500, 2, 2500),
        # testSampleIsKeptIfOverlapsAndExtra: three samples at 2.2 s, the first one overlapping.
        (
            [
                *complete_sample(BASE),
                *complete_sample(BASE + 1100),
                produce("alice", "a", 1, BASE + 2200),
            ],
            BASE + 2200,
            5,
            2200,
        ),
    ],
)
def test_sampled_stat_keeps_a_sample_while_its_last_event_overlaps_the_window(
    replay_cli: ReplayRunner,
    events: list[dict[str, Any]],
    measured_at: int,
    window_bytes: int,
    window_ms: int,
) -> None:
    run = replay_cli(sampled_config(2, 1), [*events, produce("alice", "a", 0, measured_at)])
    last = run.decisions[-1]
    assert last["window_ms"] == window_ms
    assert last["rate"] == pytest.approx(window_bytes / window_ms * 1000)


@pytest.mark.parametrize(("samples", "window_s"), [(1, 1), (1, 11), (11, 1), (11, 11)])
def test_rate_with_no_prior_samples_assumes_samples_minus_one_empty_ones(
    replay_cli: ReplayRunner, samples: int, window_s: int
) -> None:
    """RateTest.testRateWithNoPriorAvailableSamples: 50 B, measured just before the window ends
    (the record opens its sample: at an aligned time here)."""
    measured = window_s * 1000 - 1
    start = BASE - BASE % (window_s * 1000)
    run = replay_cli(
        sampled_config(samples, window_s),
        [produce("alice", "a", 50, start), produce("alice", "a", 0, start + measured)],
    )
    expected = 50 / (measured / 1000 + (samples - 1) * window_s)
    assert run.decisions[-1]["rate"] == pytest.approx(expected, abs=1e-6)


def test_rate_is_consistent_after_the_first_window(replay_cli: ReplayRunner) -> None:
    """RateTest.testRateIsConsistentAfterTheFirstWindow: an event every ~100 ms, a 101 ms gap,
    then every rate measured in the second window is 10-11 events/s (here bytes/s)."""
    steps = [0, 99, *[100] * 9]
    events, now = [], BASE
    for window_start in (0, 1):
        now += 101 * window_start
        for step in steps:
            now += step
            events.append(produce("alice", "a", 1, now))
    run = replay_cli(sampled_config(2, 1), events)
    second = [d["rate"] for d in run.decisions[len(steps) :]]
    assert len(second) == len(steps)
    assert all(10 <= rate <= 11 for rate in second), second
