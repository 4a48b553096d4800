"""The vectorised precedence resolver against a scalar transcription of Kafka's callback, and
the one-client form (``state.quota_rules``) against the rows form and the core."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from state.config import DEFAULT, ClientQuota, QuotaConfig
from state.core import QuotaCore
from state.events import parse_events
from state.quota_rules import QuotaRules
from state.quota_types import CLIENT_QUOTA_TYPES, QuotaType
from state.resolution import ClientPairs, QuotaResolver, Sharing
from tests.support.factories import BASE, produce

NAMES = ["alice", "bob", "carol"]
CLIENTS = ["app1", "app2", ""]


def kafka_precedence(
    config: QuotaConfig, quota_type: QuotaType, user: str, client: str
) -> tuple[int, float, Sharing]:
    """``DefaultQuotaCallback.quotaMetricTags`` then ``quotaLimit`` of its tags, one entity at a
    time, transcribed: the level whose quota is the limit, the limit, and the tags' sharing."""
    configured = {
        quota.entity: rate
        for quota in config.clients
        if (rate := quota.rate_for(quota_type)) is not None
    }
    kinds = {
        "client" if u is None else "user" if c is None else "user_client" for u, c in configured
    }
    if kinds <= {"client"}:
        tags = ("", client)
    elif kinds == {"user"}:
        tags = (user, "")
    elif kinds == {"user_client"}:
        tags = (user, client)
    else:
        ladder = [
            ((user, client), (user, client)),
            ((user, DEFAULT), (user, client)),
            ((user, None), (user, "")),
            ((DEFAULT, client), (user, client)),
            ((DEFAULT, DEFAULT), (user, client)),
            ((DEFAULT, None), (user, "")),
        ]
        tags = next((t for entity, t in ladder if entity in configured), ("", client))
    tag_user, tag_client = tags
    lookups: list[tuple[int, tuple[str | None, str | None]]]
    if tag_user and tag_client:
        lookups = [(1, (tag_user, tag_client)), (2, (tag_user, DEFAULT))]
        lookups += [(4, (DEFAULT, tag_client)), (5, (DEFAULT, DEFAULT))]
        sharing = Sharing.USER_AND_CLIENT
    elif tag_user:
        lookups, sharing = [(3, (tag_user, None)), (6, (DEFAULT, None))], Sharing.USER
    else:
        lookups = [(7, (None, tag_client)), (8, (None, DEFAULT))] if tag_client else []
        sharing = Sharing.CLIENT
    for level, entity in lookups:
        if entity in configured:
            return level, configured[entity], sharing
    return 0, float("inf"), sharing


entity_names = st.sampled_from([*NAMES, DEFAULT])
# Events may carry an empty client-id; a configured entity names a non-empty one or <default>.
client_names = st.sampled_from([*(c for c in CLIENTS if c), DEFAULT])
quotas = st.fixed_dictionaries(
    {
        "user": st.none() | entity_names,
        "client_id": st.none() | client_names,
        "producer_byte_rate": st.none() | st.integers(1, 10**6).map(float),
        "consumer_byte_rate": st.none() | st.integers(1, 10**6).map(float),
    }
)


def valid(quota: dict[str, float | str | None]) -> bool:
    has_entity = quota["user"] is not None or quota["client_id"] is not None
    rates = (quota["producer_byte_rate"], quota["consumer_byte_rate"])
    return has_entity and any(rate is not None for rate in rates)


@st.composite
def configs(draw: st.DrawFn) -> QuotaConfig:
    entries = draw(
        st.lists(quotas.filter(valid), max_size=12, unique_by=lambda q: (q["user"], q["client_id"]))
    )
    return QuotaConfig(clients=[ClientQuota.model_validate(entry) for entry in entries])


def client_pairs(users: Sequence[str], clients: Sequence[str]) -> ClientPairs:
    """One pair per row, users and client-ids coded as the core codes them."""
    user_code, user_names = pd.factorize(np.array(users, dtype=object))
    client_code, client_names = pd.factorize(np.array(clients, dtype=object))
    return ClientPairs(
        np.asarray(user_names, dtype=object),
        np.asarray(client_names, dtype=object),
        user_code.astype(np.int64),
        client_code.astype(np.int64),
    )


@settings(max_examples=300, deadline=None)
@given(
    config=configs(),
    quota_type=st.sampled_from([QuotaType.PRODUCE, QuotaType.FETCH]),
    pairs=st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(CLIENTS)), min_size=1),
)
def test_vectorised_resolution_matches_kafka(
    config: QuotaConfig, quota_type: QuotaType, pairs: list[tuple[str, str]]
) -> None:
    users, clients = zip(*pairs, strict=True)
    resolution = QuotaResolver(config).client(quota_type, client_pairs(users, clients))
    expected = [kafka_precedence(config, quota_type, u, c) for u, c in pairs]
    assert resolution.level.tolist() == [level for level, _, _ in expected]
    assert resolution.limit.tolist() == [limit for _, limit, _ in expected]
    assert resolution.sharing.tolist() == [sharing for _, _, sharing in expected]


