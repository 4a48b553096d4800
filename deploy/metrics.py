"""The metric names the dashboards and the Prometheus rules may use.

The names come from the code that exports them, so there is one list each: the engine's exporter
(:data:`streaming.engine.metric_names.METRICS`), the enforcement agents' cached client
(:class:`quotastream.CachedQuotaClient` with a ``registry``), ``quotastream proxy``
(:class:`quotastream.proxy.metrics.ProxyMetrics`) and ``quotastream brokers`` (its bridge's and
actuator's metrics). The tests check that every
dashboard query and every rule reads only these names (plus the recording rules' own outputs and
Prometheus's ``up``), so a renamed metric fails the build here rather than leaving an empty panel
or an alert that never fires.
"""

from __future__ import annotations

from typing import Final

import redis
from prometheus_client import CollectorRegistry

from quotastream.brokers.actuator import ActuatorMetrics
from quotastream.brokers.bridge import RemoteLogBridgeMetrics
from quotastream.brokers.broker_metrics import ScrapeMetrics
from quotastream.brokers.lineage import LineageMetrics
from quotastream.cache import CachedQuotaClient
from quotastream.client import QuotaClient
from quotastream.proxy.metrics import ProxyMetrics
from streaming.engine.metric_names import METRICS, QUOTAS

CONTRACT_METRIC_NAMES: Final = frozenset(METRICS)
"""Every metric name the exporter promises (the single list the tests compare against)."""

HISTOGRAMS: Final = frozenset(name for name, (kind, _) in METRICS.items() if kind == "histogram")
QUOTA_TYPES: Final = QUOTAS


def agent_metric_names() -> frozenset[str]:
    """The names an agent's cached client registers, as exposed (counters with ``_total``).

    Read from a client's own registry; the Redis client it wraps is never connected.
    """
    registry = CollectorRegistry()
    CachedQuotaClient(QuotaClient(redis.Redis()), registry=registry)
    return _exposed(registry)


def proxy_metric_names() -> frozenset[str]:
    """The names ``quotastream proxy`` registers (its cached client's are the agents')."""
    registry = CollectorRegistry()
    ProxyMetrics(registry)
    return _exposed(registry)


def brokers_metric_names() -> frozenset[str]:
    """The names ``quotastream brokers`` registers: its remote log bridge's, lineage source's,
    actuator's and metrics source's."""
    registry = CollectorRegistry()
    RemoteLogBridgeMetrics(registry)
    LineageMetrics(registry)
    ActuatorMetrics(registry)
    ScrapeMetrics(registry)
    return _exposed(registry)


def _exposed(registry: CollectorRegistry) -> frozenset[str]:
    return frozenset(
        f"{family.name}_total" if family.type == "counter" else family.name
        for family in registry.collect()
    )


def queryable_names() -> frozenset[str]:
    """The names a PromQL query may select: the engine's, the agents', the proxy's and
    ``quotastream brokers``' metrics, and each histogram's series."""
    suffixes = ("_bucket", "_sum", "_count")
    return (
        CONTRACT_METRIC_NAMES
        | agent_metric_names()
        | proxy_metric_names()
        | brokers_metric_names()
        | {h + s for h in HISTOGRAMS for s in suffixes}
    )
