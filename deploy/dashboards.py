"""Grafana dashboards for quotastream, built with Grafana's foundation SDK.

``python -m deploy.dashboards`` writes them to conf/grafana/dashboards/ (committed; a test
checks the committed JSON equals this module's output). Queries use only the metric names in
:mod:`deploy.metrics`.

The data source is ``${DS_PROMETHEUS}`` everywhere, in Grafana's two ways of filling it in: each
dashboard declares it in ``__inputs`` (Grafana's import asks which Prometheus to use and writes
its uid in), and has a data source variable of that name (provisioned from files, where no import
runs, it resolves to the default Prometheus: the provisioned one in compose).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from grafana_foundation_sdk.builders import (
    bargauge,
    common,
    dashboard,
    prometheus,
    stat,
    timeseries,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_models
from grafana_foundation_sdk.models import dashboard as dashboard_models

DASHBOARD_DIR: Final = Path(__file__).resolve().parent.parent / "conf" / "grafana" / "dashboards"
DATASOURCE_INPUT: Final = "DS_PROMETHEUS"
DATASOURCE: Final = dashboard_models.DataSourceRef(
    type_val="prometheus", uid=f"${{{DATASOURCE_INPUT}}}"
)
TAGS: Final = ["quotastream"]

# Selectors shared by the panels; $quota and $entity are the dashboards' variables.
SELECTED = 'quota=~"$quota", entity=~"$entity"'
REPLICATION = 'quota=~".*_replication"'

Query = tuple[str, str]
"""A PromQL expression and its legend."""


def _targets(queries: Sequence[Query], *, instant: bool = False) -> list[prometheus.Dataquery]:
    targets = []
    for index, (expr, legend) in enumerate(queries):
        target = (
            prometheus.Dataquery()
            .expr(expr)
            .legend_format(legend)
            .ref_id(chr(ord("A") + index))
            .datasource(DATASOURCE)
        )
        targets.append(target.instant() if instant else target.range())
    return targets


def _thresholds(*steps: tuple[float | None, str]) -> dashboard.ThresholdsConfig:
    return (
        dashboard.ThresholdsConfig()
        .mode(dashboard_models.ThresholdsMode.ABSOLUTE)
        .steps([dashboard_models.Threshold(value=value, color=color) for value, color in steps])
    )


def _series(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[Query],
    *,
    width: int = 12,
    height: int = 8,
    limit_line: float | None = None,
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(height)
        .fill_opacity(10)
        .legend(
            common.VizLegendOptions()
            .display_mode(common_models.LegendDisplayMode.TABLE)
            .placement(common_models.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
        .tooltip(common.VizTooltipOptions().mode(common_models.TooltipDisplayMode.MULTI))
    )
    for target in _targets(queries):
        panel = panel.with_target(target)
    if limit_line is not None:
        panel = panel.thresholds(
            _thresholds((None, "green"), (limit_line, "red"))
        ).thresholds_style(
            common.GraphThresholdsStyleConfig().mode(common_models.GraphThresholdsStyleMode.LINE)
        )
    return panel


def _stat(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[Query],
    *,
    width: int = 6,
    red_at: float | None = None,
) -> stat.Panel:
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(4)
        .graph_mode(common_models.BigValueGraphMode.AREA)
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    if red_at is not None:
        panel = panel.thresholds(_thresholds((None, "green"), (red_at, "red")))
    for target in _targets(queries):
        panel = panel.with_target(target)
    return panel


def _top(
    title: str, description: str, unit: str, query: Query, *, width: int = 24
) -> bargauge.Panel:
    panel = (
        bargauge.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(10)
        .min(0)
        .orientation(common_models.VizOrientation.HORIZONTAL)
        .display_mode(common_models.BarGaugeDisplayMode.GRADIENT)
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .thresholds(_thresholds((None, "green"), (0.8, "orange"), (1.0, "red")))
    )
    for target in _targets([query], instant=True):
        panel = panel.with_target(target)
    return panel


def _label_variable(
    name: str, label: str, query: str, *, include_all: bool = True
) -> dashboard.QueryVariable:
    variable = (
        dashboard.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(dashboard_models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard_models.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
    )
    if include_all:
        variable = (
            variable.include_all(True)
            .all_value(".*")
            .current(dashboard_models.VariableOption(selected=True, text="All", value="$__all"))
        )
    return variable


def _dashboard(uid: str, title: str, description: str) -> dashboard.Dashboard:
    return (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .editable()
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .with_variable(
            dashboard.DatasourceVariable(DATASOURCE_INPUT).label("Data source").type("prometheus")
        )
    )


def _with_inputs(board: dict[str, object]) -> dict[str, object]:
    """The dashboard as Grafana exports one for sharing: its data source as an import input."""
    inputs = [
        {
            "name": DATASOURCE_INPUT,
            "label": "Prometheus",
            "description": "The Prometheus that scrapes quotastream",
            "type": "datasource",
            "pluginId": "prometheus",
            "pluginName": "Prometheus",
        }
    ]
    return {"__inputs": inputs, **board}


def quotas_overview() -> dashboard.Dashboard:
    rate_vs_limit = [
        (f"quotastream_byte_rate{{{SELECTED}}}", "{{quota}} {{entity}} rate"),
        (f"quotastream_quota_limit{{{SELECTED}}}", "{{quota}} {{entity}} limit"),
    ]
    return (
        _dashboard(
            "quotastream-quotas",
            "quotastream / Quotas overview",
            "Byte rate against quota, utilisation and throttle time per entity (top-K exported).",
        )
        .with_variable(
            _label_variable("quota", "Quota", "label_values(quotastream_byte_rate, quota)")
        )
        .with_variable(
            _label_variable(
                "entity", "Entity", 'label_values(quotastream_byte_rate{quota=~"$quota"}, entity)'
            )
        )
        .with_variable(
            dashboard.CustomVariable("topk")
            .label("Top K")
            .values("10,20,50")
            .current(dashboard_models.VariableOption(selected=True, text="10", value="10"))
        )
        .with_panel(
            _stat(
                "Throttled entities",
                "Entities throttled now (enforced, not yet released), per quota type.",
                "short",
                [('sum by (quota) (quotastream_throttled_entities{quota=~"$quota"})', "{{quota}}")],
                width=12,
                red_at=1,
            )
        )
        .with_panel(
            _stat(
                "Highest utilisation",
                "Highest byte rate / quota among the exported entities, per quota type.",
                "percentunit",
                [
                    (
                        'max by (quota) (quotastream_quota_utilisation_ratio{quota=~"$quota"})',
                        "{{quota}}",
                    )
                ],
                width=12,
                red_at=1,
            )
        )
        .with_panel(
            _series(
                "Byte rate vs quota",
                "Kafka's windowed byte rate per entity and the quota it is held to.",
                "Bps",
                rate_vs_limit,
            )
        )
        .with_panel(
            _series(
                "Utilisation",
                "Byte rate / quota (absent for unlimited entities). Over 100% means throttled.",
                "percentunit",
                [(f"quotastream_quota_utilisation_ratio{{{SELECTED}}}", "{{quota}} {{entity}}")],
                limit_line=1,
            )
        )
        .with_panel(
            _series(
                "Throttle time",
                "Remaining enforced throttle per entity (Kafka's throttle-time).",
                "s",
                [(f"quotastream_throttle_time_seconds{{{SELECTED}}}", "{{quota}} {{entity}}")],
            )
        )
        .with_panel(
            _series(
                "Throttled entities over time",
                "Entities throttled at each moment, per quota type.",
                "short",
                [('sum by (quota) (quotastream_throttled_entities{quota=~"$quota"})', "{{quota}}")],
            )
        )
        .with_panel(
            _series(
                "Byte rate by user",
                "Produce and fetch byte rate summed per user (Kafka's user tag) over the "
                "exported entities; client-id-only counters have no user.",
                "Bps",
                [
                    (
                        'sum by (quota, user) (quotastream_byte_rate{quota=~"$quota", '
                        'quota=~"produce|fetch", user!=""})',
                        "{{quota}} {{user}}",
                    )
                ],
                width=24,
            )
        )
        .with_panel(
            _series(
                "Requests by quota",
                "Requests per second the accepted events stood for (their count, docs/events.md), "
                "per quota type.",
                "reqps",
                [
                    (
                        "sum by (quota) "
                        '(rate(quotastream_requests_total{quota=~"$quota"}[$__rate_interval]))',
                        "{{quota}}",
                    )
                ],
                width=24,
            )
        )
        .with_panel(
            _top(
                "Top $topk entities by utilisation",
                "The entities nearest (or over) their quota now.",
                "percentunit",
                (
                    'topk($topk, quotastream_quota_utilisation_ratio{quota=~"$quota"})',
                    "{{quota}} {{entity}}",
                ),
            )
        )
    )


def replication() -> dashboard.Dashboard:
    def rate_vs_throttle(quota: str) -> list[Query]:
        selector = f'quota="{quota}", broker=~"$broker"'
        return [
            (f"quotastream_byte_rate{{{selector}}}", "{{entity}} rate"),
            (f"quotastream_quota_limit{{{selector}}}", "{{entity}} throttle"),
        ]

    stalled = (
        f"(quotastream_quota_limit{{{REPLICATION}}} > 0)"
        f" unless on (quota, entity) (quotastream_byte_rate{{{REPLICATION}}} > 1024)"
    )
    return (
        _dashboard(
            "quotastream-replication",
            "quotastream / Replication throttling",
            "Leader and follower replication byte rates against the replication throttles "
            "(KIP-73) while partitions move.",
        )
        .with_variable(
            _label_variable(
                "broker",
                "Broker",
                f"label_values(quotastream_byte_rate{{{REPLICATION}}}, broker)",
            )
        )
        .with_panel(
            _stat(
                "Throttled brokers",
                "Brokers whose replication is being throttled now.",
                "short",
                [
                    (
                        f"sum by (quota) (quotastream_throttled_entities{{{REPLICATION}}})",
                        "{{quota}}",
                    )
                ],
                width=8,
            )
        )
        .with_panel(
            _stat(
                "Throttles without progress",
                "Replication throttles set while under 1 KiB/s replicates: a stalled move or a "
                "throttle left behind (alert QuotastreamReplicationMoveStalled).",
                "short",
                [(f"count({stalled}) or vector(0)", "stalled")],
                width=8,
                red_at=1,
            )
        )
        .with_panel(
            _stat(
                "Replication throughput",
                "Total leader and follower replication byte rate of the exported brokers.",
                "Bps",
                [(f"sum by (quota) (quotastream_byte_rate{{{REPLICATION}}})", "{{quota}}")],
                width=8,
            )
        )
        .with_panel(
            _series(
                "Leader replication vs throttle",
                "leader.replication.throttled.rate against the bytes leaders send to moving "
                "replicas.",
                "Bps",
                rate_vs_throttle("leader_replication"),
            )
        )
        .with_panel(
            _series(
                "Follower replication vs throttle",
                "follower.replication.throttled.rate against the bytes followers fetch.",
                "Bps",
                rate_vs_throttle("follower_replication"),
            )
        )
        .with_panel(
            _series(
                "Move progress: throttle utilisation",
                "Replication rate / throttle: near 100% a move is throttle-bound; near 0 with a "
                "throttle set it is not progressing.",
                "percentunit",
                [
                    (
                        f'quotastream_quota_utilisation_ratio{{{REPLICATION}, broker=~"$broker"}}',
                        "{{quota}} {{entity}}",
                    )
                ],
                limit_line=1,
            )
        )
        .with_panel(
            _series(
                "Replication throttle time",
                "Remaining throttle per broker and direction.",
                "s",
                [
                    (
                        f'quotastream_throttle_time_seconds{{{REPLICATION}, broker=~"$broker"}}',
                        "{{quota}} {{entity}}",
                    )
                ],
            )
        )
    )


def tiered_storage() -> dashboard.Dashboard:
    def rate_vs_quota(quota: str) -> list[Query]:
        return [
            (f'quotastream_byte_rate{{quota="{quota}"}}', "{{entity}} rate"),
            (f'quotastream_quota_limit{{quota="{quota}"}}', "{{entity}} quota"),
        ]

    return (
        _dashboard(
            "quotastream-tiered-storage",
            "quotastream / Tiered storage",
            "Remote log copy and fetch against their quotas (KIP-956) and the remote log size.",
        )
        .with_variable(
            _label_variable(
                "topic", "Topic", "label_values(quotastream_remote_log_size_bytes, topic)"
            )
        )
        .with_panel(
            _series(
                "Remote copy vs quota",
                "Bytes/s brokers copy to remote storage against remote.log.manager.copy quota.",
                "Bps",
                rate_vs_quota("remote_copy"),
            )
        )
        .with_panel(
            _series(
                "Remote fetch vs quota",
                "Bytes/s read back from remote storage against the remote fetch quota.",
                "Bps",
                rate_vs_quota("remote_fetch"),
            )
        )
        .with_panel(
            _series(
                "Remote copy/fetch throttle time",
                "Remaining throttle of the remote log quotas.",
                "s",
                [
                    (
                        'quotastream_throttle_time_seconds{quota=~"remote_copy|remote_fetch"}',
                        "{{quota}} {{entity}}",
                    )
                ],
            )
        )
        .with_panel(
            _series(
                "Remote log size by topic",
                "Sum of RemoteLogSizeBytes over each topic's partitions.",
                "bytes",
                [
                    (
                        'sum by (topic) (quotastream_remote_log_size_bytes{topic=~"$topic"})',
                        "{{topic}}",
                    )
                ],
            )
        )
        .with_panel(
            _top(
                "Largest remote logs (partitions)",
                "The partitions with the most data in remote storage.",
                "bytes",
                (
                    'topk(10, quotastream_remote_log_size_bytes{topic=~"$topic"})',
                    "{{topic}}-{{partition}}",
                ),
            )
        )
    )


def engine_health() -> dashboard.Dashboard:
    def quantile(q: str) -> Query:
        return (
            f"histogram_quantile({q}, sum by (le) "
            "(rate(quotastream_batch_duration_seconds_bucket[$__rate_interval])))",
            f"p{q[2:]}",
        )

    return (
        _dashboard(
            "quotastream-engine",
            "quotastream / Engine health",
            "The streaming query: micro-batch duration, throughput, lag, dead letters, timers.",
        )
        .with_panel(
            _stat(
                "Last batch age",
                "Seconds since the last micro-batch finished. Old on an idle cluster too: a "
                "stall is an old batch with an input backlog (alert QuotastreamEngineStalled).",
                "s",
                [("time() - quotastream_last_batch_timestamp_seconds", "age")],
                red_at=120,
            )
        )
        .with_panel(
            _stat(
                "Event lag",
                "Write time minus the newest event time decided in the last batch.",
                "s",
                [("quotastream_event_lag_seconds", "lag")],
                red_at=30,
            )
        )
        .with_panel(
            _stat(
                "Dead letters",
                "Events rejected to the dead-letter topic per second.",
                "reqps",
                [("sum(rate(quotastream_dead_letter_events_total[$__rate_interval]))", "rejected")],
                red_at=0.001,
            )
        )
        .with_panel(
            _stat(
                "Config version",
                "Live configuration version of the newest decision.",
                "none",
                [("quotastream_config_version", "version")],
            )
        )
        .with_panel(
            _series(
                "Micro-batch duration",
                "Trigger execution time (compare with spark.trigger_ms).",
                "s",
                [quantile("0.5"), quantile("0.99")],
            )
        )
        .with_panel(
            _series(
                "Input and processing rate",
                "Kafka records read per second, and what the last batch read per second of its"
                " run: the engine keeps up while the first stays below the second.",
                "reqps",
                [
                    (
                        "quotastream_processed_records_per_second",
                        "last batch, records/s of its run",
                    ),
                    (
                        "sum(rate(quotastream_input_events_total[$__rate_interval]))",
                        "records read/s",
                    ),
                ],
            )
        )
        .with_panel(
            _series(
                "Event lag",
                "Event-to-decision lag.",
                "s",
                [("quotastream_event_lag_seconds", "lag")],
                limit_line=30,
            )
        )
        .with_panel(
            _series(
                "Dead letters by reason",
                "Rejected events per second by the validator's reason (docs/events.md).",
                "reqps",
                [
                    (
                        "sum by (reason) "
                        "(rate(quotastream_dead_letter_events_total[$__rate_interval]))",
                        "{{reason}}",
                    )
                ],
            )
        )
        .with_panel(
            _series(
                "Redis write failures",
                "Failed Redis write attempts per second (retried with backoff; alert "
                "QuotastreamRedisWriteFailures).",
                "reqps",
                [
                    (
                        "sum(rate(quotastream_redis_write_failures_total[$__rate_interval]))",
                        "failed attempts/s",
                    )
                ],
            )
        )
        .with_panel(
            _series(
                "Decisions written to Redis",
                "Decisions per second, by whether Redis needed them: written (throttles, their "
                "ends, near the limit, a changed limit, mode or version) or not (they read as "
                "the key does; docs/redis.md).",
                "reqps",
                [
                    (
                        "sum by (written) (rate(quotastream_decisions_total[$__rate_interval]))",
                        "written={{written}}",
                    )
                ],
            )
        )
        .with_panel(
            _series(
                "Source data loss",
                "Kafka partitions whose log restarted below the offsets read (alert "
                "QuotastreamSourceDataLoss).",
                "short",
                [
                    (
                        "sum by (topic, partition) "
                        "(increase(quotastream_source_data_loss_total[$__rate_interval]))",
                        "{{topic}}-{{partition}}",
                    )
                ],
            )
        )
        .with_panel(
            _series(
                "Kafka unreachable",
                "How long the Kafka source has found the brokers unreachable (0: they answer) "
                "and outages begun; the query fails after kafka.max_outage_s (alert "
                "QuotastreamKafkaUnreachable).",
                "s",
                [
                    ("max(quotastream_kafka_outage_seconds)", "unreachable for"),
                    ("sum(increase(quotastream_kafka_outages_total[$__rate_interval]))", "outages"),
                ],
                width=24,
            )
        )
        .with_panel(
            _series(
                "Throttle timers",
                "Pending throttle-release timers (all shards) and timers fired or cancelled/s.",
                "short",
                [
                    ("quotastream_timers_pending", "pending"),
                    ("rate(quotastream_timers_fired_total[$__rate_interval])", "fired/s"),
                    ("rate(quotastream_timers_cancelled_total[$__rate_interval])", "cancelled/s"),
                ],
                width=24,
            )
        )
        .with_panel(
            _series(
                "Input backlog",
                "Records in the events topics not read yet, asked of Kafka at each scrape. With "
                "an old last batch it means a stalled engine, not an idle cluster (alert "
                "QuotastreamEngineStalled).",
                "short",
                [("quotastream_input_backlog_records", "unread records")],
            )
        )
        .with_panel(
            _series(
                "Agent answers by source",
                "Lookups the enforcement agents answered per second (job quotastream-agents): "
                "fresh, cached, stale, and by the failure policy when Redis cannot be read "
                "(alert QuotastreamAgentsFailing).",
                "reqps",
                [
                    (
                        "sum by (source) (rate(quotastream_agent_answers_total[$__rate_interval]))",
                        "{{source}}",
                    )
                ],
            )
        )
    )


def _per_second(metric: str, by: str, legend: str) -> Query:
    """A counter's rate summed ``by`` labels, with its legend."""
    return (f"sum by ({by}) (rate({metric}[$__rate_interval]))", legend)


