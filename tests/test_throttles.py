"""The actuator's rule (quotastream/brokers/throttles.py): which of Kafka's throttle configs the
engine's configuration wants on a cluster, the changes that bring the cluster there, and when a
reassignment's throttle is done. The actuator on a real cluster is in tests/test_actuator.py."""

from __future__ import annotations

from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st

from quotastream.brokers.throttles import (
    COPY_RATE,
    FOLLOWER_RATE,
    FOLLOWER_REPLICAS,
    LEADER_RATE,
    LEADER_REPLICAS,
    Change,
    ConfigKey,
    Op,
    desired_lists,
    desired_rates,
    desired_throttles,
    move_complete,
    moves_to_judge,
    throttle_changes,
)
from state.config import QuotaConfig, ThrottledReplicas, parse_quota_config

BROKERS = [1, 2, 3]


def config(**document: Any) -> QuotaConfig:
    return parse_quota_config(document, "test")


def broker(broker_id: int, key: str) -> ConfigKey:
    return ConfigKey("broker", str(broker_id), key)


def topic(name: str, key: str) -> ConfigKey:
    return ConfigKey("topic", name, key)


def test_a_reassignment_throttle_sets_its_lists_and_every_brokers_replication_rates() -> None:
    wanted = desired_throttles(
        config(
            brokers={
                "<default>": {LEADER_RATE: 1_000_000, FOLLOWER_RATE: 1_000_000},
                3: {LEADER_RATE: 500.5},
            },
            topics={"orders": {LEADER_REPLICAS: "0:1,1:2", FOLLOWER_REPLICAS: "*"}},
        ),
        BROKERS,
    )
    assert wanted == {
        topic("orders", LEADER_REPLICAS): "0:1,1:2",
        topic("orders", FOLLOWER_REPLICAS): "*",
        **{broker(b, FOLLOWER_RATE): "1000000" for b in BROKERS},
        broker(1, LEADER_RATE): "1000000",
        broker(2, LEADER_RATE): "1000000",
        broker(3, LEADER_RATE): "500",  # whole bytes a second, as Kafka's LONG config
    }


def test_replication_rates_without_lists_are_not_set_they_would_throttle_nothing() -> None:
    rates = {"<default>": {LEADER_RATE: 1_000, COPY_RATE: 2_000}}
    assert desired_throttles(config(brokers=rates), BROKERS) == {
        broker(b, COPY_RATE): "2000" for b in BROKERS
    }


def test_replication_rates_wait_for_a_list_kafka_accepted() -> None:
    """The lists are applied first: a list Kafka refused (its topic does not exist) is not in
    place, and the rates it would need are not set."""
    wanted = config(
        brokers={"<default>": {LEADER_RATE: 1_000, COPY_RATE: 2_000}},
        topics={"orders": {LEADER_REPLICAS: "0:1"}},
    )
    assert desired_lists(wanted) == {topic("orders", LEADER_REPLICAS): "0:1"}
    copy = {broker(b, COPY_RATE): "2000" for b in BROKERS}
    assert desired_rates(wanted, BROKERS, lists_in_place=False) == copy
    assert desired_rates(wanted, BROKERS, lists_in_place=True) == copy | {
        broker(b, LEADER_RATE): "1000" for b in BROKERS
    }


def test_a_cluster_wide_limit_is_shared_evenly_by_the_brokers() -> None:
    wanted = desired_throttles(
        config(
            quota_types={"remote_copy": {"scope": "cluster"}},
            brokers={"<default>": {COPY_RATE: 3_000_000}},
        ),
        BROKERS,
    )
    assert wanted == {broker(b, COPY_RATE): "1000000" for b in BROKERS}


def test_a_quota_type_that_does_not_bind_sets_nothing_of_its_own() -> None:
    document = {
        "brokers": {"<default>": {LEADER_RATE: 1_000, FOLLOWER_RATE: 1_000, COPY_RATE: 2_000}},
        "topics": {"orders": {LEADER_REPLICAS: "*", FOLLOWER_REPLICAS: "*"}},
    }
    shadowed = desired_throttles(
        config(**document, enforcement={"shadow": ["leader_replication", "remote_copy"]}), BROKERS
    )
    assert shadowed == {
        topic("orders", FOLLOWER_REPLICAS): "*",
        **{broker(b, FOLLOWER_RATE): "1000" for b in BROKERS},
    }
    assert desired_throttles(config(**document, enforcement={"enabled": False}), BROKERS) == {}


def test_changes_set_what_differs_delete_what_it_set_and_leave_what_others_changed() -> None:
    a, b, c, d = (broker(1, key) for key in (LEADER_RATE, FOLLOWER_RATE, COPY_RATE, "x"))
    changes = throttle_changes(
        desired={a: "10", b: "20"},
        actual={a: "10", b: "5", c: "30", d: "40"},
        owned={a: "10", c: "30", d: "39"},
    )
    assert changes == [
        Change(b, Op.SET, "20"),
        Change(c, Op.DELETE),  # set by the actuator, no longer wanted
        Change(d, Op.FORGET),  # changed by someone else since: left alone
    ]


