"""Checks made before the engine starts anything: every server it needs answers, as configured.

A Kafka or Redis that is down, refuses the login or forbids the engine's reads and writes is
reported naming its endpoint, before Spark, the exporter or the checkpoint are touched, rather
than as a failed micro-batch after the query started.

Kafka's rights are read, not tried: the broker's Metadata answer (v8+, KIP-430) lists, for each
topic, the operations the calling principal is authorized for. So the check writes no record
(there is no empty produce to try a WRITE with), needs no right of its own (a principal may not
describe its own ACLs), and sees exactly what the authorizer decides, implied rights included.
A denied right is reported in one line naming the principal, the operation and the topic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import redis
from kafka import KafkaConsumer
from kafka.admin import KafkaAdminClient
from kafka.errors import KafkaError, TopicAuthorizationFailedError
from redis.backoff import NoBackoff
from redis.retry import Retry

from quotastream.clock import SYSTEM_CLOCK
from quotastream.outage import first_line
from streaming.engine.client_settings import settings_for
from streaming.engine.config_log import ConfigLog, ConfigLogError, MisshapenTopicError
from streaming.engine.settings import EngineSettings, KafkaSettings, RedisSettings

#: How long each server may take to answer.
DEFAULT_TIMEOUT_S = 10.0

#: Kafka's operation names, as the broker reports a principal's authorized operations.
READ: Final = "READ"
WRITE: Final = "WRITE"
DESCRIBE: Final = "DESCRIBE"
DESCRIBE_CONFIGS: Final = "DESCRIBE_CONFIGS"
CREATE: Final = "CREATE"
#: Operations that imply DESCRIBE in Kafka's authorizer: a principal that may not even describe
#: a topic is certainly denied these on it (and of the others nothing can be known).
_IMPLY_DESCRIBE: Final = frozenset({READ, WRITE, "DELETE", "ALTER"})
#: Kafka's name for the error a denied topic operation answers with.
_TOPIC_DENIED: Final = "TOPIC_AUTHORIZATION_FAILED"
#: SASL mechanisms whose principal is ``User:`` and the user name (Kafka's default builder).
_USER_NAME_MECHANISMS: Final = frozenset({"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"})


class UnreachableError(RuntimeError):
    """A server the engine needs did not answer or refused it; the message names the endpoint."""


def check_servers(settings: EngineSettings, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Raises :class:`UnreachableError`, or ``MisshapenTopicError`` for a configuration topic
    that is not what it must be (a configuration error: exit 2, not 3)."""
    kafka = settings.kafka
    check_kafka(kafka, timeout_s)
    # Rights first: a principal denied several is told all of them at once.
    missing = check_kafka_rights(kafka, timeout_s)
    check_config_topic(kafka, timeout_s)
    if kafka.config_topic is not None and kafka.config_topic in missing:
        # Created just now: only now has it rights to read.
        check_kafka_rights(kafka, timeout_s, only=(kafka.config_topic,))
    check_redis(settings.redis, timeout_s)


def check_kafka(kafka: KafkaSettings, timeout_s: float) -> None:
    where = f"Kafka at {kafka.bootstrap_servers}"
    timeout_ms = int(timeout_s * 1000)
    try:
        consumer = KafkaConsumer(
            **settings_for(
                KafkaConsumer,
                kafka.client_settings(),
                bootstrap_servers=kafka.bootstrap_servers.split(","),
                bootstrap_timeout_ms=timeout_ms,
                request_timeout_ms=max(timeout_ms, 1001),
                # No group, nothing to commit (kafka-python warns when it has to turn this off).
                enable_auto_commit=False,
            )
        )
    except KafkaError as exc:
        raise UnreachableError(f"{where}: {first_line(exc)}") from None
    try:
        consumer.topics()
    except KafkaError as exc:
        raise UnreachableError(f"{where}: {first_line(exc)}") from None
    finally:
        consumer.close()


