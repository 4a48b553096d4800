"""``quotastream brokers``: the agent next to a cluster (``docs/brokers.md``). It publishes the
traffic inside its brokers as the engine's events (the remote log bridge:
``__remote_log_metadata`` to ``remote_segment`` and ``remote_copy`` events; the brokers' metrics
to ``remote_fetch`` and ``replication`` counts) and applies the engine's replication and
remote-copy throttles to the brokers' own configs (the actuator)."""

from __future__ import annotations

import logging
import math
import signal
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import redis
from kafka import KafkaConsumer
from kafka.admin import KafkaAdminClient
from kafka.net.compat import KafkaNetClient
from prometheus_client import CollectorRegistry, start_http_server

from quotastream.brokers.actuator import Actuator, ActuatorMetrics, Ownership
from quotastream.brokers.bridge import RemoteLogBridge, RemoteLogBridgeMetrics
from quotastream.brokers.broker_metrics import BrokerMetricsSource, ScrapeMetrics
from quotastream.brokers.lineage import LineageMetrics, LineageSource
from quotastream.brokers.remote_log_metadata import RemoteLogMetadataSchemas
from quotastream.brokers.throttles import FOLLOWER_REPLICAS, LEADER_REPLICAS
from quotastream.clock import SYSTEM_CLOCK
from quotastream.outage import Outage
from quotastream.publisher import EventsPublisher, events_producer
from state.config import QuotaConfig, load_quota_config
from state.live_config import LiveConfigs, SetTopicThrottles, describe_change
from streaming.commands.exit_codes import EXIT_OK
from streaming.engine.config_log import ConfigLog
from streaming.engine.settings import EngineSettings

log = logging.getLogger(__name__)

#: A worker's loop: passes every interval until the event is set, riding out an outage.
Periodic = Callable[[threading.Event, float, Outage], None]

#: Who the live configuration's log says removed a finished reassignment's throttle.
ACTUATOR_AUTHOR = "quotastream-actuator"


def events_publisher(settings: EngineSettings) -> EventsPublisher:
    """A publisher to the engine's first events topic (and its dead-letter topic), its producer
    made at the first send: Kafka may be down when the agent starts."""
    kafka = settings.kafka
    return EventsPublisher(
        lambda: events_producer(kafka.bootstrap_servers, kafka.client_settings()),
        topic=kafka.topics[0],
        max_message_bytes=settings.events.max_payload_bytes,
        dead_letter_topic=kafka.dead_letter_topic,
    )


def build_remote_log_bridge(
    settings: EngineSettings, registry: CollectorRegistry
) -> RemoteLogBridge:
    """The bridge the settings describe: reading ``brokers.cluster``'s metadata topic with the
    schemas of ``brokers.remote_log_metadata.kafka_storage_jar``, publishing to the engine's
    first events topic and its dead-letter topic."""
    brokers = settings.brokers
    source = brokers.remote_log_metadata
    if source.kafka_storage_jar is None:
        raise ValueError("brokers.remote_log_metadata.kafka_storage_jar is not set")
    schemas = RemoteLogMetadataSchemas.from_jar(source.kafka_storage_jar)
    cluster = brokers.cluster

    def new_consumer() -> Any:
        return KafkaConsumer(
            bootstrap_servers=cluster.bootstrap_servers,
            group_id=source.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            **cluster.client_settings(),
        )

    return RemoteLogBridge(
        schemas,
        source.topic,
        new_consumer=new_consumer,
        publisher=events_publisher(settings),
        metrics=RemoteLogBridgeMetrics(registry),
        poll_ms=source.poll_ms,
        retry_ms=brokers.retry_ms,
        max_retry_ms=brokers.max_retry_ms,
        server=f"Kafka at {cluster.bootstrap_servers}",
        traffic_horizon_ms=settings.events.max_past_ms,
    )


