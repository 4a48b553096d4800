"""The lookup client enforcement agents use (key contract: ``docs/redis.md``)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, fields
from typing import Any, cast

import pandas as pd
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from quotastream.keys import (
    decision_key,
    decision_patterns,
    release_channel,
    remote_log_key,
    timers_key,
)
from state.config import QuotaConfig
from state.core import QuotaCore
from state.events import parse_events
from state.leader_epochs import breach
from state.throttle_timers import TimerStats


@dataclass(frozen=True)
class Decision:
    quota: str
    entity: str
    throttle_ms: int  # as decided, at decided_at
    until: int  # epoch ms when the throttle ends (decided_at + throttle_ms)
    rate: float
    limit: float | None
    exceeded: bool
    window_ms: int
    decided_at: int
    #: Whether the decision binds. A shadow, exempt or disabled decision (``mode``) reports what
    #: would apply and never delays anyone.
    enforced: bool = True
    mode: str = "enforced"
    #: The live configuration version the decision was made with.
    config_version: int = 0
    #: When the engine released the throttle (its timer fired, a newer decision or an operator
    #: ended it); None while it is pending, or when there was none.
    released_at: int | None = None

    def throttle_ms_now(self, now_ms: int | None = None) -> int:
        """How long the entity is still throttled, from now (0 for a decision not enforced)."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return remaining_throttle_ms(self.until, self.released_at, self.enforced, now)


def remaining_throttle_ms(until: int, released_at: int | None, enforced: bool, now_ms: int) -> int:
    """How long a decision still throttles at ``now_ms``: 0 once released, or if not enforced."""
    if released_at is not None or not enforced:
        return 0
    return max(until - now_ms, 0)


def decision_keys(client: redis.Redis, prefix: str) -> list[bytes]:
    """Every decision key under ``prefix`` (a scan: for dashboards and tests, not agents)."""
    return [
        key
        for pattern in decision_patterns(prefix)
        for key in client.scan_iter(pattern, count=10_000)
    ]


@dataclass(frozen=True)
class RemoteLog:
    """A partition's remote log (KIP-852), as the engine last wrote it."""

    topic: str
    partition: int
    total: int  # RemoteLogSizeBytes: bytes in remote storage, all leader epochs
    epochs: dict[int, int]  # leader epoch -> bytes of the segments listed under it
    segments: list[tuple[str, int, int]]  # (segment id, leader epoch, bytes), oldest copy first
    #: The size retention counts: within the reported lineage (all live segments without one).
    retention_bytes: int = 0
    #: The cleaner's walk: (segment id, bytes, within the lineage), in order.
    retention_walk: list[tuple[str, int, bool]] = field(default_factory=list)
    #: The lineage the broker last reported: (leader epoch, first offset), or None.
    lineage: list[tuple[int, int]] | None = None

    def size(self, leader_epoch: int) -> int:
        """``remoteLogSize(partition, leaderEpoch)``: 0 for an epoch with no remote segments."""
        return self.epochs.get(leader_epoch, 0)

    def retention_breach(self, retention_bytes: int, local_only_bytes: int) -> list[str]:
        """The segments size-based retention deletes, in order (Kafka's walk)."""
        return breach(self.retention_walk, self.retention_bytes, local_only_bytes, retention_bytes)

    @staticmethod
    def of(document: dict[str, Any]) -> RemoteLog:
        """From the engine's document (one written before lineages counts every segment)."""
        segments = [(str(s), int(e), int(b)) for s, e, b in document["segments"]]
        retention = document.get("retention") or {
            "lineage": None,
            "bytes": document["total"],
            "walk": [[segment, size, True] for segment, _, size in segments],
        }
        lineage = retention["lineage"]
        return RemoteLog(
            str(document["topic"]),
            int(document["partition"]),
            int(document["total"]),
            {int(epoch): int(size) for epoch, size in document["epochs"].items()},
            segments,
            int(retention["bytes"]),
            [(str(s), int(b), bool(w)) for s, b, w in retention["walk"]],
            None if lineage is None else [(int(e), int(o)) for e, o in lineage],
        )


