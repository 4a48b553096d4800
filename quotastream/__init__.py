"""quotastream's API for enforcement agents: read a quota decision from Redis in one round trip.

from quotastream import QuotaClient
client = QuotaClient.connect("127.0.0.1", 6379, config=load_quota_config(path))
decision = client.for_client("produce", user="alice", client_id="app1", broker=1)
if decision and decision.throttle_ms_now() > 0: ...

Agents that must not stall when Redis does use ``CachedQuotaClient`` (``docs/agents.md``).
"""

from quotastream.cache import Answer, CachedQuotaClient, CacheSettings, FailurePolicy, Source
from quotastream.client import QuotaClient
from quotastream.redis_contract import CorruptValueError, Decision
from state.remote_log_view import RemoteLog
from state.timer_stats import TimerStats

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
