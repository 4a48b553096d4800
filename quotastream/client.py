"""The lookup client enforcement agents use (key contract: ``docs/redis.md``)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import pandas as pd
import redis

from state.config import QuotaConfig
from state.core import QuotaCore
from state.events import parse_events


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

    def throttle_ms_now(self, now_ms: int | None = None) -> int:
        """How long the entity is still throttled, from now."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return max(self.until - now, 0)


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
        **redis_options: Any,
    ) -> QuotaClient:
        return QuotaClient(redis.Redis(host=host, port=port, **redis_options), prefix, config)

    def lookup(self, quota: str, entity: str) -> Decision | None:
        """The decision for an entity key (``user=alice,client-id=app1,broker=1``), if any."""
        raw = self._redis.get(f"{self._prefix}:{quota}:{entity}")
        if raw is None:
            return None
        assert isinstance(raw, bytes)
        return Decision(**json.loads(raw))

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
