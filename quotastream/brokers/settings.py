"""The ``brokers:`` section of the engine settings: ``quotastream brokers`` (``docs/brokers.md``).

The command reads the rest of the file too: ``kafka`` (where its events and dead letters go: the
engine's first events topic and its dead-letter topic) and ``events`` (the largest message the
engine accepts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from quotastream.agent_settings import ClusterLogin, MetricsEndpoint

Millis = Annotated[int, Field(ge=1)]


class RemoteLogMetadataSettings(BaseModel):
    """Where the cluster's tiered storage writes its segments' lifecycle, and how to read it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    #: The topic-based remote log metadata manager's topic.
    topic: Annotated[str, Field(min_length=1)] = "__remote_log_metadata"
    #: The ``kafka-storage-<version>.jar`` of the cluster's Kafka release (in its ``libs/``):
    #: its message schemas decode the records. Required while ``enabled``.
    kafka_storage_jar: Path | None = None
    #: The consumer group whose committed offsets are the bridge's position.
    group_id: Annotated[str, Field(min_length=1)] = "quotastream-brokers"
    #: The longest a poll waits for records (and so the longest a stop waits).
    poll_ms: Millis = 500

    @model_validator(mode="after")
    def _jar_exists(self) -> RemoteLogMetadataSettings:
        if self.enabled:
            if self.kafka_storage_jar is None:
                raise ValueError(
                    "kafka_storage_jar is required while enabled: the cluster release's "
                    "kafka-storage-<version>.jar (its libs/ directory) holds the message schemas"
                )
            if not self.kafka_storage_jar.is_file():
                raise ValueError(f"kafka_storage_jar {str(self.kafka_storage_jar)!r} is not a file")
        return self


class LeaderEpochsSettings(BaseModel):
    """Each tiered partition's leader-epoch lineage, walked from its leader: what size-based
    retention counts by (``quotastream/brokers/lineage.py``). Runs with the remote log bridge."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    #: How often every lineage is walked (Kafka's remote retention runs every 30 s by default).
    interval_ms: Millis = 30_000


class ActuatorSettings(BaseModel):
    """Kafka's own replication and remote-copy throttles, set from the engine's configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    #: Log what it would change, change nothing.
    dry_run: bool = False
    #: How often the brokers are brought to the configuration (and reassignments checked).
    interval_ms: Millis = 1_000


class BrokerMetricsSettings(BaseModel):
    """The brokers' JMX exporters, whose counters become remote fetch and replication counts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    #: Each broker's exporter: broker id -> the URL of its metrics (``http://host:9404/metrics``).
    endpoints: dict[Annotated[int, Field(ge=0)], str] = {}
    #: How often every exporter is scraped (the counts' granularity).
    interval_ms: Millis = 1_000
    #: How long a scrape waits for an exporter.
    timeout_ms: Millis = 2_000
    #: Counts kept while the events topic is unreachable; beyond, the oldest are dropped.
    max_backlog: Annotated[int, Field(ge=1)] = 10_000

    @model_validator(mode="after")
    def _endpoints_given(self) -> BrokerMetricsSettings:
        if self.enabled and not self.endpoints:
            raise ValueError("endpoints is required while enabled: each broker id's exporter URL")
        for broker, url in self.endpoints.items():
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"endpoints.{broker} {url!r} is not an http(s) URL")
        return self


class BrokersSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The cluster whose brokers' own traffic is read and throttled.
    cluster: ClusterLogin = ClusterLogin()
    remote_log_metadata: RemoteLogMetadataSettings = RemoteLogMetadataSettings(enabled=False)
    leader_epochs: LeaderEpochsSettings = LeaderEpochsSettings()
    actuator: ActuatorSettings = ActuatorSettings()
    broker_metrics: BrokerMetricsSettings = BrokerMetricsSettings()
    #: After a failed read or publish, the wait before reading the topic again (doubling up
    #: to ``max_retry_ms``).
    retry_ms: Millis = 500
    max_retry_ms: Millis = 30_000
    metrics: MetricsEndpoint = MetricsEndpoint(port=9466)
