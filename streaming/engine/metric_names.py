"""The engine's metric names and labels: the contract with the alerting rules and the dashboards.

``docs/metrics.md`` describes each; :data:`METRICS` lists every one with its type and labels, and
``deploy/`` checks every dashboard query and rule against it. Nothing here measures anything:
the executors' batch summary is :mod:`streaming.engine.batch_summary`, the driver's exporter
:mod:`streaming.engine.exporter`.
"""

from __future__ import annotations

from state.entities import parse_entity_key
from state.quota_types import QuotaType

BYTE_RATE = "quotastream_byte_rate"
QUOTA_LIMIT = "quotastream_quota_limit"
QUOTA_UTILISATION = "quotastream_quota_utilisation_ratio"
THROTTLE_TIME = "quotastream_throttle_time_seconds"
THROTTLED_ENTITIES = "quotastream_throttled_entities"
REMOTE_LOG_SIZE = "quotastream_remote_log_size_bytes"
TIMERS_PENDING = "quotastream_timers_pending"
TIMERS_FIRED = "quotastream_timers_fired_total"
TIMERS_CANCELLED = "quotastream_timers_cancelled_total"
DEAD_LETTER_EVENTS = "quotastream_dead_letter_events_total"
INPUT_EVENTS = "quotastream_input_events_total"
QUOTA_REQUESTS = "quotastream_requests_total"
BATCH_DURATION = "quotastream_batch_duration_seconds"
PROCESSED_RECORDS_PER_SECOND = "quotastream_processed_records_per_second"
EVENT_LAG = "quotastream_event_lag_seconds"
CONFIG_VERSION = "quotastream_config_version"
LAST_BATCH_TIMESTAMP = "quotastream_last_batch_timestamp_seconds"
REDIS_WRITE_FAILURES = "quotastream_redis_write_failures_total"
DECISIONS = "quotastream_decisions_total"
SOURCE_DATA_LOSS = "quotastream_source_data_loss_total"
KAFKA_OUTAGE = "quotastream_kafka_outage_seconds"
KAFKA_OUTAGES = "quotastream_kafka_outages_total"
INPUT_BACKLOG = "quotastream_input_backlog_records"

#: Kafka's own names for the parts of an entity key (its metric tags, and the broker, topic and
#: partition of broker quotas), as labels: entity key part -> label. They repeat what ``entity``
#: says, so that ``sum by (user)`` works; they add no series (each is a function of ``entity``).
KAFKA_LABELS = {
    "user": "user",
    "client-id": "client_id",
    "broker": "broker",
    "topic": "topic",
    "partition": "partition",
}

#: Labels of the per-entity series; a Kafka label the entity does not have is empty.
ENTITY_LABELS = ("quota", "entity", *KAFKA_LABELS.values())

#: Every metric: name -> (type, labels). Counters are named with their ``_total`` suffix as
#: exposed; a histogram also exposes ``_bucket``, ``_sum`` and ``_count``.
METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    BYTE_RATE: ("gauge", ENTITY_LABELS),
    QUOTA_LIMIT: ("gauge", ENTITY_LABELS),
    QUOTA_UTILISATION: ("gauge", ENTITY_LABELS),
    THROTTLE_TIME: ("gauge", ENTITY_LABELS),
    THROTTLED_ENTITIES: ("gauge", ("quota",)),
    REMOTE_LOG_SIZE: ("gauge", ("topic", "partition")),
    TIMERS_PENDING: ("gauge", ()),
    TIMERS_FIRED: ("counter", ()),
    TIMERS_CANCELLED: ("counter", ()),
    DEAD_LETTER_EVENTS: ("counter", ("reason",)),
    INPUT_EVENTS: ("counter", ()),
    QUOTA_REQUESTS: ("counter", ("quota",)),
    BATCH_DURATION: ("histogram", ()),
    PROCESSED_RECORDS_PER_SECOND: ("gauge", ()),
    EVENT_LAG: ("gauge", ()),
    CONFIG_VERSION: ("gauge", ()),
    LAST_BATCH_TIMESTAMP: ("gauge", ()),
    REDIS_WRITE_FAILURES: ("counter", ()),
    DECISIONS: ("counter", ("written",)),
    SOURCE_DATA_LOSS: ("counter", ("topic", "partition")),
    KAFKA_OUTAGE: ("gauge", ()),
    KAFKA_OUTAGES: ("counter", ()),
    INPUT_BACKLOG: ("gauge", ()),
}

#: The quota label's values.
QUOTAS = tuple(quota.value for quota in QuotaType)

#: Micro-batch durations (seconds): a 1 s trigger and its usual spread.
BATCH_DURATION_BUCKETS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)


def entity_labels(quota: str, entity: str) -> list[str]:
    """The values of :data:`ENTITY_LABELS` for one entity's series."""
    parts = parse_entity_key(entity)
    return [quota, entity, *(parts.get(part, "") for part in KAFKA_LABELS)]
