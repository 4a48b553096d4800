"""Checks made before the engine starts anything: every server it needs answers, as configured.

A Kafka or Redis that is down, refuses the login or forbids the engine's writes is reported
naming its endpoint, before Spark, the exporter or the checkpoint are touched, rather than as a
failed micro-batch after the query started.
"""

from __future__ import annotations

import time

import redis
from kafka import KafkaConsumer
from kafka.errors import KafkaError
from redis.backoff import NoBackoff
from redis.retry import Retry

from quotastream.outage import first_line
from streaming.engine.config_log import ConfigLog, ConfigLogError, MisshapenTopicError
from streaming.engine.settings import EngineSettings, KafkaSettings, RedisSettings

#: How long each server may take to answer.
DEFAULT_TIMEOUT_S = 10.0


class UnreachableError(RuntimeError):
    """A server the engine needs did not answer or refused it; the message names the endpoint."""


def check_servers(settings: EngineSettings, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Raises :class:`UnreachableError`, or ``MisshapenTopicError`` for a configuration topic
    that is not what it must be (a configuration error: exit 2, not 3)."""
    check_kafka(settings.kafka, timeout_s)
    check_config_topic(settings.kafka, timeout_s)
    check_redis(settings.redis, timeout_s)


def check_kafka(kafka: KafkaSettings, timeout_s: float) -> None:
    where = f"Kafka at {kafka.bootstrap_servers}"
    timeout_ms = int(timeout_s * 1000)
    try:
        consumer = KafkaConsumer(
            bootstrap_servers=kafka.bootstrap_servers.split(","),
            bootstrap_timeout_ms=timeout_ms,
            request_timeout_ms=max(timeout_ms, 1001),
            # No group, nothing to commit (kafka-python warns when it has to turn this off).
            enable_auto_commit=False,
            **kafka.client_settings(),
        )
    except KafkaError as exc:
        raise UnreachableError(f"{where}: {first_line(exc)}") from None
    try:
        consumer.topics()
    except KafkaError as exc:
        raise UnreachableError(f"{where}: {first_line(exc)}") from None
    finally:
        consumer.close()


def check_config_topic(kafka: KafkaSettings, timeout_s: float) -> None:
    """The live configuration's topic exists as it must (created if missing)."""
    if kafka.config_topic is None:
        return
    config_log = ConfigLog(
        kafka.bootstrap_servers, kafka.config_topic, kafka.client_settings(), int(timeout_s * 1000)
    )
    try:
        config_log.ensure_topic()
    except MisshapenTopicError:
        raise
    except (KafkaError, ConfigLogError) as exc:
        where = f"Kafka at {kafka.bootstrap_servers}: config topic {kafka.config_topic}"
        raise UnreachableError(f"{where}: {first_line(exc)}") from None
    finally:
        config_log.close()


def check_redis(settings: RedisSettings, timeout_s: float) -> None:
    """Redis answers, takes the login and lets the engine write under its key prefix."""
    where = f"Redis at {settings.endpoint}"
    options = settings.connection() | {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": Retry(NoBackoff(), 0),
    }
    client = redis.Redis(**options)
    try:
        # A key of its own, gone in a second: proves the write permission the sink needs.
        client.set(f"{settings.key_prefix}:engine:started", int(time.time() * 1000), px=1000)
    except redis.AuthenticationError as exc:
        raise UnreachableError(f"{where}: login refused: {first_line(exc)}") from None
    except redis.ResponseError as exc:
        raise UnreachableError(
            f"{where}: may not write under {settings.key_prefix}: {first_line(exc)}"
        ) from None
    except (redis.RedisError, OSError) as exc:
        raise UnreachableError(f"{where}: {first_line(exc)}") from None
    finally:
        client.close()
