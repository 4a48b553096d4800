"""The exporter's metric names, as the dashboards and the Prometheus rules use them.

This is the observability side's copy of the contract in the metrics spec (exporter in the
engine's driver, ``metrics: {host, port, top_k}``). The tests check that every dashboard query and
every rule reads only these names (plus the recording rules' own outputs and Prometheus's ``up``),
so a renamed metric fails the build here rather than leaving an empty panel.
"""

from __future__ import annotations

from typing import Final

# Per-entity gauges: labels quota (produce|fetch|remote_copy|remote_fetch|leader_replication|
# follower_replication) and entity; exported for the top ``metrics.top_k`` entities by
# utilisation per quota plus every entity throttled now.
PER_ENTITY_METRICS: Final = (
    "quotastream_byte_rate",
    "quotastream_quota_limit",
    "quotastream_quota_utilisation_ratio",
    "quotastream_throttle_time_seconds",
)
# Aggregates with bounded labels.
AGGREGATE_METRICS: Final = (
    "quotastream_throttled_entities",
    "quotastream_remote_log_size_bytes",
    "quotastream_timers_pending",
    "quotastream_timers_fired_total",
    "quotastream_timers_cancelled_total",
    "quotastream_dead_letter_events_total",
    "quotastream_input_events_total",
    "quotastream_batch_duration_seconds",
    "quotastream_input_rows_per_second",
    "quotastream_processed_rows_per_second",
    "quotastream_event_lag_seconds",
    "quotastream_config_version",
    "quotastream_last_batch_timestamp_seconds",
)
HISTOGRAMS: Final = frozenset({"quotastream_batch_duration_seconds"})

CONTRACT_METRIC_NAMES: Final = frozenset(PER_ENTITY_METRICS + AGGREGATE_METRICS)
"""Every metric name the exporter promises (the single list the tests compare against)."""

QUOTA_TYPES: Final = (
    "produce",
    "fetch",
    "remote_copy",
    "remote_fetch",
    "leader_replication",
    "follower_replication",
)


def queryable_names() -> frozenset[str]:
    """The names a PromQL query may select: the contract plus each histogram's series."""
    suffixes = ("_bucket", "_sum", "_count")
    return CONTRACT_METRIC_NAMES | {h + s for h in HISTOGRAMS for s in suffixes}
