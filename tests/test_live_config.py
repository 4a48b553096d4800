"""The live configuration (``state/live_config.py``) without a broker: each kind of change as a
partial update, the records skipped and why, and versions that are the same however, in whatever
order and how often they are read."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from state.config import QuotaConfig, parse_quota_config
from state.configfile import ConfigError
from state.live_config import (
    BROKER_KEYS,
    CLIENT_KEYS,
    TOPIC_KEYS,
    Change,
    DeleteClientQuota,
    LiveConfig,
    LiveConfigs,
    Mode,
    SetBrokerQuota,
    SetClientQuota,
    SetEnforcement,
    SetTopicThrottles,
    SkippedChange,
    apply_change,
    client_entity_name,
    config_document,
    decision_mode,
    decode_change,
    describe_change,
    encode_change,
)
from state.quota_types import QuotaType

LEADER_RATE = "leader.replication.throttled.rate"
FOLLOWER_RATE = "follower.replication.throttled.rate"
LEADER_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_REPLICAS = "follower.replication.throttled.replicas"

BASE = parse_quota_config(
    {
        "clients": [
            {"user": "alice", "producer_byte_rate": 1000, "consumer_byte_rate": 2000},
            {"user": "<default>", "producer_byte_rate": 500},
            {"user": "bob", "client_id": "app1", "exempt": True},
        ],
        "brokers": {"<default>": {LEADER_RATE: 1e6}},
        "topics": {"orders": {LEADER_REPLICAS: "0:101"}},
    },
    "base quota file",
)


def client_keys(config: QuotaConfig, user: str | None, client_id: str | None = None) -> Any:
    """The keys an entity sets in ``config``'s document; None when it has no entry."""
    for entry in config_document(config).get("clients", []):
        if (entry.get("user"), entry.get("client_id")) == (user, client_id):
            return {k: v for k, v in entry.items() if k not in ("user", "client_id")}
    return None


@pytest.mark.parametrize(
    ("enabled", "shadow", "exempt", "mode"),
    [
        (False, {QuotaType.PRODUCE}, True, Mode.DISABLED),
        (False, set(), False, Mode.DISABLED),
        (True, {QuotaType.PRODUCE}, True, Mode.SHADOW),
        (True, {QuotaType.PRODUCE}, False, Mode.SHADOW),
        (True, {QuotaType.FETCH}, True, Mode.EXEMPT),
        (True, {QuotaType.FETCH}, False, Mode.ENFORCED),
    ],
)
def test_a_decisions_mode_is_disabled_before_shadow_before_exempt(
    enabled: bool, shadow: set[QuotaType], exempt: bool, mode: Mode
) -> None:
    config = parse_quota_config(
        {"enforcement": {"enabled": enabled, "shadow": sorted(shadow)}}, "enforcement"
    )
    assert decision_mode(config, QuotaType.PRODUCE, exempt) is mode


def test_setting_a_client_key_keeps_the_entitys_other_keys_and_a_new_entity_is_added() -> None:
    changed = apply_change(BASE, SetClientQuota(user="alice", values={"consumer_byte_rate": 3e3}))
    assert client_keys(changed, "alice") == {"producer_byte_rate": 1000, "consumer_byte_rate": 3e3}
    added = apply_change(
        changed, SetClientQuota(user="carol", client_id="app1", values={"producer_byte_rate": 10.0})
    )
    assert client_keys(added, "carol", "app1") == {"producer_byte_rate": 10.0}
    assert client_keys(added, "alice") == client_keys(changed, "alice")
    assert client_keys(added, "<default>") == {"producer_byte_rate": 500}


def test_exempting_an_entity_replaces_its_rates_and_a_rate_ends_its_exemption() -> None:
    exempt = apply_change(BASE, SetClientQuota(user="alice", values={"exempt": True}))
    assert client_keys(exempt, "alice") == {"exempt": True}
    rated = apply_change(exempt, SetClientQuota(user="alice", values={"consumer_byte_rate": 7.0}))
    assert client_keys(rated, "alice") == {"consumer_byte_rate": 7.0}
    # ``exempt: false`` ends an exemption too, as the rate set with it does.
    unexempt = apply_change(
        exempt, SetClientQuota(user="alice", values={"exempt": False, "producer_byte_rate": 5.0})
    )
    assert client_keys(unexempt, "alice") == {"producer_byte_rate": 5.0}


