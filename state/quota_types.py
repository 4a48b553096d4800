"""The quota types quotastream decides, and how Kafka measures each of them."""

from __future__ import annotations

from enum import StrEnum


class QuotaType(StrEnum):
    PRODUCE = "produce"
    FETCH = "fetch"
    REMOTE_COPY = "remote_copy"
    REMOTE_FETCH = "remote_fetch"
    LEADER_REPLICATION = "leader_replication"
    FOLLOWER_REPLICATION = "follower_replication"


class WindowRule(StrEnum):
    """How the elapsed window is measured (Kafka's ``Rate`` vs ``SimpleRate``)."""

    # Client quotas: a fresh entity is measured over (samples - 1) full windows.
    RATE = "rate"
    # Replication and remote-log quotas: a fresh entity is measured over one window.
    SIMPLE_RATE = "simple_rate"


WINDOW_RULE: dict[QuotaType, WindowRule] = {
    QuotaType.PRODUCE: WindowRule.RATE,
    QuotaType.FETCH: WindowRule.RATE,
    QuotaType.REMOTE_COPY: WindowRule.SIMPLE_RATE,
    QuotaType.REMOTE_FETCH: WindowRule.SIMPLE_RATE,
    QuotaType.LEADER_REPLICATION: WindowRule.SIMPLE_RATE,
    QuotaType.FOLLOWER_REPLICATION: WindowRule.SIMPLE_RATE,
}

CLIENT_QUOTA_TYPES = (QuotaType.PRODUCE, QuotaType.FETCH)
