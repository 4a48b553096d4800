"""Which limit applies to whom, vectorised over many entities at once.

The rules are ``state.quota_rules``'s, walked for many clients: each precedence level's rates
(``ClientRates.by_level``) are looked up for every distinct (user, client-id) pair at once, and
the levels a pair finds, with whether its client-id is empty, pick its level and sharing through
``ClientRates.choose`` itself, called once per distinct combination (at most 2**9), not per
pair. Broker quotas call ``quota_rules.broker_limit`` once per distinct broker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt
import pandas as pd

from state.config import QuotaConfig, ThrottledReplicas, TopicThrottles
from state.quota_rules import (
    LEVELS,
    NO_LEVEL,
    UNLIMITED,
    ClientRates,
    Level,
    QuotaRules,
    Sharing,
    broker_limit,
    is_exempt,
)
from state.quota_types import QuotaType

__all__ = [
    "LEVELS",
    "NO_LEVEL",
    "UNLIMITED",
    "ClientPairs",
    "ClientResolution",
    "QuotaResolver",
    "Sharing",
]

FloatArray = npt.NDArray[np.float64]
Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
ObjectArray = npt.NDArray[np.object_]

#: A pair's combination: bit ``number`` set where level ``number`` configures a rate for it, bit 0
#: where its client-id is empty.
_COMBINATIONS = 2 ** (len(LEVELS) + 1)


@dataclass(frozen=True)
class ClientResolution:
    level: Int64Array  # 1..8 (the level whose quota is the limit), or NO_LEVEL
    limit: FloatArray  # bytes/s, inf where unlimited
    sharing: Int64Array  # Sharing: who shares the usage counter (Kafka's metric tags)
    #: The ``Mode`` value of this quota type's decisions for an entity not exempt, an exempt one.
    modes: tuple[str, str]

    @cached_property
    def exempt(self) -> BoolArray:
        return is_exempt(self.level, self.limit)

    @cached_property
    def mode(self) -> ObjectArray:
        """Each pair's ``Mode`` value."""
        not_exempt, exempt = self.modes
        return np.where(self.exempt, exempt, not_exempt).astype(object)


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
    """Rates configured at one precedence level, looked up for many pairs at once.

    A level keyed by user (or client-id) is looked up once per distinct user (or client-id);
    a level keyed by both only for pairs whose user appears at that level.
    """

    def __init__(self, level: Level, entries: dict[tuple[str | None, str | None], float]) -> None:
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
        """Rate per pair at this level, NaN where this level sets none."""
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


class _Chosen:
    """``ClientRates.choose`` of each combination a pair can have, as it is first met."""

    def __init__(self, rates: ClientRates) -> None:
        self._rates = rates
        self._known = np.zeros(_COMBINATIONS, dtype=np.bool_)
        self._level = np.full(_COMBINATIONS, NO_LEVEL, dtype=np.int64)
        self._sharing = np.zeros(_COMBINATIONS, dtype=np.int64)

    def of(self, combination: Int64Array) -> tuple[Int64Array, Int64Array]:
        met = np.zeros(_COMBINATIONS, dtype=np.bool_)
        met[combination] = True
        for new in np.flatnonzero(met & ~self._known).tolist():
            present = {level.number for level in LEVELS if new >> level.number & 1}
            self._level[new], self._sharing[new] = self._rates.choose(present, bool(new & 1))
            self._known[new] = True
        return self._level[combination], self._sharing[combination]


class QuotaResolver:
    """Resolves limits and throttled replicas from one :class:`QuotaConfig`."""

    def __init__(self, config: QuotaConfig) -> None:
        self.config = config
        self.rules = QuotaRules(config)
        self._client_levels = {
            quota_type: [
                _LevelLookup(level, rates)
                for level, rates in zip(LEVELS, client_rates.by_level, strict=True)
            ]
            for quota_type, client_rates in self.rules.client_rates.items()
        }
        self._chosen = {
            quota_type: _Chosen(rates) for quota_type, rates in self.rules.client_rates.items()
        }

    def client(self, quota_type: QuotaType, pairs: ClientPairs) -> ClientResolution:
        """Counter sharing, limit, the limit's level, exemption and mode for each distinct
        (user, client-id) pair (users are never empty; a client-id may be)."""
        rates = [lookup.lookup(pairs) for lookup in self._client_levels[quota_type]]
        combination = (pairs.clients == "")[pairs.client_of_pair].astype(np.int64)
        for number, at_level in enumerate(rates, start=1):
            combination |= (~np.isnan(at_level)).astype(np.int64) << number
        level, sharing = self._chosen[quota_type].of(combination)
        limit = np.full(len(pairs), UNLIMITED)
        for number, at_level in enumerate(rates, start=1):
            found = level == number
            limit[found] = at_level[found]
        not_exempt, exempt = self.rules.modes[quota_type]
        return ClientResolution(level, limit, sharing, modes=(not_exempt.value, exempt.value))

    def broker_limit(self, quota_type: QuotaType, brokers: Int64Array) -> FloatArray:
        """``quota_rules.broker_limit`` of each broker."""
        of_broker, distinct = pd.factorize(brokers)
        limits = [broker_limit(self.config, quota_type, int(broker))[0] for broker in distinct]
        result: FloatArray = np.array(limits, dtype=np.float64)[of_broker]
        return result

    def replica_throttled(
        self,
        leader: BoolArray,
        topics: ObjectArray,
        partitions: Int64Array,
        brokers: Int64Array,
    ) -> BoolArray:
        """Whether each (topic, partition) on the reporting broker is in its throttled list.

        ``leader`` selects the leader list, otherwise the follower list applies. A broker-wide
        count (no topic) is taken as throttled while any topic has a list of its side: its
        bytes are the replicas' the lists name, as far as the engine can tell (``docs/events.md``).
        """
        throttled = np.zeros(len(topics), dtype=np.bool_)
        broker_wide = pd.isna(topics)
        for is_leader, pick in ((True, _leader_list), (False, _follower_list)):
            rows = np.flatnonzero(leader == is_leader)
            if len(rows):
                throttled[rows] = _in_lists(
                    self.config.topics, pick, topics[rows], partitions[rows], brokers[rows]
                )
                wide = rows[broker_wide[rows]]
                throttled[wide] = _any_listed(self.config.topics, is_leader)
        return throttled


def _any_listed(topics_config: dict[str, TopicThrottles], leader: bool) -> bool:
    pick = _leader_list if leader else _follower_list
    return any(pick(throttles).text() for throttles in topics_config.values())


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
