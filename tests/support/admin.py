"""The operator's commands' files: an engine file and its quotas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

QUOTAS: dict[str, Any] = {
    "clients": [
        {"user": "<default>", "producer_byte_rate": 2000, "consumer_byte_rate": 3000},
        {"user": "alice", "client_id": "<default>", "producer_byte_rate": 300},
        {"user": "mirror", "exempt": True},
        {"user": "mirror", "client_id": "special", "producer_byte_rate": 700},
    ],
    "brokers": {
        "<default>": {
            "remote.log.manager.copy.max.bytes.per.second": 4000,
            "leader.replication.throttled.rate": 1500,
        },
        3: {"remote.log.manager.copy.max.bytes.per.second": 900},
    },
}


def write_settings(
    tmp_path: Path,
    bootstrap: str,
    redis_address: tuple[str, int],
    topic: str | None,
    quotas: dict[str, Any] | None = None,
    **extra: Any,
) -> tuple[Path, Path]:
    quotas_path = tmp_path / "quotas.yaml"
    quotas_path.write_text(yaml.safe_dump(QUOTAS if quotas is None else quotas))
    engine = tmp_path / "engine.yaml"
    settings: dict[str, Any] = {
        "quotas": str(quotas_path),
        "kafka": {"bootstrap_servers": bootstrap, "config_topic": topic, **extra.pop("kafka", {})},
        "redis": {
            "host": redis_address[0],
            "port": redis_address[1],
            "key_prefix": topic or "qs",
            **extra.pop("redis", {}),
        },
    }
    engine.write_text(yaml.safe_dump(settings))
    return engine, quotas_path
