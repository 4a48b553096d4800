"""``quotastream brokers``: the agent next to a cluster that publishes the traffic inside its
brokers as the engine's events (``docs/brokers.md``). So far it runs the remote log bridge
(``__remote_log_metadata`` to ``remote_segment`` events)."""

from __future__ import annotations

import logging
import signal
from types import FrameType
from typing import Any

from kafka import KafkaConsumer, KafkaProducer
from prometheus_client import CollectorRegistry, start_http_server

from quotastream.brokers.bridge import BridgeTopics, RemoteLogBridge, RemoteLogBridgeMetrics
from quotastream.brokers.remote_log_metadata import RemoteLogMetadataSchemas
from streaming.commands.exit_codes import EXIT_OK
from streaming.engine.settings import EngineSettings

log = logging.getLogger(__name__)


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

    def new_producer() -> Any:
        return KafkaProducer(
            bootstrap_servers=settings.kafka.bootstrap_servers,
            acks="all",
            linger_ms=5,
            **settings.kafka.client_settings(),
        )

    return RemoteLogBridge(
        schemas,
        BridgeTopics(
            metadata=source.topic,
            events=settings.kafka.topics[0],
            dead_letter=settings.kafka.dead_letter_topic,
        ),
        new_consumer=new_consumer,
        new_producer=new_producer,
        metrics=RemoteLogBridgeMetrics(registry),
        poll_ms=source.poll_ms,
        retry_ms=brokers.retry_ms,
        max_retry_ms=brokers.max_retry_ms,
        server=f"Kafka at {cluster.bootstrap_servers}",
    )


def run_brokers(settings: EngineSettings) -> int:
    """The agent as the process's whole job, until SIGTERM or SIGINT."""
    registry = CollectorRegistry()
    bridge = build_remote_log_bridge(settings, registry)
    endpoint = settings.brokers.metrics
    if endpoint.enabled:
        server, _ = start_http_server(endpoint.port, endpoint.host, registry)
        log.info("brokers metrics on http://%s:%d/metrics", endpoint.host, server.server_port)

    def stop(signum: int, frame: FrameType | None) -> None:
        log.info("stopping")
        bridge.stop()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    bridge.run()  # a signal's stop ends it within a poll
    return EXIT_OK