def test_deleting_client_keys_removes_only_those_and_the_entity_with_its_last_key() -> None:
    fewer = apply_change(BASE, DeleteClientQuota(user="alice", keys=["consumer_byte_rate"]))
    assert client_keys(fewer, "alice") == {"producer_byte_rate": 1000}
    gone = apply_change(fewer, DeleteClientQuota(user="alice", keys=["producer_byte_rate"]))
    assert client_keys(gone, "alice") is None
    whole = apply_change(BASE, DeleteClientQuota(user="alice"))
    assert client_keys(whole, "alice") is None
    assert client_keys(whole, "<default>") == {"producer_byte_rate": 500}


def test_a_broker_key_is_set_by_a_number_and_removed_by_null_and_an_emptied_broker_goes() -> None:
    added = apply_change(BASE, SetBrokerQuota(broker=3, values={FOLLOWER_RATE: 2e6}))
    assert config_document(added)["brokers"] == {
        "<default>": {LEADER_RATE: 1e6},
        "3": {FOLLOWER_RATE: 2e6},
    }
    removed = apply_change(added, SetBrokerQuota(broker=3, values={FOLLOWER_RATE: None}))
    assert config_document(removed)["brokers"] == {"<default>": {LEADER_RATE: 1e6}}
    default_changed = apply_change(
        BASE, SetBrokerQuota(broker="<default>", values={LEADER_RATE: 5.0, FOLLOWER_RATE: 6.0})
    )
    assert config_document(default_changed)["brokers"] == {
        "<default>": {LEADER_RATE: 5.0, FOLLOWER_RATE: 6.0}
    }


def test_a_topic_throttle_is_set_and_removed_by_the_empty_list_and_an_emptied_topic_goes() -> None:
    both = apply_change(BASE, SetTopicThrottles(topic="orders", values={FOLLOWER_REPLICAS: "*"}))
    assert config_document(both)["topics"] == {
        "orders": {LEADER_REPLICAS: "0:101", FOLLOWER_REPLICAS: "*"}
    }
    one = apply_change(both, SetTopicThrottles(topic="orders", values={LEADER_REPLICAS: ""}))
    assert config_document(one)["topics"] == {"orders": {FOLLOWER_REPLICAS: "*"}}
    none = apply_change(one, SetTopicThrottles(topic="orders", values={FOLLOWER_REPLICAS: ""}))
    assert "topics" not in config_document(none)