def proxy() -> dashboard.Dashboard:
    return (
        _dashboard(
            "quotastream-proxy",
            "quotastream / Proxy",
            "quotastream proxy (docs/proxy.md): client traffic forwarded to the brokers, clients "
            "held by the engine's decisions, usage events published to the engine.",
        )
        .with_panel(
            _stat(
                "Connections",
                "Client connections open through the proxies.",
                "none",
                [("sum(quotastream_proxy_connections)", "open")],
            )
        )
        .with_panel(
            _stat(
                "Brokers",
                "Brokers each proxy has a port for (from the latest Metadata response).",
                "none",
                [("max(quotastream_proxy_brokers)", "brokers")],
            )
        )
        .with_panel(
            _stat(
                "Usage events dropped (1h)",
                "Usage events that could not be published: clients were not held for those "
                "bytes (alert QuotastreamProxyDroppingUsage).",
                "none",
                [("sum(increase(quotastream_proxy_events_dropped_total[1h]))", "dropped")],
                red_at=1,
            )
        )
        .with_panel(
            _stat(
                "Emptied fetches/s",
                "Fetch responses over a client's quota, answered empty as a broker answers them.",
                "none",
                [
                    (
                        "sum(rate(quotastream_proxy_emptied_fetches_total[$__rate_interval]))",
                        "emptied",
                    )
                ],
            )
        )
        .with_panel(
            _series(
                "Requests/s by API",
                "Requests forwarded to the brokers.",
                "reqps",
                [_per_second("quotastream_proxy_requests_total", "api", "{{api}}")],
            )
        )
        .with_panel(
            _series(
                "Bytes/s by API",
                "Frame bytes forwarded: requests to the brokers, responses to the clients.",
                "Bps",
                [
                    _per_second(
                        "quotastream_proxy_bytes_total", "api, direction", "{{api}} {{direction}}"
                    )
                ],
            )
        )
        .with_panel(
            _series(
                "Clients held",
                "Produce and Fetch responses whose throttle the engine's decision raised, and "
                "connection-seconds muted per second (about the connections held at a time).",
                "none",
                [
                    _per_second(
                        "quotastream_proxy_throttled_responses_total", "api", "{{api}} throttled/s"
                    ),
                    _per_second("quotastream_proxy_held_seconds_total", "job", "connections held"),
                ],
            )
        )
        .with_panel(
            _series(
                "Usage events",
                "Usage events the events topic acknowledged, and those dropped by reason with the "
                "client bytes they counted.",
                "none",
                [
                    _per_second("quotastream_proxy_events_published_total", "job", "published/s"),
                    _per_second(
                        "quotastream_proxy_events_dropped_total", "reason", "dropped/s {{reason}}"
                    ),
                    _per_second(
                        "quotastream_proxy_counted_bytes_dropped_total",
                        "reason",
                        "bytes dropped/s {{reason}}",
                    ),
                ],
            )
        )
        .with_panel(
            _series(
                "Connections accepted and closed",
                "Client connections accepted, and closed by reason (malformed frames, broker "
                "gone, drained at shutdown, ...).",
                "none",
                [
                    _per_second(
                        "quotastream_proxy_connections_accepted_total", "job", "accepted/s"
                    ),
                    _per_second(
                        "quotastream_proxy_connections_closed_total",
                        "reason",
                        "closed/s {{reason}}",
                    ),
                ],
            )
        )
        .with_panel(
            _series(
                "Decision lookups by source",
                "How the proxies' cached clients answered (fresh, cached, stale, fail_open, "
                "fail_closed; alert QuotastreamAgentsFailing), and whether Redis is reachable.",
                "none",
                [
                    _per_second(
                        'quotastream_agent_answers_total{job="quotastream-proxy"}',
                        "source",
                        "{{source}}/s",
                    ),
                    (
                        'min(quotastream_agent_redis_up{job="quotastream-proxy"})',
                        "Redis up (all proxies)",
                    ),
                ],
            )
        )
    )


