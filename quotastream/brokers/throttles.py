"""Which of Kafka's own throttle configs the engine's configuration wants on a cluster, the
changes that bring the cluster there, and when a reassignment's throttle is done: the actuator's
rule, pure (no Kafka, no Redis).

Kafka enforces replication (KIP-73) and remote-copy (KIP-956) quotas itself, from dynamic
configs: per broker ``leader.replication.throttled.rate``, ``follower.replication.throttled.rate``
and ``remote.log.manager.copy.max.bytes.per.second``; per topic the throttled-replica lists. The
configuration the engine decides with (``brokers:`` and ``topics:`` of the quota file and its
live changes, under Kafka's own names) is what should be set:

* a broker's rate is the limit the engine resolves for it (its override, else ``<default>``); a
  cluster-scoped limit is shared evenly by the brokers (Kafka's are per broker);
* a rate is set only while its quota type binds (enforcement on, the type not in shadow mode);
* a topic's lists, while their quota type binds; the replication rates only while some list is
  in place (a rate throttles nothing without one, and a reassignment's throttle is gone with its
  lists: nothing is left behind once the lists are removed). So the lists are applied first
  (:func:`desired_lists`), and the rates (:func:`desired_rates`) follow from what Kafka
  accepted: a list it refuses (its topic does not exist) sets no rate.

What the actuator set is its own (``owned``): a key it set and no longer wants is deleted, unless
someone else has changed it since (then it is left alone, and no longer owned). Keys it never set
and does not want are not its business.

A reassignment's throttle is done once its move is (:func:`move_complete`): the replicas a move
adds are the ones its follower list throttles (as ``kafka-reassign-partitions`` and
``quotastream replication throttle`` plan it), so when every one of them is a replica of its
partition and nothing of the topic is moving, the move has happened, however briefly it ran.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Literal

from state.config import QuotaConfig, ThrottledReplicas
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


def desired_lists(config: QuotaConfig) -> dict[ConfigKey, str]:
    """The throttled-replica lists ``config`` wants on its topics, as Kafka's values."""
    binds = _binding(config)
    desired: dict[ConfigKey, str] = {}
    for topic, throttles in sorted(config.topics.items()):
        for key, replicas, quota_type in (
            (LEADER_REPLICAS, throttles.leader, QuotaType.LEADER_REPLICATION),
            (FOLLOWER_REPLICAS, throttles.follower, QuotaType.FOLLOWER_REPLICATION),
        ):
            text = replicas.text()
            if text and binds[quota_type]:
                desired[ConfigKey("topic", topic, key)] = text
    return desired


def desired_rates(
    config: QuotaConfig, brokers: Sequence[int], *, lists_in_place: bool
) -> dict[ConfigKey, str]:
    """The broker rates ``config`` wants on a cluster of ``brokers``, as Kafka's values; the
    replication rates only while a throttled-replica list is in place (``lists_in_place``)."""
    binds = _binding(config)
    desired: dict[ConfigKey, str] = {}
    for key, quota_type in BROKER_RATES.items():
        if not binds[quota_type] or (key in _REPLICATION_RATES and not lists_in_place):
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


def desired_throttles(config: QuotaConfig, brokers: Sequence[int]) -> dict[ConfigKey, str]:
    """Every throttle config ``config`` wants on a cluster of ``brokers`` once Kafka has
    accepted its lists."""
    lists = desired_lists(config)
    return lists | desired_rates(config, brokers, lists_in_place=bool(lists))


def _binding(config: QuotaConfig) -> dict[QuotaType, bool]:
    return {
        quota_type: decision_mode(config, quota_type, exempt=False) is Mode.ENFORCED
        for quota_type in BROKER_RATES.values()
    }


def throttle_changes(
    desired: Mapping[ConfigKey, str],
    actual: Mapping[ConfigKey, str],
    owned: Mapping[ConfigKey, str],
) -> list[Change]:
    """What brings ``actual`` (the cluster's dynamic values of the throttle keys) to ``desired``,
    given what the actuator set before (``owned``): sets first (a throttle is replaced before
    the one it replaces goes), then deletes, each sorted. Each change stands alone: one Kafka
    refuses does not keep the others from being made."""
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


def moves_to_judge(
    config: QuotaConfig, owned: Mapping[ConfigKey, str]
) -> dict[str, ThrottledReplicas]:
    """Each topic whose follower list, as the configuration has it, is the one the actuator set
    (a plan it has not applied yet, or one changed in the configuration since, is not its to
    judge), and names replicas (``*`` names no move: only a pass that saw the topic being
    reassigned can tell that its move ended)."""
    return {
        topic: throttles.follower
        for topic, throttles in sorted(config.topics.items())
        if throttles.follower.replicas
        and owned.get(ConfigKey("topic", topic, FOLLOWER_REPLICAS)) == throttles.follower.text()
    }


def move_complete(
    follower: ThrottledReplicas,
    replicas: Mapping[int, Collection[int]],
    *,
    moving: bool,
) -> bool:
    """Whether the move that ``follower`` throttles is complete: nothing of the topic is
    ``moving``, and each ``partition:broker`` it names is among that partition's ``replicas``
    (the topic's assignment now; a partition it lacks has not received the replica).

    Before a move starts, the replicas it adds are not yet its partitions' (else there would be
    nothing to move); while it runs, the topic is being reassigned. Read the assignment before
    the reassignments: a move that starts in between is then either not in the assignment yet,
    or listed as moving."""
    if moving or follower.every_partition or not follower.replicas:
        return False
    return all(broker in replicas.get(partition, ()) for partition, broker in follower.replicas)
