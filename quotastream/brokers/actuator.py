"""The actuator of ``quotastream brokers``: the engine's replication and remote-copy throttles
applied to the brokers' own dynamic configs, through the Admin API (IncrementalAlterConfigs).

Each pass (:meth:`Actuator.reconcile`) reads the configuration the engine decides with, the
cluster's brokers and its ongoing reassignments, and the current values of the throttle keys
(DescribeConfigs), then makes the changes :func:`~quotastream.brokers.throttles.throttle_changes`
lists (the rule is in :mod:`quotastream.brokers.throttles`): the topics' lists first, then the
brokers' rates, the replication rates only if a list is in place. Kafka then enforces them
itself.

A reassignment's throttle ends with it: a topic whose partitions the actuator saw being
reassigned and no longer are, or whose move the follower list it set shows complete
(:func:`~quotastream.brokers.throttles.move_complete`: a move that ran wholly between two passes
is never seen), has its throttled-replica lists removed from the live configuration (one change,
by ``quotastream-actuator``), and so from the brokers; the replication rates go with the last
lists.

Nothing is left behind. What it sets, and the reassignments it saw running, are recorded in
Redis (``{prefix}:actuator``) *before* the brokers are changed, and a key is forgotten only
after it is deleted from them: a pass after a crash, or after a restart, deletes what no
configuration wants any more, and finishes a reassignment that ended meanwhile.

A change Kafka refuses (an unknown topic, an invalid value) is an answer, not an outage: it is
logged once per key with Kafka's error (again if the error or the value changes), counted
(``quotastream_actuator_refused_changes_total``), tried again at every pass (the topic may
appear), and the pass makes its other changes. A refused set leaves the key's record in Redis
as it was.

Dry run: each pass logs what it would change and changes nothing. Every change is logged and
counted (``quotastream_actuator_changes_total``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import redis
from kafka.admin import AlterConfigOp, ConfigResource, ConfigResourceType
from kafka.errors import KafkaError
from prometheus_client import CollectorRegistry, Counter, Gauge

from quotastream.brokers.throttles import (
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
from quotastream.outage import Outage, run_passes
from state.config import QuotaConfig, TopicThrottles

log = logging.getLogger(__name__)

_DYNAMIC: Final = ("DYNAMIC_BROKER_CONFIG", "DYNAMIC_TOPIC_CONFIG")
_RESOURCE_TYPES: Final = {"broker": ConfigResourceType.BROKER, "topic": ConfigResourceType.TOPIC}
_SET_PREFIX: Final = "set|"
_REASSIGNING_PREFIX: Final = "reassigning|"


class ActuatorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.changes = Counter(
            "quotastream_actuator_changes",
            "Throttle configs changed on the brokers (dry_run: logged only), by key and operation",
            ["key", "op", "dry_run"],
            registry=registry,
        )
        self.refused = Counter(
            "quotastream_actuator_refused_changes",
            "Throttle config changes the brokers refused (an unknown topic, an invalid value), "
            "by key and operation; each pass tries them again",
            ["key", "op"],
            registry=registry,
        )
        self.failures = Counter(
            "quotastream_actuator_failures",
            "Passes that failed (Kafka or Redis unreachable, the configuration log unreadable)",
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
    (:meth:`close`, once :meth:`run` ends)."""

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
        #: Each key's last refusal logged (the change and Kafka's error): logged once, not at
        #: every pass that is refused alike.
        self._refusals: dict[ConfigKey, str] = {}
        #: The lists each completed move had when ``finish`` was asked to remove them: asked
        #: once (with no configuration log to change, they stay, and so would the request).
        self._finished: dict[str, TopicThrottles] = {}

    def run(self, stopped: threading.Event, interval_s: float, outage: Outage) -> None:
        """A pass every ``interval_s`` until ``stopped``; a failed pass is logged (once per
        outage) and the next one tries again. RuntimeError: the configuration log unreachable
        or misshapen."""
        errors = (KafkaError, OSError, redis.RedisError, RuntimeError)
        try:
            run_passes(
                self.reconcile, every_s=interval_s, stopped=stopped, outage=outage, errors=errors
            )
        finally:
            self.close()

    def close(self) -> None:
        self._close()

    def reconcile(self) -> list[Change]:
        """One pass: the changes made (or, dry, that would be); refused ones are not."""
        try:
            return self._reconcile()
        except Exception:
            self._metrics.failures.inc()
            raise

    def _reconcile(self) -> list[Change]:
        config = self._read_config()
        owned = self._ownership.owned()
        if self._finish_reassignments(config, owned):
            config = self._read_config()
        brokers = sorted(int(b["broker_id"]) for b in self._admin.describe_cluster()["brokers"])
        actual = self._actual(set(desired_throttles(config, brokers)) | set(owned))
        lists = desired_lists(config)
        made, refused = self._make(throttle_changes(lists, actual, _of("topic", owned)), owned)
        # A rate throttles nothing without a list: only the lists Kafka took need them.
        rates = desired_rates(config, brokers, lists_in_place=bool(lists.keys() - refused))
        made_rates, refused_rates = self._make(
            throttle_changes(rates, actual, _of("broker", owned)), owned
        )
        for key in self._refusals.keys() - refused - refused_rates:
            del self._refusals[key]  # accepted since, or no longer wanted
        self._metrics.throttles.set(len(self._ownership.owned()))
        return made + made_rates

    def _finish_reassignments(self, config: QuotaConfig, owned: Mapping[ConfigKey, str]) -> bool:
        """Records reassignments that started; ends the throttle of those that finished, seen
        or not. True when the configuration changed."""
        judged = moves_to_judge(config, owned)
        assignment = self._assignment(judged)  # before the reassignments: move_complete says why
        running = {partition.topic for partition in self._admin.list_partition_reassignments()}
        self._metrics.reassignments.set(len(running))
        seen = self._ownership.reassigning()
        for topic, asked in list(self._finished.items()):
            if config.topics.get(topic) != asked:
                del self._finished[topic]  # removed: a plan alike later is judged again
        for topic in sorted(running - seen):
            log.info("reassignment of %s started", topic)
            if not self._dry_run:
                self._ownership.saw_reassigning(topic)
        complete = {
            topic
            for topic, follower in judged.items()
            if topic not in self._finished
            and move_complete(follower, assignment.get(topic, {}), moving=topic in running)
        }
        changed = False
        for topic in sorted((seen - running) | complete):
            throttles = config.topics.get(topic)
            lists = throttles is not None and bool(
                throttles.leader.text() or throttles.follower.text()
            )
            how = (
                "complete (the replicas its follower list throttles are all in place)"
                if topic in complete
                else "finished"
            )
            log.info(
                "reassignment of %s %s%s",
                topic,
                how,
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
            if throttles is not None and lists:
                self._finish(topic)
                self._finished[topic] = throttles
                changed = True
            if topic in seen:
                self._ownership.saw_finished(topic)
        return changed

    def _assignment(self, topics: Iterable[str]) -> dict[str, dict[int, list[int]]]:
        """Each of ``topics``' partitions' replicas, as the cluster's metadata has them now (a
        topic that does not exist is absent)."""
        wanted = sorted(topics)
        if not wanted:
            return {}
        return {
            described["name"]: {
                partition["partition_index"]: list(partition["replica_nodes"])
                for partition in described["partitions"]
            }
            for described in self._admin.describe_topics(wanted)
            if described["error_code"] == 0
        }

    def _actual(self, keys: set[ConfigKey]) -> dict[ConfigKey, str]:
        """The dynamic values of ``keys`` on the cluster (a key not set dynamically is absent,
        and so is every key of a topic that does not exist)."""
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

    def _make(
        self, changes: list[Change], owned: Mapping[ConfigKey, str]
    ) -> tuple[list[Change], set[ConfigKey]]:
        """Makes ``changes`` (``owned``: what the actuator had set as the pass began), each
        whatever became of the others: those made, the keys refused."""
        made, refused = [], set()
        for change in changes:
            if self._apply(change, owned.get(change.key)):
                made.append(change)
            else:
                refused.add(change.key)
        return made, refused

    def _apply(self, change: Change, owned: str | None) -> bool:
        """Makes one change (``owned``: the key's value the actuator had set, if any); False if
        Kafka refused it."""
        if self._dry_run:
            log.info("dry run, not applied: %s", change)
            self._metrics.changes.labels(change.key.key, change.op.value, "True").inc()
            return True
        key = change.key
        if change.op is Op.SET:
            assert change.value is not None
            self._ownership.own(key, change.value)  # first: a crash after it leaves nothing
            refusal = self._alter(key, (AlterConfigOp.SET, change.value))
            if refusal is not None:
                if owned is None:
                    self._ownership.disown(key)
                else:
                    self._ownership.own(key, owned)  # what it set before is still there
        elif change.op is Op.DELETE:
            refusal = self._alter(key, (AlterConfigOp.DELETE, None))
            if refusal is None:
                self._ownership.disown(key)
        else:
            log.warning(
                "%s is no longer what the actuator set (changed, or its topic deleted, by "
                "someone else): left as it is",
                key,
            )
            self._ownership.disown(key)
            refusal = None
        if refusal is not None:
            self._refused(change, refusal)
            return False
        log.info("%s", change)
        self._metrics.changes.labels(key.key, change.op.value, "False").inc()
        return True

    def _refused(self, change: Change, refusal: str) -> None:
        self._metrics.refused.labels(change.key.key, change.op.value).inc()
        report = f"{change} refused by Kafka (tried again every pass): {refusal}"
        if self._refusals.get(change.key) != report:
            self._refusals[change.key] = report
            log.warning("%s", report)

    def _alter(self, key: ConfigKey, operation: tuple[int, str | None]) -> str | None:
        """One key's change, through IncrementalAlterConfigs: None once made, else Kafka's
        answer (the resource's error)."""
        resource = ConfigResource(_RESOURCE_TYPES[key.resource], key.name, {key.key: operation})
        # The replication rates are not in the brokers' described configs until set once:
        # kafka-python's check against them would refuse them.
        result = self._admin.alter_configs([resource], raise_on_unknown=False)
        outcome = result.get(key.resource, {}).get(key.name)
        return None if outcome == "OK" else str(outcome)


def _of(resource: str, owned: Mapping[ConfigKey, str]) -> dict[ConfigKey, str]:
    """The keys of ``owned`` on resources of one kind (``broker`` or ``topic``)."""
    return {key: value for key, value in owned.items() if key.resource == resource}