def test_enforcement_switches_change_only_what_they_name() -> None:
    off = apply_change(BASE, SetEnforcement(enabled=False, shadow={"produce": True}))
    assert off.enforcement.enabled is False
    assert off.enforcement.shadow == {QuotaType.PRODUCE}
    more = apply_change(off, SetEnforcement(shadow={"fetch": True}))
    assert more.enforcement.enabled is False
    assert more.enforcement.shadow == {QuotaType.PRODUCE, QuotaType.FETCH}
    back = apply_change(more, SetEnforcement(enabled=True, shadow={"produce": False}))
    assert back.enforcement.enabled is True
    assert back.enforcement.shadow == {QuotaType.FETCH}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            SetClientQuota(user="alice", values={"request_percentage": 5.0}),
            "'request_percentage' is not a client quota key (one of producer_byte_rate, "
            "consumer_byte_rate, exempt)",
        ),
        (
            DeleteClientQuota(user="alice", keys=["exemption"]),
            "'exemption' is not a client quota key",
        ),
        (DeleteClientQuota(user="carol", client_id="app9"), "no quota is set for user=carol"),
        (
            SetBrokerQuota(broker=1, values={"producer_byte_rate": 1.0}),
            "'producer_byte_rate' is not a broker quota key",
        ),
        (
            SetTopicThrottles(topic="orders", values={LEADER_RATE: "*"}),
            f"'{LEADER_RATE}' is not a topic throttle key",
        ),
        (
            SetEnforcement(shadow={"requests": True}),
            "shadow: unknown quota type 'requests' (one of produce, fetch, remote_copy",
        ),
        # Each value is checked by the quota file's own validation, which names the change.
        (
            SetClientQuota(user="alice", values={"producer_byte_rate": -1.0}),
            "after set user=alice: producer_byte_rate=-1.0: clients[0].producer_byte_rate",
        ),
        (
            SetClientQuota(user="bob", values={"exempt": False}),
            "sets neither producer_byte_rate nor consumer_byte_rate (nor exempt)",
        ),
        (
            SetTopicThrottles(topic="orders", values={FOLLOWER_REPLICAS: "every"}),
            "entry 'every' is not 'partition:broker'",
        ),
    ],
)
def test_a_change_that_cannot_apply_says_why(change: Change, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        apply_change(BASE, change)


def test_the_configuration_is_validated_as_a_whole_after_a_change() -> None:
    # Each broker value is valid alone; a cluster-scoped quota type forbids any broker override.
    cluster = parse_quota_config(
        {"quota_types": {"leader_replication": {"scope": "cluster"}}}, "cluster scope"
    )
    with pytest.raises(ConfigError, match="scope is 'cluster'"):
        apply_change(cluster, SetBrokerQuota(broker=1, values={LEADER_RATE: 10.0}))


@pytest.mark.parametrize(
    ("change", "line"),
    [
        (
            SetClientQuota(user="alice", client_id="app1", values={"producer_byte_rate": 1e3}),
            "set user=alice,client-id=app1: producer_byte_rate=1000.0",
        ),
        (DeleteClientQuota(client_id="app1"), "delete client-id=app1: every key"),
        (DeleteClientQuota(client_id="app1", keys=[]), "delete client-id=app1: no key"),
        (
            DeleteClientQuota(user="alice", keys=["exempt", "consumer_byte_rate"]),
            "delete user=alice: exempt, consumer_byte_rate",
        ),
        (
            SetBrokerQuota(broker="<default>", values={LEADER_RATE: 5.0, FOLLOWER_RATE: None}),
            f"set broker <default>: {LEADER_RATE}=5.0, {FOLLOWER_RATE}=(removed)",
        ),
        (
            SetTopicThrottles(topic="orders", values={LEADER_REPLICAS: ""}),
            f"set topic orders: {LEADER_REPLICAS}=''",
        ),
        (
            SetEnforcement(enabled=False, shadow={"fetch": True}),
            "set enforcement: enabled=False, shadow.fetch=True",
        ),
        (SetEnforcement(shadow={"produce": False}), "set enforcement: shadow.produce=False"),
    ],
)
def test_a_change_is_described_in_one_line(change: Change, line: str) -> None:
    assert describe_change(change) == line


@pytest.mark.parametrize(
    ("user", "client_id", "name"),
    [
        ("alice", "app1", "user=alice,client-id=app1"),
        ("alice", None, "user=alice"),
        (None, "<default>", "client-id=<default>"),
        (None, None, "(no entity)"),
    ],
)
def test_a_client_entity_is_named_as_kafka_names_it(
    user: str | None, client_id: str | None, name: str
) -> None:
    assert client_entity_name(user, client_id) == name


@pytest.mark.parametrize(
    "record",
    [
        b"not json",
        b'{"op": "set_everything", "values": {}}',
        b'{"op": "set_client", "user": "alice", "values": {}, "reason": "typo"}',
        b'{"op": "set_broker", "values": {}}',
        b'{"op": "set_client", "user": 7, "values": {}}',
    ],
)
def test_an_unreadable_record_is_a_config_error(record: bytes) -> None:
    with pytest.raises(ConfigError, match=r"^unreadable change: "):
        decode_change(record)


# Strategies: names from small sets so that changes meet the same entities. Some changes cannot
# apply (no entity, deleting one that is not there, an unknown quota type, a replica list that
# does not parse) and some records are not changes at all: the log must skip those.
users = st.sampled_from([None, "alice", "bob", "<default>"])
client_ids = st.sampled_from([None, "app1", "<default>"])
rates = st.floats(min_value=1e-3, max_value=1e12)
audit = {"at_ms": st.integers(0, 2**62), "by": st.text(max_size=8)}
change_kinds: list[st.SearchStrategy[Change]] = [
    st.builds(
        SetClientQuota,
        user=users,
        client_id=client_ids,
        values=st.dictionaries(st.sampled_from(CLIENT_KEYS[:2]), rates, min_size=1)
        | st.fixed_dictionaries({"exempt": st.booleans()}),
        **audit,
    ),
    st.builds(
        DeleteClientQuota,
        user=users,
        client_id=client_ids,
        keys=st.none() | st.lists(st.sampled_from(CLIENT_KEYS), min_size=1, unique=True),
        **audit,
    ),
    st.builds(
        SetBrokerQuota,
        broker=st.integers(0, 3) | st.just("<default>"),
        values=st.dictionaries(st.sampled_from(BROKER_KEYS), st.none() | rates, max_size=2),
        **audit,
    ),
    st.builds(
        SetTopicThrottles,
        topic=st.sampled_from(["orders", "logs"]),
        values=st.dictionaries(
            st.sampled_from(TOPIC_KEYS), st.sampled_from(["", "*", "0:101", "0:101,1:102", "0:x"])
        ),
        **audit,
    ),
    st.builds(
        SetEnforcement,
        enabled=st.none() | st.booleans(),
        shadow=st.dictionaries(st.sampled_from([*QuotaType, "requests"]), st.booleans()),
        **audit,
    ),
]
changes = st.one_of(change_kinds)
#: A log: changes of each kind, and as often a record that is no change at all.
records = st.lists(
    st.one_of(
        [*(kind.map(encode_change) for kind in change_kinds), st.sampled_from([b"", b"[1]"])]
    ),
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(change=changes)
def test_a_change_reads_back_as_written(change: Change) -> None:
    assert decode_change(encode_change(change)) == change


def target(change: Change) -> tuple[object, ...]:
    """What a change writes to: one client entity, broker, topic, or the enforcement switches."""
    if isinstance(change, SetClientQuota | DeleteClientQuota):
        return ("client", change.user, change.client_id)
    if isinstance(change, SetBrokerQuota):
        return ("broker", str(change.broker))
    if isinstance(change, SetTopicThrottles):
        return ("topic", change.topic)
    return ("enforcement",)


def applied(config: QuotaConfig, changes: Sequence[Change]) -> object:
    """The configuration after ``changes``, its clients in entity order; "refused" if one was."""
    try:
        for change in changes:
            config = apply_change(config, change)
    except ConfigError:
        return "refused"
    # Compared as configurations: the order of the clients is the order they were added in.
    clients = sorted(config.clients, key=lambda client: repr(client.entity))
    return clients, config.model_copy(update={"clients": []})


@settings(max_examples=300, deadline=None)
@given(first=changes, second=changes)
def test_changes_to_different_entities_apply_in_either_order_alike(
    first: Change, second: Change
) -> None:
    assume(target(first) != target(second))
    assert applied(BASE, [first, second]) == applied(BASE, [second, first])


@settings(max_examples=200, deadline=None)
@given(log=records)
def test_every_version_is_a_valid_configuration_that_its_document_reproduces(
    log: list[bytes],
) -> None:
    live = LiveConfig(0, BASE)
    for record in log:
        live = live.advanced([record])
        assert parse_quota_config(config_document(live.config), "document") == live.config


def test_equal_configurations_publish_equal_documents_whatever_the_hash_seed() -> None:
    """Agents compare what the engine published: a set written in its iteration order (which
    follows ``PYTHONHASHSEED`` for strings) would differ between two processes."""
    program = (
        "import json; from state.config import parse_quota_config; "
        "from state.live_config import config_document; "
        "shadow = ['produce', 'fetch', 'remote_copy', 'remote_fetch', 'leader_replication']; "
        "config = parse_quota_config({'enforcement': {'shadow': shadow}}, 'test'); "
        "print(json.dumps(config_document(config)))"
    )
    documents = {
        subprocess.run(
            [sys.executable, "-c", program],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in range(6)
    }
    assert len(documents) == 1


def test_a_default_configuration_is_an_empty_document() -> None:
    assert config_document(parse_quota_config({}, "empty")) == {}


def test_a_skipped_record_keeps_its_version_and_reason_and_the_records_after_it_apply() -> None:
    log = [
        encode_change(SetClientQuota(user="bob", values={"producer_byte_rate": 10.0})),
        b"garbage",
        encode_change(SetClientQuota(user="alice", values={"producer_byte_rate": 0.0})),
        encode_change(SetBrokerQuota(broker=1, values={FOLLOWER_RATE: 2.0})),
    ]
    live = LiveConfig(0, BASE).advanced(log)
    assert live.version == 4
    assert [skipped.version for skipped in live.skipped] == [2, 3]
    assert live.skipped[0].reason.startswith("unreadable change: ")
    assert live.skipped[1].reason.startswith("after set user=alice: producer_byte_rate=0.0: ")
    assert client_keys(live.config, "bob") == {"producer_byte_rate": 10.0}
    assert client_keys(live.config, "alice") == client_keys(BASE, "alice")
    assert config_document(live.config)["brokers"]["1"] == {FOLLOWER_RATE: 2.0}


@settings(max_examples=200, deadline=None)
@given(log=records, cut=st.integers(0, 8))
def test_advancing_in_steps_reaches_the_same_version_as_in_one(log: list[bytes], cut: int) -> None:
    base = LiveConfig(0, BASE, (SkippedChange(0, "earlier"),))
    assert base.advanced(log[:cut]).advanced(log[cut:]) == base.advanced(log)


class Log:
    """A configuration log in memory that remembers which ranges were read."""

    def __init__(self, records: Sequence[bytes]) -> None:
        self.records = list(records)
        self.reads: list[tuple[int, int]] = []

    def read(self, start: int, end: int) -> Sequence[bytes]:
        self.reads.append((start, end))
        return self.records[start:end]


@settings(max_examples=200, deadline=None)
@given(log=records, asked=st.lists(st.integers(0, 8), max_size=12), keep=st.integers(1, 4))
def test_a_version_is_the_same_whenever_and_however_often_it_is_read(
    log: list[bytes], asked: list[int], keep: int
) -> None:
    configs = LiveConfigs(BASE, Log(log).read, keep=keep)
    for version in (v for v in asked if v <= len(log)):
        assert configs.at(version) == LiveConfig(0, BASE).advanced(log[:version])


def test_the_newest_version_is_moved_forward_and_an_evicted_one_rebuilt_from_the_base() -> None:
    log = Log(
        [encode_change(SetBrokerQuota(broker=b, values={LEADER_RATE: 1.0})) for b in range(8)]
    )
    configs = LiveConfigs(BASE, log.read, keep=2)
    assert configs.at(0) is configs.base
    configs.at(2)
    configs.at(5)
    configs.at(5)
    configs.at(6)  # keeps 5 and 6: 2 is evicted
    configs.at(2)
    assert log.reads == [(0, 2), (2, 5), (5, 6), (0, 2)]


def test_a_version_below_zero_or_past_the_log_is_refused() -> None:
    configs = LiveConfigs(BASE, Log([encode_change(SetEnforcement(enabled=False))]).read)
    with pytest.raises(ValueError, match="config versions start at 0, got -1"):
        configs.at(-1)
    with pytest.raises(LookupError, match=r"version 3 needs log records 0\.\.2, the log gave 1"):
        configs.at(3)
