"""Builders for event dicts as agents would publish them."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
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


def remote_segment(
    topic: str,
    partition: int,
    segment_id: str,
    nbytes: int,
    state: str,
    ts: int,
    leader_epoch: int = 0,
    broker: int = 1,
) -> dict[str, Any]:
    return {
        "kind": "remote_segment",
        "broker": broker,
        "topic": topic,
        "partition": partition,
        "leader_epoch": leader_epoch,
        "segment_id": segment_id,
        "state": state,
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


#: Quotas under which the mixed traffic below throttles a little of everything.
MIXED_QUOTAS: dict[str, Any] = {
    "clients": [{"user": "<default>", "producer_byte_rate": 2000, "consumer_byte_rate": 3000}],
    "brokers": {
        "<default>": {
            "remote.log.manager.copy.max.bytes.per.second": 4000,
            "leader.replication.throttled.rate": 1500,
        }
    },
    "topics": {"t": {"leader.replication.throttled.replicas": "*"}},
}


def mixed_payloads(seed: int, count: int, users: int = 4, span_ms: int = 20_000) -> list[bytes]:
    """Random produce, fetch, remote copy and replication events over ``span_ms`` of time."""
    rng = random.Random(seed)
    makers = [
        lambda ts: produce(
            f"u{rng.randrange(users)}", "c", rng.randrange(3000), ts, rng.randrange(2)
        ),
        lambda ts: fetch(f"u{rng.randrange(users)}", "c", rng.randrange(3000), ts),
        lambda ts: remote("remote_copy", rng.randrange(2), rng.randrange(5000), ts),
        lambda ts: replication(
            1, "leader", "t", rng.randrange(3), 5, rng.random() < 0.5, rng.randrange(2000), ts
        ),
    ]
    return [
        json.dumps(rng.choice(makers)(BASE + rng.randrange(span_ms))).encode() for _ in range(count)
    ]


def malformed_payloads(seed: int, count: int) -> list[bytes]:
    """Payloads the validator must reject, of the kinds agents and broken producers send.

    Invalid UTF-8, oversized and deeply nested payloads, NaN and infinity, wrong types,
    overflowing integers, timestamps far outside the accepted range, unknown kinds, missing
    fields, truncated JSON; about one in ten is sent twice.
    """
    rng = random.Random(seed)

    def event() -> dict[str, Any]:
        return produce(f"u{rng.randrange(5)}", "c", rng.randrange(3000), BASE + rng.randrange(9999))

    def text(value: object) -> bytes:
        return json.dumps(value).encode()

    def without(field: str) -> bytes:
        return text({k: v for k, v in event().items() if k != field})

    makers: list[Callable[[], bytes]] = [
        lambda: text(event()).replace(b'"c"', b'"c\xff"'),
        lambda: text(event())[:-1] + b', "extra": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        lambda: text(event()).replace(b'"bytes": ', b'"bytes": NaN, "was": '),
        lambda: text({**event(), "bytes": float("inf")}),
        lambda: text({**event(), "bytes": str(rng.randrange(3000))}),
        lambda: text({**event(), "user": rng.randrange(100)}),
        lambda: text({**event(), "bytes": 2**64 + rng.randrange(10**6)}),
        lambda: text({**event(), "ts": 4_102_444_800_000 + rng.randrange(1, 10**12)}),
        lambda: text({**event(), "ts": rng.randrange(0, 946_684_800_000)}),
        lambda: text({**event(), "bytes": -rng.randrange(1, 10**6)}),
        lambda: text({**event(), "kind": "teleport"}),
        lambda: without(rng.choice(["user", "client_id", "broker", "ts", "bytes"])),
        lambda: text([[event()]]),  # a batched message whose one event is not an object
        lambda: text(event())[: rng.randrange(1, 40)],
        lambda: text({**event(), "broker": -1}),
    ]
    huge = [lambda: text({**event(), "padding": "x" * 70_000})]
    out: list[bytes] = []
    while len(out) < count:
        # Oversized payloads are rarer: they cost megabytes in the broker and the dead letter.
        payload = rng.choice(huge if rng.random() < 0.01 else makers)()
        out += [payload, payload] if rng.random() < 0.1 else [payload]
    return out[:count]


def decision_row(
    entity: str, ts: int, throttle_ms: int = 0, keep_ms: int = 30_000, **fields: Any
) -> dict[str, Any]:
    """A decision row as the stateful stage emits it (``DECISION_SCHEMA``; other columns null):
    a produce decision of 150 B/s against 100 B/s, to be written, and kept until its throttle
    ends and at least ``keep_ms`` from now (a batch running now) unless ``fields`` say
    otherwise."""
    from streaming.engine.stages import DECISION, DECISION_SCHEMA  # noqa: PLC0415 - events need no Spark

    return dict.fromkeys(DECISION_SCHEMA.names) | {
        "row_type": DECISION,
        "quota": "produce",
        "entity": entity,
        "ts": ts,
        "rate": 150.0,
        "limit": 100.0,
        "throttle_ms": throttle_ms,
        "until": ts + throttle_ms,
        "exceeded": throttle_ms > 0,
        "window_ms": 10_000,
        "config_version": 0,
        "mode": "enforced",
        "write": True,
        "expire_at": max(ts + throttle_ms, int(time.time() * 1000) + keep_ms),
        **fields,
    }
