"""Names in Redis that the engine writes and agents read (``docs/redis.md``)."""

from __future__ import annotations

from state.quota_types import QuotaType


def decision_key(prefix: str, quota: str, entity: str) -> str:
    """The key holding an entity's latest decision."""
    return f"{prefix}:{quota}:{entity}"


def release_channel(prefix: str, quota: str, entity: str) -> str:
    """The pub/sub channel where the end of an entity's throttle is announced."""
    return f"{prefix}:released:{quota}:{entity}"


def timers_key(prefix: str) -> str:
    """The hash of per-shard timer counts."""
    return f"{prefix}:timers"


def remote_log_key(prefix: str, topic: str, partition: int) -> str:
    """The key holding a partition's remote log sizes (KIP-852)."""
    return f"{prefix}:remote_log_size:{topic}:{partition}"


def live_config_key(prefix: str) -> str:
    """The key holding the live configuration the engine decides with (version and document)."""
    return f"{prefix}:live_config"


def live_config_version_key(prefix: str) -> str:
    """The key holding only the identity of :func:`live_config_key`'s document: what agents
    read to notice a change."""
    return f"{prefix}:live_config_version"


def decision_patterns(prefix: str) -> list[str]:
    """``SCAN MATCH`` patterns that find every decision key, and nothing else."""
    return [f"{prefix}:{quota.value}:*" for quota in QuotaType]