# Names a counter key must escape, beside plain ones; events may carry an empty client-id.
KEYED_USERS = ["alice", "a,b=c%"]
KEYED_CLIENTS = ["app1", "x=y,%z", ""]
keyed_entities = st.fixed_dictionaries(
    {
        "user": st.none() | st.sampled_from([*KEYED_USERS, DEFAULT]),
        "client_id": st.none() | st.sampled_from([*(c for c in KEYED_CLIENTS if c), DEFAULT]),
        "producer_byte_rate": st.none() | st.integers(1, 10**6).map(float),
        "consumer_byte_rate": st.none() | st.integers(1, 10**6).map(float),
        "exempt": st.booleans(),
    }
).map(
    lambda entry: (
        {**entry, "producer_byte_rate": None, "consumer_byte_rate": None}
        if entry["exempt"]
        else entry
    )
)


def configurable(quota: dict[str, float | str | None]) -> bool:
    """An entity with a rate, or an exempt one."""
    has_entity = quota["user"] is not None or quota["client_id"] is not None
    return valid(quota) or (has_entity and bool(quota["exempt"]))


@st.composite
def rule_configs(draw: st.DrawFn) -> QuotaConfig:
    """Client quotas (exempt ones too), each client quota type's scope, and the switches that
    set a decision's mode."""
    entries = draw(
        st.lists(
            keyed_entities.filter(configurable),
            max_size=10,
            unique_by=lambda q: (q["user"], q["client_id"]),
        )
    )
    scopes = st.sampled_from(["broker", "cluster"])
    return QuotaConfig.model_validate(
        {
            "quota_types": {q.value: {"scope": draw(scopes)} for q in CLIENT_QUOTA_TYPES},
            "enforcement": {
                "enabled": draw(st.booleans()),
                "shadow": draw(st.frozensets(st.sampled_from(CLIENT_QUOTA_TYPES))),
            },
            "clients": entries,
        }
    )


@settings(max_examples=200, deadline=None)
@given(
    config=rule_configs(),
    quota_type=st.sampled_from(CLIENT_QUOTA_TYPES),
    clients=st.lists(
        st.tuples(st.sampled_from(KEYED_USERS), st.sampled_from(KEYED_CLIENTS), st.integers(0, 2)),
        min_size=1,
        max_size=8,
    ),
)
def test_the_one_client_form_agrees_with_the_rows_form_and_the_core(
    config: QuotaConfig, quota_type: QuotaType, clients: list[tuple[str, str, int]]
) -> None:
    rules = QuotaRules(config)
    one_by_one = [
        rules.client(quota_type, user, client, broker) for user, client, broker in clients
    ]

    users, client_ids, _ = zip(*clients, strict=True)
    rows = QuotaResolver(config).client(quota_type, client_pairs(users, client_ids))
    assert [(r.level, r.limit, r.sharing, r.exempt, r.mode.value) for r in one_by_one] == list(
        zip(
            rows.level.tolist(),
            rows.limit.tolist(),
            rows.sharing.tolist(),
            rows.exempt.tolist(),
            rows.mode.tolist(),
            strict=True,
        )
    )

    events = [
        {**produce(user, client, 0, BASE, broker), "kind": quota_type.value}
        for user, client, broker in clients
    ]
    parsed = parse_events([json.dumps(event).encode() for event in events])
    assert parsed.rejected.empty
    resolved = QuotaCore(config).resolve(parsed.accepted)
    assert [(r.entity, r.limit, r.level) for r in one_by_one] == list(
        zip(
            resolved["entity"].astype(str),
            resolved["limit"].tolist(),
            resolved["level"].tolist(),
            strict=True,
        )
    )


# Few enough that clients differing in one part only (the quota, the broker or a name) are common.
one_client_asks = st.tuples(
    st.sampled_from(CLIENT_QUOTA_TYPES),
    st.sampled_from(KEYED_USERS),
    st.sampled_from(KEYED_CLIENTS),
    st.sampled_from([None, 0, 1]),
)


@settings(max_examples=100, deadline=None)
@given(
    configs=st.tuples(rule_configs(), rule_configs()),
    clients=st.lists(one_client_asks, min_size=2, max_size=5, unique=True),
    data=st.data(),
)
def test_a_remembered_resolution_is_the_walk_of_its_own_rules_whatever_was_asked_before(
    configs: tuple[QuotaConfig, QuotaConfig],
    clients: list[tuple[QuotaType, str, str, int | None]],
    data: st.DataObject,
) -> None:
    # Two configurations asked in turn, as an agent's rules are when the live one changes; two
    # clients remembered each among up to five, so clients are answered from memory, forgotten,
    # and walked again.
    rules = [QuotaRules(config, remembered=2) for config in configs]
    ask = st.tuples(st.sampled_from(rules), st.sampled_from(clients))
    asks = data.draw(st.lists(ask, min_size=5, max_size=30))
    for asked, (quota_type, user, client, broker) in asks:
        assert asked.client(quota_type, user, client, broker) == asked.resolve(
            quota_type, user, client, broker
        )
    assert max(asked._remembered.cache_info().currsize for asked in rules) <= 2
