"""quotastream's API for enforcement agents: read a quota decision from Redis in one round trip.

from quotastream import QuotaClient
client = QuotaClient.connect("127.0.0.1", 6379, config=load_quota_config(path))
decision = client.for_client("produce", user="alice", client_id="app1", broker=1)
if decision and decision.throttle_ms_now() > 0: ...
"""

from quotastream.client import Decision, QuotaClient, RemoteLog
from state.throttle_timers import TimerStats

__all__ = ["Decision", "QuotaClient", "RemoteLog", "TimerStats"]
