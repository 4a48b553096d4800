"""Builders for event dicts as agents would publish them."""

from __future__ import annotations

from typing import Any

BASE = 1_700_000_000_000  # epoch ms, a multiple of 1000


def produce(user: str, client_id: str, nbytes: int, ts: int, broker: int = 1) -> dict[str, Any]:
    return {
        "kind": "produce",
        "user": user,
        "client_id": client_id,
        "broker": broker,
        "bytes": nbytes,
        "ts": ts,
    }


def fetch(user: str, client_id: str, nbytes: int, ts: int, broker: int = 1) -> dict[str, Any]:
    return {**produce(user, client_id, nbytes, ts, broker), "kind": "fetch"}


def remote(
    kind: str, broker: int, nbytes: int, ts: int, topic: str = "t", partition: int = 0
) -> dict[str, Any]:
    return {
        "kind": kind,
        "broker": broker,
        "topic": topic,
        "partition": partition,
        "bytes": nbytes,
        "ts": ts,
    }


def replication(
    broker: int,
    role: str,
    topic: str,
    partition: int,
    replica: int,
    in_sync: bool,
    nbytes: int,
    ts: int,
) -> dict[str, Any]:
    return {
        "kind": "replication",
        "broker": broker,
        "role": role,
        "topic": topic,
        "partition": partition,
        "replica": replica,
        "in_sync": in_sync,
        "bytes": nbytes,
        "ts": ts,
    }
