"""The actuator of ``quotastream brokers``: the engine's replication and remote-copy throttles
applied to the brokers' own dynamic configs, through the Admin API (IncrementalAlterConfigs).

Each pass (:meth:`Actuator.reconcile`) reads the configuration the engine decides with, the
cluster's brokers and its ongoing reassignments, and the current values of the throttle keys
(DescribeConfigs), then makes the changes :func:`~quotastream.brokers.throttles.throttle_changes`
lists (the rule is in :mod:`quotastream.brokers.throttles`). Kafka then enforces them itself.

A reassignment's throttle ends with it: a topic whose partitions the actuator saw being
reassigned and no longer are has its throttled-replica lists removed from the live
configuration (one change, by ``quotastream-actuator``), and so from the brokers; the
replication rates go with the last lists.

Nothing is left behind. What it sets, and the reassignments it saw running, are recorded in
Redis (``{prefix}:actuator``) *before* the brokers are changed, and a key is forgotten only
after it is deleted from them: a pass after a crash, or after a restart, deletes what no
configuration wants any more, and finishes a reassignment that ended meanwhile.

Dry run: each pass logs what it would change and changes nothing. Every change is logged and
counted (``quotastream_actuator_changes_total``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any, Final

import redis
from kafka.admin import AlterConfigOp, ConfigResource, ConfigResourceType
from kafka.errors import KafkaError
from prometheus_client import CollectorRegistry, Counter, Gauge

from quotastream.brokers.throttles import (
    Change,
    ConfigKey,
    Op,
    desired_throttles,
    throttle_changes,
)
from quotastream.outage import Outage, run_passes
from state.config import QuotaConfig

log = logging.getLogger(__name__)

_DYNAMIC: Final = ("DYNAMIC_BROKER_CONFIG", "DYNAMIC_TOPIC_CONFIG")
_RESOURCE_TYPES: Final = {"broker": ConfigResourceType.BROKER, "topic": ConfigResourceType.TOPIC}
_SET_PREFIX: Final = "set|"
_REASSIGNING_PREFIX: Final = "reassigning|"


class RefusedChangeError(RuntimeError):
    """A broker answered a config change with an error (the message has it)."""


class ActuatorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.changes = Counter(
            "quotastream_actuator_changes",
            "Throttle configs changed on the brokers (dry_run: logged only), by key and operation",
            ["key", "op", "dry_run"],
            registry=registry,
        )
        self.failures = Counter(
            "quotastream_actuator_failures",
            "Passes that failed (Kafka or Redis unreachable, a change refused)",
            registry=registry,
        )
        self.throttles = Gauge(
            "quotastream_actuator_throttles",
            "Throttle configs the actuator has set and not removed",
            registry=registry,
        )
        self.reassignments = Gauge(
            "quotastream_actuator_reassignments",
            "Topics with a partition reassignment running, as last seen",
            registry=registry,
        )


class Ownership:
    """What the actuator set and saw, in one Redis hash (it outlives the process)."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._redis = client
        self._key = f"{prefix}:actuator"

    def owned(self) -> dict[ConfigKey, str]:
        owned = {}
        for field, value in self._fields(_SET_PREFIX):
            resource, name, key = field.split("|", 2)
            owned[ConfigKey(resource, name, key)] = value  # type: ignore[arg-type]
        return owned

    def reassigning(self) -> set[str]:
        return {topic for topic, _ in self._fields(_REASSIGNING_PREFIX)}

    def own(self, key: ConfigKey, value: str) -> None:
        self._redis.hset(self._key, _field(key), value)

    def disown(self, key: ConfigKey) -> None:
        self._redis.hdel(self._key, _field(key))

    def saw_reassigning(self, topic: str) -> None:
        self._redis.hset(self._key, _REASSIGNING_PREFIX + topic, "1")

    def saw_finished(self, topic: str) -> None:
        self._redis.hdel(self._key, _REASSIGNING_PREFIX + topic)

    def _fields(self, prefix: str) -> Iterable[tuple[str, str]]:
        stored: dict[bytes, bytes] = self._redis.hgetall(self._key)  # type: ignore[assignment]
        for field, value in stored.items():
            text = field.decode()
            if text.startswith(prefix):
                yield text.removeprefix(prefix), value.decode()


def _field(key: ConfigKey) -> str:
    return f"{_SET_PREFIX}{key.resource}|{key.name}|{key.key}"


