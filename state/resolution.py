"""Which limit applies to whom, vectorised over many entities at once.

Client quotas follow Kafka's ``DefaultQuotaCallback`` (``docs/semantics.md`` §3) in its two
steps. ``quotaMetricTags`` names the usage counter: the first of the eight precedence levels with
a quota of the asked type decides who shares it, (user, client-id), user or client-id; when only
one kind of quota is configured for the type, every client is grouped by that kind, the unlimited
ones too. ``quotaLimit`` then reads the limit from those tags: an empty client-id in the tags
sends the lookup to the user's levels, whatever level matched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Literal

import numpy as np
import numpy.typing as npt
import pandas as pd

from state.config import DEFAULT, QuotaConfig, ThrottledReplicas, TopicThrottles
from state.quota_types import CLIENT_QUOTA_TYPES, QuotaType

FloatArray = npt.NDArray[np.float64]
Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
ObjectArray = npt.NDArray[np.object_]

UNLIMITED = float("inf")


class Sharing(IntEnum):
    """Who shares one usage counter under a precedence level."""

    USER_AND_CLIENT = 1
    USER = 2
    CLIENT = 3


#: What an entity names at one of its two levels: a name, ``<default>``, or nothing.
Slot = Literal["name", "default", "none"]


@dataclass(frozen=True)
class _Level:
    number: int
    user: Slot
    client: Slot
    sharing: Sharing


#: Kafka's precedence, first match wins (``DefaultQuotaCallback.quotaMetricTags``).
LEVELS = (
    _Level(1, "name", "name", Sharing.USER_AND_CLIENT),
    _Level(2, "name", "default", Sharing.USER_AND_CLIENT),
    _Level(3, "name", "none", Sharing.USER),
    _Level(4, "default", "name", Sharing.USER_AND_CLIENT),
    _Level(5, "default", "default", Sharing.USER_AND_CLIENT),
    _Level(6, "default", "none", Sharing.USER),
    _Level(7, "none", "name", Sharing.CLIENT),
    _Level(8, "none", "default", Sharing.CLIENT),
)
#: Level reported when no level sets the quota: unlimited, one counter per client-id.
NO_LEVEL = 0
SHARING_BY_LEVEL = np.array([Sharing.CLIENT] + [level.sharing for level in LEVELS], dtype=np.int64)
#: ``quotaLimit``: the levels looked up, in order, for the metric tags a counter has.
_LIMIT_LEVELS = {
    Sharing.USER_AND_CLIENT: (1, 2, 4, 5),
    Sharing.USER: (3, 6),
    Sharing.CLIENT: (7, 8),
}


class _Kind(IntEnum):
    """``ClientQuotaManager.QuotaTypes``: which kinds of client quota are configured."""

    USER_AND_CLIENT = 1
    USER = 2
    CLIENT = 3


#: ``quotaMetricTags`` without the walk: none or one kind of quota configured.
_SINGLE_KIND = {
    frozenset(): Sharing.CLIENT,
    frozenset({_Kind.CLIENT}): Sharing.CLIENT,
    frozenset({_Kind.USER}): Sharing.USER,
    frozenset({_Kind.USER_AND_CLIENT}): Sharing.USER_AND_CLIENT,
}


def _slot(name: str | None) -> Slot:
    return "none" if name is None else "default" if name == DEFAULT else "name"


@dataclass(frozen=True)
class ClientResolution:
    level: Int64Array  # 1..8 (the level whose quota is the limit), or NO_LEVEL
    limit: FloatArray  # bytes/s, inf where unlimited
    sharing: Int64Array  # Sharing: who shares the usage counter (Kafka's metric tags)


@dataclass(frozen=True)
class ClientPairs:
    """Distinct (user, client-id) pairs, as codes into the distinct users and client-ids."""

    users: ObjectArray
    clients: ObjectArray
    user_of_pair: Int64Array
    client_of_pair: Int64Array

    def __len__(self) -> int:
        return len(self.user_of_pair)


class _LevelLookup:
    """Limits configured at one precedence level, looked up for many pairs at once.

    A level keyed by user (or client-id) is looked up once per distinct user (or client-id);
    a level keyed by both only for pairs whose user appears at that level.
    """

    def __init__(self, level: _Level, entries: dict[tuple[str | None, str | None], float]) -> None:
        self.level = level
        self._scalar: float | None = None
        self._index: pd.Index | pd.MultiIndex | None = None
        self._users_at_level: pd.Index = pd.Index([], dtype=object)
        self._values = np.zeros(0, dtype=np.float64)
        named = [(user, client, rate) for (user, client), rate in entries.items()]
        if level.user != "name" and level.client != "name":
            self._scalar = named[0][2] if named else None
            return
        if not named:
            return
        if level.user == "name" and level.client == "name":
            self._index = pd.MultiIndex.from_tuples([(u, c) for u, c, _ in named])
            self._users_at_level = pd.Index(list({u for u, _, _ in named}), dtype=object)
        elif level.user == "name":
            self._index = pd.Index([u for u, _, _ in named], dtype=object)
        else:
            self._index = pd.Index([c for _, c, _ in named], dtype=object)
        self._values = np.array([rate for _, _, rate in named], dtype=np.float64)

    def lookup(self, pairs: ClientPairs) -> FloatArray:
        """Limit per pair at this level, NaN where this level sets none."""
        result = np.full(len(pairs), np.nan)
        if self._scalar is not None:
            result[:] = self._scalar
            return result
        if self._index is None:
            return result
        if isinstance(self._index, pd.MultiIndex):
            user_listed = self._users_at_level.get_indexer(pd.Index(pairs.users, dtype=object)) >= 0
            candidates = np.flatnonzero(user_listed[pairs.user_of_pair])
            probe = pd.MultiIndex.from_arrays(
                [
                    pairs.users[pairs.user_of_pair[candidates]],
                    pairs.clients[pairs.client_of_pair[candidates]],
                ]
            )
            position = np.asarray(self._index.get_indexer(probe))
            found = position >= 0
            result[candidates[found]] = self._values[position[found]]
            return result
        by_user = self.level.user == "name"
        names = pairs.users if by_user else pairs.clients
        code = pairs.user_of_pair if by_user else pairs.client_of_pair
        position = np.asarray(self._index.get_indexer(pd.Index(names, dtype=object)))[code]
        found = position >= 0
        result[found] = self._values[position[found]]
        return result


class QuotaResolver:
    """Resolves limits and throttled replicas from one :class:`QuotaConfig`."""

    def __init__(self, config: QuotaConfig) -> None:
        self.config = config
        self._client_levels: dict[QuotaType, list[_LevelLookup]] = {}
        self._kinds: dict[QuotaType, set[_Kind]] = {}
        for quota_type in CLIENT_QUOTA_TYPES:
            per_level: dict[int, dict[tuple[str | None, str | None], float]] = {
                level.number: {} for level in LEVELS
            }
            kinds: set[_Kind] = set()
            for quota in config.clients:
                rate = quota.rate_for(quota_type)
                if rate is None:
                    continue
                number = next(
                    level.number
                    for level in LEVELS
                    if (level.user, level.client) == (_slot(quota.user), _slot(quota.client_id))
                )
                per_level[number][quota.entity] = rate
                kinds.add(
                    _Kind.CLIENT
                    if quota.user is None
                    else _Kind.USER
                    if quota.client_id is None
                    else _Kind.USER_AND_CLIENT
                )
            self._client_levels[quota_type] = [
                _LevelLookup(level, per_level[level.number]) for level in LEVELS
            ]
            self._kinds[quota_type] = kinds

    def client(self, quota_type: QuotaType, pairs: ClientPairs) -> ClientResolution:
        """Counter sharing, limit and the limit's level for each distinct (user, client-id)
        pair (users are never empty; a client-id may be)."""
        limits = [lookup.lookup(pairs) for lookup in self._client_levels[quota_type]]
        sharing = self._metric_tags(quota_type, limits)
        empty_client = (pairs.clients == "")[pairs.client_of_pair]
        # quotaLimit: tags with an empty client-id are the user's (an empty user cannot occur).
        tags = np.where(empty_client & (sharing == Sharing.USER_AND_CLIENT), Sharing.USER, sharing)
        level = np.full(len(pairs), NO_LEVEL, dtype=np.int64)
        limit = np.full(len(pairs), UNLIMITED)
        for kind, numbers in _LIMIT_LEVELS.items():
            # Tags of only an empty client-id find no quota.
            asks = (tags == kind) & ~(empty_client & (kind == Sharing.CLIENT))
            for number in reversed(numbers):
                found = asks & ~np.isnan(limits[number - 1])
                level[found] = number
                limit[found] = limits[number - 1][found]
        return ClientResolution(level=level, limit=limit, sharing=tags)

    def _metric_tags(self, quota_type: QuotaType, limits: list[FloatArray]) -> Int64Array:
        """``quotaMetricTags``: whose usage each pair's counter holds."""
        size = len(limits[0])
        single = _SINGLE_KIND.get(frozenset(self._kinds[quota_type]))
        if single is not None:
            return np.full(size, single, dtype=np.int64)
        matched = np.full(size, NO_LEVEL, dtype=np.int64)
        # Walk from the lowest precedence up so that higher levels overwrite.
        for number in range(len(LEVELS), 0, -1):
            matched[~np.isnan(limits[number - 1])] = number
        result: Int64Array = SHARING_BY_LEVEL[matched]
        return result

    def broker_limit(self, quota_type: QuotaType, brokers: Int64Array) -> FloatArray:
        """Per-broker override, else the ``<default>`` entry, else unlimited."""
        default_entry = self.config.brokers.get(DEFAULT)
        default_rate = default_entry.rate_for(quota_type) if default_entry else None
        limit = np.full(len(brokers), UNLIMITED if default_rate is None else default_rate)
        overrides = {
            broker: rate
            for broker, quotas in self.config.brokers.items()
            if broker != DEFAULT and (rate := quotas.rate_for(quota_type)) is not None
        }
        if overrides:
            index = pd.Index(list(overrides), dtype=np.int64)
            values = np.array(list(overrides.values()), dtype=np.float64)
            position = np.asarray(index.get_indexer(pd.Index(brokers, dtype=np.int64)))
            found = position >= 0
            limit[found] = values[position[found]]
        return limit

    def replica_throttled(
        self,
        leader: BoolArray,
        topics: ObjectArray,
        partitions: Int64Array,
        brokers: Int64Array,
    ) -> BoolArray:
        """Whether each (topic, partition) on the reporting broker is in its throttled list.

        ``leader`` selects the leader list, otherwise the follower list applies.
        """
        throttled = np.zeros(len(topics), dtype=np.bool_)
        for is_leader, pick in ((True, _leader_list), (False, _follower_list)):
            rows = np.flatnonzero(leader == is_leader)
            if len(rows):
                throttled[rows] = _in_lists(
                    self.config.topics, pick, topics[rows], partitions[rows], brokers[rows]
                )
        return throttled


def _leader_list(throttles: TopicThrottles) -> ThrottledReplicas:
    return throttles.leader


def _follower_list(throttles: TopicThrottles) -> ThrottledReplicas:
    return throttles.follower


def _in_lists(
    topics_config: dict[str, TopicThrottles],
    pick: Callable[[TopicThrottles], ThrottledReplicas],
    topics: ObjectArray,
    partitions: Int64Array,
    brokers: Int64Array,
) -> BoolArray:
    wildcard = [
        name for name, throttles in topics_config.items() if pick(throttles).every_partition
    ]
    listed = [
        (name, partition, broker)
        for name, throttles in topics_config.items()
        for partition, broker in pick(throttles).replicas
    ]
    result = np.asarray(pd.Index(topics, dtype=object).isin(wildcard), dtype=np.bool_)
    if listed:
        index = pd.MultiIndex.from_tuples(listed)
        probe = pd.MultiIndex.from_arrays([topics, partitions, brokers])
        result |= np.asarray(index.get_indexer(probe)) >= 0
    return result
