"""Which of Kafka's own throttle configs the engine's configuration wants on a cluster, and the
changes that bring the cluster there: the actuator's rule, pure (no Kafka, no Redis).

Kafka enforces replication (KIP-73) and remote-copy (KIP-956) quotas itself, from dynamic
configs: per broker ``leader.replication.throttled.rate``, ``follower.replication.throttled.rate``
and ``remote.log.manager.copy.max.bytes.per.second``; per topic the throttled-replica lists. The
configuration the engine decides with (``brokers:`` and ``topics:`` of the quota file and its
live changes, under Kafka's own names) is what should be set:

* a broker's rate is the limit the engine resolves for it (its override, else ``<default>``); a
  cluster-scoped limit is shared evenly by the brokers (Kafka's are per broker);
* a rate is set only while its quota type binds (enforcement on, the type not in shadow mode);
* a topic's lists, while their quota type binds; the replication rates only while some topic has
  a list to apply (a rate throttles nothing without one, and a reassignment's throttle is gone
  with its lists: nothing is left behind once the lists are removed).

What the actuator set is its own (``owned``): a key it set and no longer wants is deleted, unless
someone else has changed it since (then it is left alone, and no longer owned). Keys it never set
and does not want are not its business.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Literal

from state.config import QuotaConfig
from state.live_config import Mode, decision_mode
from state.quota_rules import broker_limit, per_broker
from state.quota_types import QuotaType

LEADER_RATE: Final = "leader.replication.throttled.rate"
FOLLOWER_RATE: Final = "follower.replication.throttled.rate"
COPY_RATE: Final = "remote.log.manager.copy.max.bytes.per.second"
LEADER_REPLICAS: Final = "leader.replication.throttled.replicas"
FOLLOWER_REPLICAS: Final = "follower.replication.throttled.replicas"

#: Each broker rate the actuator applies, and the quota type whose limit it is.
BROKER_RATES: Final = {
    LEADER_RATE: QuotaType.LEADER_REPLICATION,
    FOLLOWER_RATE: QuotaType.FOLLOWER_REPLICATION,
    COPY_RATE: QuotaType.REMOTE_COPY,
}
_REPLICATION_RATES: Final = (LEADER_RATE, FOLLOWER_RATE)


@dataclass(frozen=True, order=True)
class ConfigKey:
    """One dynamic config of one broker or topic."""

    resource: Literal["broker", "topic"]
    name: str  # the broker id, or the topic
    key: str

    def __str__(self) -> str:
        return f"{self.resource} {self.name} {self.key}"


class Op(StrEnum):
    SET = "set"
    DELETE = "delete"
    #: Someone else changed a key the actuator had set: no longer its own, left as it is.
    FORGET = "forget"


@dataclass(frozen=True, order=True)
class Change:
    key: ConfigKey
    op: Op
    value: str | None = None  # SET: the value

    def __str__(self) -> str:
        if self.op is Op.SET:
            return f"set {self.key}={self.value}"
        return f"{self.op.value} {self.key}"


def desired_throttles(config: QuotaConfig, brokers: Sequence[int]) -> dict[ConfigKey, str]:
    """The throttle configs ``config`` wants on a cluster of ``brokers``, as Kafka's values."""
    desired: dict[ConfigKey, str] = {}
    binds = {
        quota_type: decision_mode(config, quota_type, exempt=False) is Mode.ENFORCED
        for quota_type in BROKER_RATES.values()
    }
    for topic, throttles in sorted(config.topics.items()):
        for key, replicas, quota_type in (
            (LEADER_REPLICAS, throttles.leader, QuotaType.LEADER_REPLICATION),
            (FOLLOWER_REPLICAS, throttles.follower, QuotaType.FOLLOWER_REPLICATION),
        ):
            text = replicas.text()
            if text and binds[quota_type]:
                desired[ConfigKey("topic", topic, key)] = text
    lists = bool(desired)
    for key, quota_type in BROKER_RATES.items():
        if not binds[quota_type] or (key in _REPLICATION_RATES and not lists):
            continue
        shared_by = 1 if per_broker(config, quota_type) else max(len(brokers), 1)
        for broker in brokers:
            limit, _ = broker_limit(config, quota_type, broker)
            if math.isfinite(limit):
                # Kafka's rates are whole bytes a second, at least 1 (0 would stop the traffic).
                desired[ConfigKey("broker", str(broker), key)] = str(
                    max(math.floor(limit / shared_by), 1)
                )
    return desired


def throttle_changes(
    desired: Mapping[ConfigKey, str],
    actual: Mapping[ConfigKey, str],
    owned: Mapping[ConfigKey, str],
) -> list[Change]:
    """What brings ``actual`` (the cluster's dynamic values of the throttle keys) to ``desired``,
    given what the actuator set before (``owned``): sets first, then deletes, each sorted."""
    sets = [
        Change(key, Op.SET, value)
        for key, value in sorted(desired.items())
        if actual.get(key) != value
    ]
    gone = []
    for key, value in sorted(owned.items()):
        if key in desired:
            continue
        gone.append(Change(key, Op.DELETE if actual.get(key) == value else Op.FORGET))
    return sets + gone
