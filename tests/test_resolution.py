"""The vectorised precedence resolver against a scalar transcription of Kafka's callback."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from state.config import DEFAULT, ClientQuota, QuotaConfig
from state.quota_types import QuotaType
from state.resolution import ClientPairs, QuotaResolver, Sharing

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
    user_code, user_names = pd.factorize(np.array(users, dtype=object))
    client_code, client_names = pd.factorize(np.array(clients, dtype=object))
    resolution = QuotaResolver(config).client(
        quota_type,
        ClientPairs(
            np.asarray(user_names, dtype=object),
            np.asarray(client_names, dtype=object),
            user_code.astype(np.int64),
            client_code.astype(np.int64),
        ),
    )
    expected = [kafka_precedence(config, quota_type, u, c) for u, c in pairs]
    assert resolution.level.tolist() == [level for level, _, _ in expected]
    assert resolution.limit.tolist() == [limit for _, limit, _ in expected]
    assert resolution.sharing.tolist() == [sharing for _, _, sharing in expected]