keys = st.builds(
    ConfigKey,
    st.sampled_from(["broker", "topic"]),
    st.sampled_from(["1", "2", "orders"]),
    st.sampled_from([LEADER_RATE, FOLLOWER_RATE, LEADER_REPLICAS]),
)
values = st.sampled_from(["1", "2", "*"])


@given(
    st.dictionaries(keys, values),
    st.dictionaries(keys, values),
    st.dictionaries(keys, values),
    st.sets(keys),
)
def test_after_its_changes_the_cluster_holds_what_is_wanted_and_nothing_it_set_besides(
    desired: dict[ConfigKey, str],
    actual: dict[ConfigKey, str],
    owned: dict[ConfigKey, str],
    refused: set[ConfigKey],
) -> None:
    """Whatever Kafka refuses (``refused``: a refused set leaves the key and its record as they
    were, a refused delete leaves it set and owned), every other change is made, and the next
    pass proposes the refused ones again, and nothing else."""
    after, now_owned = dict(actual), dict(owned)
    changes = throttle_changes(desired, actual, owned)
    for change in changes:
        if change.op is not Op.FORGET and change.key in refused:
            continue
        if change.op is Op.SET:
            assert change.value is not None
            after[change.key] = now_owned[change.key] = change.value
        elif change.op is Op.DELETE:
            del after[change.key]
            del now_owned[change.key]
        else:
            del now_owned[change.key]
    retried = [c for c in changes if c.op is not Op.FORGET and c.key in refused]
    assert throttle_changes(desired, after, now_owned) == retried
    if retried:
        return
    assert {key: after.get(key) for key in desired} == desired
    assert set(now_owned) <= set(desired) | set(owned)
    # What it owns and nobody wants any more is gone, unless someone else changed it.
    for key, value in owned.items():
        if key not in desired and actual.get(key) == value:
            assert key not in after
    # What it never set and nobody wants is left as it was.
    for key, value in actual.items():
        if key not in desired and key not in owned:
            assert after[key] == value


def test_a_move_is_complete_once_the_replicas_its_follower_list_names_are_in_place() -> None:
    follower = ThrottledReplicas.parse("0:2,1:3")
    assert not move_complete(follower, {0: [1], 1: [1]}, moving=False)  # not started
    assert not move_complete(follower, {0: [1, 2], 1: [1, 3]}, moving=True)  # running
    assert not move_complete(follower, {0: [2], 1: [1]}, moving=False)  # partition 1 to go
    assert not move_complete(follower, {0: [2]}, moving=False)  # no partition 1 to receive it
    assert move_complete(follower, {0: [2], 1: [3]}, moving=False)
    assert move_complete(follower, {0: [2, 1], 1: [3, 1]}, moving=False)  # a replica added
    # "*" names no move: only a pass that saw the topic being reassigned tells it ended.
    assert not move_complete(ThrottledReplicas.parse("*"), {0: [2]}, moving=False)


def test_only_a_follower_list_the_actuator_set_as_configured_is_judged() -> None:
    lists = {
        "set": {FOLLOWER_REPLICAS: "0:2"},
        "changed-since": {FOLLOWER_REPLICAS: "0:3"},
        "not-set-yet": {FOLLOWER_REPLICAS: "0:2"},
        "every-partition": {FOLLOWER_REPLICAS: "*"},
        "leader-only": {LEADER_REPLICAS: "0:1"},
    }
    owned = {
        topic("set", FOLLOWER_REPLICAS): "0:2",
        topic("changed-since", FOLLOWER_REPLICAS): "0:2",
        topic("every-partition", FOLLOWER_REPLICAS): "*",
        topic("leader-only", LEADER_REPLICAS): "0:1",
    }
    assert moves_to_judge(config(topics=lists), owned) == {"set": ThrottledReplicas.parse("0:2")}


assignments = st.lists(
    st.lists(st.integers(1, 5), min_size=1, max_size=3, unique=True), min_size=1, max_size=4
)


@given(assignments, assignments)
def test_a_planned_move_is_complete_after_it_and_neither_before_nor_while_it_runs(
    current: list[list[int]], target: list[list[int]]
) -> None:
    """A move planned as kafka-reassign-partitions plans it (the follower list: each partition's
    replicas the move adds), on Kafka's steps: before it starts the assignment is the current
    one; while it runs the partition holds both (and is being reassigned); after, the target."""
    partitions = range(min(len(current), len(target)))
    follower = ThrottledReplicas(
        replicas=frozenset((p, b) for p in partitions for b in target[p] if b not in current[p])
    )
    assume(follower.replicas)
    before = {p: current[p] for p in partitions}
    during = {p: target[p] + [b for b in current[p] if b not in target[p]] for p in partitions}
    after = {p: target[p] for p in partitions}
    assert not move_complete(follower, before, moving=False)
    assert not move_complete(follower, during, moving=True)
    assert move_complete(follower, after, moving=False)
