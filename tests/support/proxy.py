"""A proxy under test: its settings, its topics, and the engine's decisions it holds by."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import redis
from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from quotastream.client import QuotaClient as DecisionClient
from quotastream.redis_contract import Decision, decision_key
from state.config import QuotaConfig
from state.quota_types import QuotaType
from state.window import window_spec
from streaming.engine.settings import EngineSettings
from streaming.services import LocalService, free_ports
from tests.servers import wait_until_in_sync

if TYPE_CHECKING:
    from streaming.commands.proxy import RunningProxy

QUOTAS = Path(__file__).resolve().parents[2] / "conf" / "quotas.yaml"
INSTANCE = "proxy-under-test"


def proxy_settings(
    upstream: str,
    events_kafka: str,
    redis_server: LocalService,
    events: str,
    *,
    upstream_client: dict[str, str] | None = None,
    **proxy: Any,
) -> EngineSettings:
    """Settings of a proxy in front of ``upstream`` publishing to ``events`` on ``events_kafka``;
    its ports are free ones (node id N on ``first + 1 + N``)."""
    first = free_ports(5)
    return EngineSettings.model_validate(
        {
            "quotas": str(QUOTAS),
            "kafka": {"bootstrap_servers": events_kafka, "topics": [events]},
            "redis": {"host": redis_server.host, "port": redis_server.port, "key_prefix": events},
            "proxy": {
                "bootstrap_port": first,
                "node_port_base": first + 1,
                "upstream": {"bootstrap_servers": upstream, "client": upstream_client or {}},
                "flush_interval_ms": 100,
                "instance": INSTANCE,
                "metrics": {"enabled": False},
                **proxy,
            },
        }
    )


def create_topic(address: str, topic: str, partitions: int = 3, **client: Any) -> None:
    admin = KafkaAdminClient(bootstrap_servers=address, **client)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        admin.close()
    wait_until_in_sync(address, [topic], **client)


def hold(
    redis_server: LocalService, prefix: str, config: QuotaConfig, client_id: str, ms: int
) -> None:
    """Writes the engine's decision throttling (produce, ANONYMOUS, client_id) for ``ms``: the
    window it measures now (``config``'s samples) holds ``ms`` worth of bytes over its limit."""
    entity = DecisionClient.connect(
        redis_server.host, redis_server.port, prefix, config
    ).entity_of_client("produce", "ANONYMOUS", client_id, 1)
    now = int(time.time() * 1000)
    spec = window_spec(config, QuotaType.PRODUCE)
    window_ms = (spec.samples - 1) * spec.window_ms + now % spec.window_ms
    limit = 1e6
    decision = Decision(
        quota="produce",
        entity=entity,
        throttle_ms=ms,
        until=now + ms,
        rate=limit * (window_ms + ms) / window_ms,
        limit=limit,
        exceeded=True,
        window_ms=window_ms,
        decided_at=now,
    )
    write_decision(redis_server, prefix, decision)


def await_hold(proxy: RunningProxy, key: tuple[str, str, str, int]) -> None:
    """Until the proxy holds ``key``: a refresh pass (what its thread runs every refresh_ms)
    reads a decision from Redis; one made meanwhile by the thread may have read before it."""
    holds = proxy.proxy.holds
    deadline = time.monotonic() + 5
    while holds.remaining_ms(key) == 0:
        assert time.monotonic() < deadline, f"the proxy never read the decision of {key}"
        holds.refresh()


def write_decision(server: LocalService, prefix: str, decision: Decision) -> None:
    """Writes ``decision`` as the engine's sink does (``docs/redis.md``)."""
    redis.Redis(server.host, server.port).set(
        decision_key(prefix, decision.quota, decision.entity), msgspec.json.encode(decision)
    )