def brokers() -> dashboard.Dashboard:
    return (
        _dashboard(
            "quotastream-brokers",
            "quotastream / Brokers agent",
            "quotastream brokers (docs/brokers.md): __remote_log_metadata published as events "
            "(the remote log bridge) with each tiered partition's lineage, the brokers' "
            "counters published as counts (the metrics source), and the engine's throttles set "
            "on the brokers (the actuator).",
        )
        .with_panel(
            _stat(
                "Metadata records behind",
                "Records of __remote_log_metadata the bridge has not read yet.",
                "none",
                [("sum(quotastream_remote_log_records_behind)", "behind")],
            )
        )
        .with_panel(
            _stat(
                "Segments followed",
                "Remote segments whose upload started and that are not deleted yet.",
                "none",
                [("sum(quotastream_remote_log_segments_followed)", "segments")],
            )
        )
        .with_panel(
            _stat(
                "Throttles set",
                "Throttle configs the actuator has set on the brokers and topics.",
                "none",
                [("sum(quotastream_actuator_throttles)", "set")],
            )
        )
        .with_panel(
            _stat(
                "Reassignments",
                "Topics with a partition reassignment running, as the actuator last saw them.",
                "none",
                [("max(quotastream_actuator_reassignments)", "running")],
            )
        )
        .with_panel(
            _series(
                "Events published",
                "Events the bridge published: each upload's remote_copy, and the segments' "
                "copy_finished and delete_finished; copies too old for the engine, counted. "
                "Partition lineages (leader_epochs) published, and walks a leader refused "
                "mid-way (it moved; walked again next interval).",
                "none",
                [
                    _per_second(
                        "quotastream_remote_log_events_published_total", "event", "{{event}}/s"
                    ),
                    _per_second("quotastream_remote_log_copies_too_old_total", "job", "too old/s"),
                    _per_second(
                        "quotastream_leader_epochs_reports_published_total", "job", "lineages/s"
                    ),
                    _per_second(
                        "quotastream_leader_epochs_walks_refused_total", "job", "walks refused/s"
                    ),
                ],
            )
        )
        .with_panel(
            _series(
                "Records read, dead letters, restarts",
                "Metadata records read (now: published; replayed: read again after a start to "
                "rebuild state), records sent to the dead-letter topic by reason, and passes "
                "started again after a failure.",
                "none",
                [
                    _per_second("quotastream_remote_log_records_total", "read", "{{read}}/s"),
                    _per_second(
                        "quotastream_remote_log_dead_letters_total",
                        "reason",
                        "dead letters/s {{reason}}",
                    ),
                    _per_second("quotastream_remote_log_restarts_total", "job", "restarts/s"),
                ],
            )
        )
        .with_panel(
            _series(
                "Counts from the brokers' metrics",
                "remote_fetch and replication counts published from the brokers' exporters, "
                "counts dropped (the events topic unreachable past the backlog) and waiting, "
                "and failed scrapes by broker (an exporter down).",
                "none",
                [
                    _per_second(
                        "quotastream_broker_metrics_events_published_total", "kind", "{{kind}}/s"
                    ),
                    _per_second(
                        "quotastream_broker_metrics_events_dropped_total", "job", "dropped/s"
                    ),
                    ("sum(quotastream_broker_metrics_backlog)", "waiting"),
                    (
                        "sum by (broker) (rate(quotastream_broker_metrics_scrapes_total"
                        '{outcome="failed"}[$__rate_interval]))',
                        "failed scrapes/s broker {{broker}}",
                    ),
                ],
                width=24,
            )
        )
        .with_panel(
            _series(
                "Throttle changes",
                "Changes the actuator made to the brokers' configs (or, dry run, would have), by "
                "key and operation; changes Kafka refused (an unknown topic, an invalid value: "
                "tried again every pass, so a lasting refusal stays above 0); and passes that "
                "failed.",
                "none",
                [
                    _per_second(
                        "quotastream_actuator_changes_total",
                        "key, op, dry_run",
                        "{{op}} {{key}} (dry run: {{dry_run}})",
                    ),
                    _per_second(
                        "quotastream_actuator_refused_changes_total",
                        "key, op",
                        "refused {{op}} {{key}}",
                    ),
                    _per_second("quotastream_actuator_failures_total", "job", "failed passes/s"),
                ],
                width=24,
            )
        )
    )


DASHBOARDS: Final = {
    "quotas-overview.json": quotas_overview,
    "replication-throttling.json": replication,
    "tiered-storage.json": tiered_storage,
    "engine-health.json": engine_health,
    "proxy.json": proxy,
    "brokers.json": brokers,
}


def render() -> dict[str, str]:
    """Each dashboard file's name and its JSON text, as committed."""
    return {
        name: json.dumps(
            _with_inputs(json.loads(json.dumps(build().build(), cls=JSONEncoder))),
            indent=2,
            sort_keys=True,
        )
        + "\n"
        for name, build in DASHBOARDS.items()
    }


def main(argv: Sequence[str] | None = None) -> int:
    out = Path(argv[0]) if argv else DASHBOARD_DIR
    out.mkdir(parents=True, exist_ok=True)
    for name, text in render().items():
        (out / name).write_text(text)
        print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