class Actuator:
    """One pass at a time (:meth:`reconcile`); the command runs them every interval.

    ``read_config()`` is the configuration the engine decides with now; ``finish(topic)``
    removes a topic's throttled-replica lists from it; ``close()`` releases the connections
    once :meth:`run` ends."""

    def __init__(
        self,
        admin: Any,
        ownership: Ownership,
        *,
        read_config: Callable[[], QuotaConfig],
        finish: Callable[[str], None],
        metrics: ActuatorMetrics,
        dry_run: bool,
        close: Callable[[], None] = lambda: None,
    ) -> None:
        self._admin = admin
        self._close = close
        self._ownership = ownership
        self._read_config = read_config
        self._finish = finish
        self._metrics = metrics
        self._dry_run = dry_run

    def run(self, stopped: threading.Event, interval_s: float, outage: Outage) -> None:
        """A pass every ``interval_s`` until ``stopped``; a failed pass is logged (once per
        outage) and the next one tries again. RuntimeError: a refused change, the
        configuration log unreachable or misshapen."""
        errors = (KafkaError, OSError, redis.RedisError, RuntimeError)
        try:
            run_passes(
                self.reconcile, every_s=interval_s, stopped=stopped, outage=outage, errors=errors
            )
        finally:
            self._close()

    def reconcile(self) -> list[Change]:
        """One pass: the changes made (or, dry, that would be)."""
        try:
            return self._reconcile()
        except Exception:
            self._metrics.failures.inc()
            raise

    def _reconcile(self) -> list[Change]:
        config = self._read_config()
        if self._finish_reassignments(config):
            config = self._read_config()
        brokers = sorted(int(b["broker_id"]) for b in self._admin.describe_cluster()["brokers"])
        desired = desired_throttles(config, brokers)
        owned = self._ownership.owned()
        actual = self._actual(set(desired) | set(owned))
        changes = throttle_changes(desired, actual, owned)
        for change in changes:
            self._apply(change)
        self._metrics.throttles.set(len(self._ownership.owned()))
        return changes

    def _finish_reassignments(self, config: QuotaConfig) -> bool:
        """Records reassignments that started; ends the throttle of those that finished. True
        when the configuration changed."""
        running = {partition.topic for partition in self._admin.list_partition_reassignments()}
        self._metrics.reassignments.set(len(running))
        seen = self._ownership.reassigning()
        changed = False
        for topic in sorted(running - seen):
            log.info("reassignment of %s started", topic)
            if not self._dry_run:
                self._ownership.saw_reassigning(topic)
        for topic in sorted(seen - running):
            throttles = config.topics.get(topic)
            lists = throttles is not None and bool(
                throttles.leader.text() or throttles.follower.text()
            )
            log.info(
                "reassignment of %s finished%s",
                topic,
                (
                    ", dry run: its throttle would be removed"
                    if self._dry_run
                    else ": removing its throttle"
                )
                if lists
                else "",
            )
            if self._dry_run:
                continue
            if lists:
                self._finish(topic)
                changed = True
            self._ownership.saw_finished(topic)
        return changed

    def _actual(self, keys: set[ConfigKey]) -> dict[ConfigKey, str]:
        """The dynamic values of ``keys`` on the cluster (a key not set dynamically is absent)."""
        resources = sorted({(key.resource, key.name) for key in keys})
        if not resources:
            return {}
        described = self._admin.describe_configs(
            [ConfigResource(_RESOURCE_TYPES[kind], name) for kind, name in resources]
        )
        actual: dict[ConfigKey, str] = {}
        for key in keys:
            entry = described.get(key.resource, {}).get(key.name, {}).get(key.key)
            if entry is not None and entry.get("config_source") in _DYNAMIC:
                actual[key] = str(entry["value"])
        return actual

    def _apply(self, change: Change) -> None:
        log.info("%s%s", "dry run, not applied: " if self._dry_run else "", change)
        self._metrics.changes.labels(change.key.key, change.op.value, str(self._dry_run)).inc()
        if self._dry_run:
            return
        key = change.key
        if change.op is Op.SET:
            assert change.value is not None
            self._ownership.own(key, change.value)  # first: a crash after it leaves nothing
            self._alter(key, (AlterConfigOp.SET, change.value))
        elif change.op is Op.DELETE:
            self._alter(key, (AlterConfigOp.DELETE, None))
            self._ownership.disown(key)
        else:
            log.warning("%s was changed by someone else: left as it is", key)
            self._ownership.disown(key)

    def _alter(self, key: ConfigKey, operation: tuple[int, str | None]) -> None:
        resource = ConfigResource(_RESOURCE_TYPES[key.resource], key.name, {key.key: operation})
        # The replication rates are not in the brokers' described configs until set once:
        # kafka-python's check against them would refuse them.
        result = self._admin.alter_configs([resource], raise_on_unknown=False)
        outcome = result.get(key.resource, {}).get(key.name)
        if outcome != "OK":
            raise RefusedChangeError(f"{key}: the broker refused the change: {outcome}")