def build_actuator(settings: EngineSettings, registry: CollectorRegistry) -> Actuator:
    """The actuator the settings describe: on ``brokers.cluster``, following the live
    configuration of ``kafka.config_topic`` over the quota file (or the file alone), with what
    it set recorded in the engine's Redis."""
    cluster, kafka = settings.brokers.cluster, settings.kafka
    base = load_quota_config(Path(settings.quotas))
    config_log = (
        ConfigLog(kafka.bootstrap_servers, kafka.config_topic, kafka.client_settings())
        if kafka.config_topic is not None
        else None
    )

    def read_config() -> QuotaConfig:
        return base

    if config_log is not None:
        # The newest version, moved forward by the records added since the last pass.
        versions, follow = LiveConfigs(base, config_log.read), config_log

        def read_config() -> QuotaConfig:
            return versions.at(follow.end()).config

    def finish(topic: str) -> None:
        throttles = read_config().topics.get(topic)
        if throttles is None:
            return
        if config_log is None:
            log.warning(
                "the reassignment of %s finished: remove its throttled replicas from %s "
                "(kafka.config_topic is null, so the actuator cannot)",
                topic,
                settings.quotas,
            )
            return
        keys = {
            LEADER_REPLICAS: throttles.leader.text(),
            FOLLOWER_REPLICAS: throttles.follower.text(),
        }
        change = SetTopicThrottles(
            topic=topic,
            values={key: "" for key, value in keys.items() if value},
            at_ms=SYSTEM_CLOCK.wall_ms(),
            by=ACTUATOR_AUTHOR,
        )
        version = config_log.append(change)
        log.info("version %d: %s", version, describe_change(change))

    admin = KafkaAdminClient(
        bootstrap_servers=cluster.bootstrap_servers, **cluster.client_settings()
    )
    client = redis.Redis(**settings.redis.connection())

    def close() -> None:
        admin.close()
        client.close()
        if config_log is not None:
            config_log.close()

    return Actuator(
        admin,
        Ownership(client, settings.redis.key_prefix),
        read_config=read_config,
        finish=finish,
        metrics=ActuatorMetrics(registry),
        dry_run=settings.brokers.actuator.dry_run,
        close=close,
    )


def build_broker_metrics(
    settings: EngineSettings, registry: CollectorRegistry
) -> BrokerMetricsSource:
    """The metrics source the settings describe: scraping ``brokers.broker_metrics.endpoints``,
    publishing to the engine's first events topic."""
    source = settings.brokers.broker_metrics
    timeout_s = source.timeout_ms / 1000

    def fetch(url: str) -> str:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return str(response.read().decode())

    return BrokerMetricsSource(
        source.endpoints,
        fetch=fetch,
        publish=events_publisher(settings).publish,
        metrics=ScrapeMetrics(registry),
        max_backlog=source.max_backlog,
    )


def build_lineage_source(settings: EngineSettings, registry: CollectorRegistry) -> LineageSource:
    """The lineage source on ``brokers.cluster``, publishing to the engine's first events
    topic."""
    cluster = settings.brokers.cluster
    client_settings = {"bootstrap_servers": cluster.bootstrap_servers, **cluster.client_settings()}
    return LineageSource(
        KafkaAdminClient(**client_settings),
        KafkaNetClient(**client_settings),
        publish=events_publisher(settings).publish,
        metrics=LineageMetrics(registry),
    )


def run_brokers(settings: EngineSettings) -> int:
    """The agent as the process's whole job, until SIGTERM or SIGINT: the remote log bridge,
    the actuator and the metrics source, each that is enabled, in a thread of its own."""
    brokers = settings.brokers
    registry = CollectorRegistry()
    stopped = threading.Event()
    workers: list[threading.Thread] = []
    bridge = None
    if brokers.remote_log_metadata.enabled:
        bridge = build_remote_log_bridge(settings, registry)
        workers.append(threading.Thread(target=bridge.run, name="remote-log-bridge"))

    def every(name: str, run: Periodic, interval_ms: int, server: str, meanwhile: str) -> None:
        outage = Outage(server, math.inf, meanwhile=meanwhile)
        workers.append(
            threading.Thread(target=run, args=(stopped, interval_ms / 1000, outage), name=name)
        )

    if brokers.remote_log_metadata.enabled and brokers.leader_epochs.enabled:
        every(
            "leader-epochs",
            build_lineage_source(settings, registry).run,
            brokers.leader_epochs.interval_ms,
            f"Kafka at {brokers.cluster.bootstrap_servers}",
            "walking every lineage again next interval",
        )
    if brokers.actuator.enabled:
        every(
            "actuator",
            build_actuator(settings, registry).run,
            brokers.actuator.interval_ms,
            f"Kafka at {brokers.cluster.bootstrap_servers} or Redis",
            "trying again every pass",
        )
    if brokers.broker_metrics.enabled:
        every(
            "broker-metrics",
            build_broker_metrics(settings, registry).run,
            brokers.broker_metrics.interval_ms,
            f"the events topic on Kafka at {settings.kafka.bootstrap_servers}",
            "keeping the counts for the next pass",
        )
    endpoint = brokers.metrics
    if endpoint.enabled:
        server, _ = start_http_server(endpoint.port, endpoint.host, registry)
        log.info("brokers metrics on http://%s:%d/metrics", endpoint.host, server.server_port)

    def stop(signum: int, frame: FrameType | None) -> None:
        stopped.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    for worker in workers:
        worker.start()
    log.info("quotastream brokers running: %s", ", ".join(worker.name for worker in workers))
    stopped.wait()
    log.info("stopping")
    if bridge is not None:
        bridge.stop()  # within a poll
    for worker in workers:
        worker.join()
    return EXIT_OK
