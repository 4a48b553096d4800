"""The live configuration's log: one Kafka topic of change records (``state.live_config``).

The topic has exactly one partition, so its offsets order every change: version ``n`` is the
YAML configuration plus the records at offsets ``0..n-1``. It is created with infinite retention,
because a version must stay readable for as long as a checkpoint may replay a batch that used it
(the same reason Kafka Connect and Schema Registry keep their configuration in such a topic).
The streaming query pins the version a micro-batch uses in its source offsets, and executors read
the records they need here, once per process and version.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Final

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, KafkaAdminClient, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from state.config import QuotaConfig
from state.live_config import Change, LiveConfig, LiveConfigs, encode_change
from streaming.engine.client_settings import settings_for
from streaming.engine.kafka_clients import (
    end_offsets,
    is_outage,
    kafka_outage,
    new_consumer,
    ride_out,
)

#: What the configuration topic must be. One partition, so that its offsets order the changes;
#: every record kept, so that every version stays readable. The engine creates it so when it is
#: missing; ``docker-compose.yml``'s init step creates it with :func:`kafka_topics_options`
#: (a test holds the two together).
PARTITIONS: Final = 1
TOPIC_CONFIGS: Final = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}


def kafka_topics_options() -> list[str]:
    """The ``kafka-topics.sh --create`` options that make a configuration topic."""
    configs = [f"{name}={value}" for name, value in TOPIC_CONFIGS.items()]
    return ["--partitions", str(PARTITIONS), *(o for c in configs for o in ("--config", c))]


class ConfigLogError(RuntimeError):
    """The configuration topic is missing, misshapen or unreachable."""


class MisshapenTopicError(ConfigLogError):
    """The configuration topic exists but is not what it must be: a configuration error, which
    the message says how to fix."""


class ConfigLog:
    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        client: Mapping[str, Any] | None = None,
        timeout_ms: int = 10_000,
        max_outage_s: float | None = None,
    ) -> None:
        """``max_outage_s``: how long :meth:`read` waits out a broker that does not answer
        (the executors, which must read the version a batch pinned); None: not at all, the
        first failure is raised (commands, which must answer promptly)."""
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self._client = dict(client or {})
        self._timeout_ms = timeout_ms
        self._max_outage_s = max_outage_s
        self._partition = TopicPartition(topic, 0)
        self._consumer: KafkaConsumer | None = None

    def ensure_topic(self) -> None:
        """Checks the existing topic, or creates it (one partition, infinite retention).

        Created only when the metadata lacks it: Kafka authorizes a CreateTopics request
        before it finds the topic exists, and an engine whose principal may not create topics
        (its topics made by an operator) must still start."""
        admin = KafkaAdminClient(
            **settings_for(
                KafkaAdminClient,
                self._client,
                bootstrap_servers=self.bootstrap_servers.split(","),
            )
        )
        try:
            if not self._check_partitions():
                with contextlib.suppress(TopicAlreadyExistsError):
                    admin.create_topics(
                        [NewTopic(self.topic, PARTITIONS, -1, topic_configs=TOPIC_CONFIGS)],
                        timeout_ms=self._timeout_ms,
                    )
            self._check_retention(admin)
        finally:
            admin.close()

    def end(self) -> int:
        """The newest version: how many change records the log holds (in partition 0).

        The partition count is checked where the topic is created or first used
        (:meth:`ensure_topic`), not here: a broker that lost its log may recreate the topic
        with its default count when a client asks for it, and the query's source reports that
        loss (the version goes back) instead of every executor failing on it.
        """
        partitions = self._reader().partitions_for_topic(self.topic) or set()
        if 0 not in partitions:
            return 0
        ends = end_offsets(self._reader(), [self._partition], self._timeout_ms)
        return ends.get((self.topic, 0), 0)  # gone since the metadata was read: no records

    def read(self, start: int, end: int) -> list[bytes]:
        """The records at offsets ``[start, end)``, waiting out an outage up to
        ``max_outage_s``."""
        if end <= start:
            return []
        outage = kafka_outage(self.bootstrap_servers, self._max_outage_s)
        consumer = ride_out(self._reader, outage)
        consumer.assign([self._partition])
        consumer.seek(self._partition, start)
        records: list[bytes] = []
        deadline = time.monotonic() + self._timeout_ms / 1000
        while consumer.position(self._partition) < end:
            # kafka-python reconnects by itself: an outage shows as polls that bring nothing.
            batch = consumer.poll(timeout_ms=200).get(self._partition, [])
            if batch:
                outage.recovered()
                records += [r.value for r in batch if r.offset < end]
                deadline = time.monotonic() + self._timeout_ms / 1000
            elif time.monotonic() > deadline:
                outage.failed(
                    ConfigLogError(
                        f"{self.topic}: config records {start + len(records)}..{end - 1} not "
                        f"received within {self._timeout_ms} ms"
                    )
                )
                deadline = time.monotonic() + self._timeout_ms / 1000
        return records[: end - start]

    def append(self, change: Change) -> int:
        """Appends a change; returns the version it creates."""
        producer = KafkaProducer(
            **settings_for(
                KafkaProducer,
                self._client,
                bootstrap_servers=self.bootstrap_servers.split(","),
                acks="all",
            )
        )
        try:
            metadata = producer.send(self.topic, encode_change(change), partition=0).get(
                timeout=self._timeout_ms / 1000
            )
        finally:
            producer.close()
        return int(metadata.offset) + 1

    def current(self, base: QuotaConfig) -> LiveConfig:
        """The newest version of the live configuration over ``base``."""
        return LiveConfig(0, base).advanced(self.read(0, self.end()))

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _reader(self) -> KafkaConsumer:
        if self._consumer is None:
            self._consumer = new_consumer(self.bootstrap_servers, self._client, self._timeout_ms)
        return self._consumer

    def _check_partitions(self) -> set[int]:
        partitions: set[int] = self._reader().partitions_for_topic(self.topic) or set()
        if len(partitions) > PARTITIONS:
            raise MisshapenTopicError(
                f"config topic {self.topic!r} has {len(partitions)} partitions; it must have "
                f"exactly {PARTITIONS}, so that its offsets order the changes. Fix: delete it "
                f"(kafka-topics.sh --delete --topic {self.topic}) before the engine's first start, "
                f"or set kafka.config_topic to a new name; the engine creates it as it must be"
            )
        return partitions

    def _check_retention(self, admin: KafkaAdminClient) -> None:
        """Refuses a topic that would delete or compact records (a broker that cannot describe
        topic configurations is not asked)."""
        wanted = ConfigResource("TOPIC", self.topic, configs=dict.fromkeys(TOPIC_CONFIGS))
        try:
            described = admin.describe_configs([wanted], config_filter="all")
        except (KafkaError, ValueError):
            return
        configs = described.get("topic", {}).get(self.topic, {})
        wrong = {
            name: configs[name].get("value")
            for name, value in TOPIC_CONFIGS.items()
            if name in configs and configs[name].get("value") != value
        }
        if wrong:
            found = ", ".join(f"{name}={value}" for name, value in sorted(wrong.items()))
            keep = ",".join(f"{name}={value}" for name, value in TOPIC_CONFIGS.items())
            raise MisshapenTopicError(
                f"config topic {self.topic!r} has {found}; it must keep every record, so that "
                f"every version stays readable. Fix: kafka-configs.sh --alter --entity-type "
                f"topics --entity-name {self.topic} --add-config {keep}"
            )


@dataclass(frozen=True)
class ConfigSource:
    """Where executors find the live configuration's versions (picklable; no connection).

    Version 0 is the YAML configuration itself and needs no Kafka.
    """

    base: QuotaConfig
    bootstrap_servers: str = ""
    topic: str | None = None
    client: dict[str, Any] = field(default_factory=dict, repr=False)
    #: How long a read of the log waits out a broker that does not answer.
    max_outage_s: float | None = None

    def at(self, version: int) -> LiveConfig:
        if self.topic is None:
            return LiveConfig(0, self.base)
        # Connects at version 0 already, so that the first change is not the one to wait for
        # a new consumer's connection and metadata.
        return _versions(self).at(version)

    @cached_property
    def cache_key(self) -> tuple[str, str, str]:
        """Which cache of versions serves this log and base (computed once: every batch asks)."""
        return (self.bootstrap_servers, self.topic or "", self.base.model_dump_json())


_VERSIONS: dict[tuple[str, str, str], LiveConfigs] = {}


def _versions(source: ConfigSource) -> LiveConfigs:
    """One cache of versions per process, configuration log and base configuration."""
    assert source.topic is not None
    key = source.cache_key
    versions = _VERSIONS.get(key)
    if versions is None:
        log = ConfigLog(
            source.bootstrap_servers, source.topic, source.client, max_outage_s=source.max_outage_s
        )
        try:
            log.end()  # connect now, so that the first change does not wait for it
        except KafkaError as error:
            # Only a version above 0 needs the log; its read waits for the broker.
            if not is_outage(error):
                raise
        versions = _VERSIONS[key] = LiveConfigs(source.base, log.read)
    return versions
