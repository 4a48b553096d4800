"""quotastream's API for enforcement agents: read a quota decision from Redis in one round trip.

from quotastream import QuotaClient
client = QuotaClient.connect("127.0.0.1", 6379, config=load_quota_config(path))
decision = client.for_client("produce", user="alice", client_id="app1", broker=1)
if decision and decision.throttle_ms_now() > 0: ...

Agents that must not stall when Redis does use ``CachedQuotaClient`` (``docs/agents.md``).

The names below load on first use (PEP 562): the engine's Kafka source imports
``quotastream.outage`` in Spark's planning processes, which need neither Redis's client nor the
quota configuration (``streaming.engine.source_records``).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quotastream.cache import Answer, CachedQuotaClient, CacheSettings, FailurePolicy, Source
    from quotastream.client import QuotaClient
    from quotastream.redis_contract import CorruptValueError, Decision
    from state.remote_log_view import RemoteLog
    from state.timer_stats import TimerStats

#: Each public name and the module that defines it.
_DEFINED_IN = {
    "Answer": "quotastream.cache",
    "CacheSettings": "quotastream.cache",
    "CachedQuotaClient": "quotastream.cache",
    "CorruptValueError": "quotastream.redis_contract",
    "Decision": "quotastream.redis_contract",
    "FailurePolicy": "quotastream.cache",
    "QuotaClient": "quotastream.client",
    "RemoteLog": "state.remote_log_view",
    "Source": "quotastream.cache",
    "TimerStats": "state.timer_stats",
}

__all__ = [
    "Answer",
    "CacheSettings",
    "CachedQuotaClient",
    "CorruptValueError",
    "Decision",
    "FailurePolicy",
    "QuotaClient",
    "RemoteLog",
    "Source",
    "TimerStats",
]


def __getattr__(name: str) -> Any:
    module = _DEFINED_IN.get(name)
    if module is None:
        raise AttributeError(f"module 'quotastream' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
