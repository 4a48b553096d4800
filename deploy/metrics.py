"""The exporter's metric names, as the dashboards and the Prometheus rules use them.

The names come from the exporter itself (:data:`streaming.metrics.METRICS`), so there is one list.
The tests check that every dashboard query and every rule reads only these names (plus the
recording rules' own outputs and Prometheus's ``up``), so a renamed metric fails the build here
rather than leaving an empty panel.
"""

from __future__ import annotations

from typing import Final

from streaming.metrics import METRICS, QUOTAS

CONTRACT_METRIC_NAMES: Final = frozenset(METRICS)
"""Every metric name the exporter promises (the single list the tests compare against)."""

HISTOGRAMS: Final = frozenset(name for name, (kind, _) in METRICS.items() if kind == "histogram")
QUOTA_TYPES: Final = QUOTAS


def queryable_names() -> frozenset[str]:
    """The names a PromQL query may select: the contract plus each histogram's series."""
    suffixes = ("_bucket", "_sum", "_count")
    return CONTRACT_METRIC_NAMES | {h + s for h in HISTOGRAMS for s in suffixes}