def engine_rights(kafka: KafkaSettings) -> dict[str, tuple[str, ...]]:
    """The operations the engine performs on each of its topics, as Kafka's ACLs name them.

    * READ on each events topic: the source fetches them. READ implies DESCRIBE, which the
      partition lists and the offsets (ListOffsets) of the source and the exporter need.
    * WRITE on the dead-letter topic: the sink produces to it. WRITE implies DESCRIBE, and a
      principal that may write any topic may also start the idempotent producer
      (InitProducerId; KIP-679): no IDEMPOTENT_WRITE on the cluster.
    * READ on the configuration topic (the live versions), and DESCRIBE_CONFIGS on it: its
      retention is checked at every start, and kafka-python reports a denied DescribeConfigs
      as no configuration at all, which would pass a topic that deletes old versions.

    CREATE on the configuration topic only where it is missing (the engine then makes it): not
    read here but tried by :func:`check_config_topic`, as the right may be granted on the
    cluster instead, which a topic's operations do not show.
    The engine never writes the configuration topic (``quotastream quota`` commands do) and
    uses no consumer group (its consumers are assigned their partitions).
    """
    rights: dict[str, tuple[str, ...]] = {}

    def need(topic: str, *operations: str) -> None:
        rights[topic] = (*rights.get(topic, ()), *operations)

    for topic in kafka.topics:
        need(topic, READ)
    need(kafka.dead_letter_topic, WRITE)
    if kafka.config_topic is not None:
        need(kafka.config_topic, READ, DESCRIBE_CONFIGS)
    return rights


def check_kafka_rights(
    kafka: KafkaSettings, timeout_s: float, only: Iterable[str] | None = None
) -> set[str]:
    """Refuses a principal the broker denies any of :func:`engine_rights` (``only``: on these
    topics). Returns the topics that do not exist: nothing is known of their rights yet (the
    engine creates its configuration topic; the broker may create the others when they are
    first written)."""
    where = f"Kafka at {kafka.bootstrap_servers}"
    rights = engine_rights(kafka)
    if only is not None:
        rights = {topic: rights[topic] for topic in only}
    timeout_ms = int(timeout_s * 1000)
    client = kafka.client_settings()
    settings = settings_for(
        KafkaAdminClient,
        client,
        bootstrap_servers=kafka.bootstrap_servers.split(","),
        bootstrap_timeout_ms=timeout_ms,
        request_timeout_ms=max(timeout_ms, 1001),
    )
    try:
        admin = KafkaAdminClient(**settings)
    except KafkaError as exc:
        raise UnreachableError(f"{where}: {first_line(exc)}") from None
    try:
        # Metadata with each topic's authorized operations: read-only, and no topic is created.
        described = {topic["name"]: topic for topic in admin.describe_topics(list(rights))}
    except KafkaError as exc:
        raise UnreachableError(f"{where}: {first_line(exc)}") from None
    finally:
        admin.close()
    denied: list[str] = []
    missing: set[str] = set()
    for topic, operations in rights.items():
        found = described.get(topic, {})
        if found.get("error_code") == TopicAuthorizationFailedError.errno:
            denied += [
                f"{operation} topic {topic!r} ({_TOPIC_DENIED})"
                for operation in operations
                if operation in _IMPLY_DESCRIBE
            ]
            continue
        allowed = found.get("authorized_operations") or []
        if DESCRIBE not in allowed:
            # No such topic, or a broker that does not report operations (Metadata < v8):
            # nothing to judge by. A describable topic always lists DESCRIBE.
            missing.add(topic)
            continue
        denied += [
            f"{operation} topic {topic!r} (allowed there: {', '.join(sorted(allowed))})"
            for operation in operations
            if operation not in allowed
        ]
    if denied:
        raise UnreachableError(f"{where}: {principal(client)} may not {', '.join(denied)}")
    return missing


def principal(client: Mapping[str, Any]) -> str:
    """Who the broker takes the engine's clients for, as ACLs name it (Kafka's default
    principal builder): the SASL user, else the client certificate's subject, else ANONYMOUS.
    Only the user of a SASL PLAIN or SCRAM login is known here by name."""
    protocol = str(client.get("security_protocol") or "PLAINTEXT").upper()
    if protocol.startswith("SASL_"):
        mechanism = str(client.get("sasl_mechanism") or "PLAIN").upper()
        user = client.get("sasl_plain_username")
        if mechanism in _USER_NAME_MECHANISMS and user:
            return f"User:{user}"
        return f"the engine's {mechanism} principal"
    if protocol == "SSL" and client.get("ssl_certfile"):
        return f"the principal of the client certificate {client['ssl_certfile']}"
    return "User:ANONYMOUS"


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
    except TopicAuthorizationFailedError:
        # Only its CreateTopics request, made when the topic is missing, can be denied so (the
        # other requests either report no topic or drop the error).
        who = principal(kafka.client_settings())
        raise UnreachableError(
            f"Kafka at {kafka.bootstrap_servers}: {who} may not {CREATE} topic "
            f"{kafka.config_topic!r} ({_TOPIC_DENIED})"
        ) from None
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
        client.set(f"{settings.key_prefix}:engine:started", SYSTEM_CLOCK.wall_ms(), px=1000)
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