class QuotaClient:
    def __init__(
        self, client: redis.Redis, prefix: str = "quotastream", config: QuotaConfig | None = None
    ) -> None:
        self._redis = client
        self._prefix = prefix
        self._core = QuotaCore(config) if config is not None else None

    @staticmethod
    def connect(
        host: str,
        port: int,
        prefix: str = "quotastream",
        config: QuotaConfig | None = None,
        *,
        timeout_s: float | None = None,
        **redis_options: Any,
    ) -> QuotaClient:
        """A client on its own connection; ``redis_options`` go to ``redis.Redis``.

        With ``timeout_s``, every call makes one attempt bounded by it: redis-py's default
        retries (three, with backoff) would hold a call for seconds against a dead Redis.
        """
        if timeout_s is not None:
            redis_options = redis_options | {
                "socket_timeout": timeout_s,
                "socket_connect_timeout": timeout_s,
                "retry": Retry(NoBackoff(), 0),
            }
        return QuotaClient(redis.Redis(host=host, port=port, **redis_options), prefix, config)

    def lookup(self, quota: str, entity: str) -> Decision | None:
        """The decision for an entity key (``user=alice,client-id=app1,broker=1``), if any."""
        raw = self._redis.get(decision_key(self._prefix, quota, entity))
        if raw is None:
            return None
        assert isinstance(raw, bytes)
        return Decision(**json.loads(raw))

    def wait_until_released(self, quota: str, entity: str, timeout_s: float) -> Decision | None:
        """Block until the entity's throttle ends, woken by the engine's release notice.

        Returns the entity's decision then (None if it has none). Returns when ``until`` passes
        even if no notice came (a notice published while nobody listened is lost), and after
        ``timeout_s`` at the latest; check ``throttle_ms_now()`` on the result.
        """
        deadline = time.monotonic() + timeout_s
        # redis-py leaves pubsub() unannotated.
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        with pubsub as channel:
            # Subscribed before reading, so a release between the two is not missed.
            channel.subscribe(release_channel(self._prefix, quota, entity))
            decision = self.lookup(quota, entity)
            while decision is not None and decision.throttle_ms_now() > 0:
                left = min(deadline - time.monotonic(), decision.throttle_ms_now() / 1000)
                if left <= 0:
                    break
                if channel.get_message(timeout=left) is not None:
                    decision = self.lookup(quota, entity)
        return decision

    def remote_log(self, topic: str, partition: int) -> RemoteLog:
        """A partition's remote log sizes in one round trip (empty when it has none)."""
        raw = self._redis.get(remote_log_key(self._prefix, topic, partition))
        if raw is None:
            return RemoteLog(topic, partition, 0, {}, [])
        assert isinstance(raw, bytes)
        return RemoteLog.of(json.loads(raw))

    def timer_counts(self) -> TimerStats:
        """Throttle timers summed over the engine's shards (as each last reported)."""
        per_shard = cast(dict[bytes, bytes], self._redis.hgetall(timers_key(self._prefix)))
        reports = [json.loads(raw) for raw in per_shard.values()]
        return TimerStats(
            **{f.name: sum(int(r[f.name]) for r in reports) for f in fields(TimerStats)}
        )

    def for_client(self, quota: str, user: str, client_id: str, broker: int) -> Decision | None:
        """The decision that applies to a client, whichever counter its quota level uses."""
        return self.lookup(quota, self.entity_of_client(quota, user, client_id, broker))

    def entity_of_client(self, quota: str, user: str, client_id: str, broker: int) -> str:
        if self._core is None:
            raise ValueError("resolving a client's entity needs the quota config")
        event = {
            "kind": quota,
            "user": user,
            "client_id": client_id,
            "broker": broker,
            "bytes": 0,
            "ts": 946_684_800_000,
        }
        parsed = parse_events([json.dumps(event).encode()])
        if not parsed.rejected.empty:
            raise ValueError(str(parsed.rejected["detail"].iloc[0]))
        entity = self._core.resolve(parsed.accepted)["entity"]
        return str(pd.Series(entity).iloc[0])
