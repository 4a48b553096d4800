"""Where decisions and rejects go: Redis for enforcement points, Kafka for the dead letter.

Both writers run on the executors (inside ``mapInArrow``), one pipelined round trip per Arrow
batch, so no micro-batch is collected to the driver. The key contract is in ``docs/redis.md``.
Replaying a micro-batch after a crash writes the same values again: Redis ends in the same
state; the dead-letter topic may hold a reject twice, identified by its source coordinates.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any

import pyarrow as pa
import redis
from kafka import KafkaProducer

from quotastream.keys import decision_key, release_channel, remote_log_key, timers_key
from state.events import dead_letter_record
from state.live_config import Mode
from state.throttle_timers import TimerStats
from streaming.metrics import SUMMARY_SCHEMA, BatchSummary, SummaryRequest
from streaming.stages import REJECT, REMOTE_LOG, TIMERS, USAGE

WRITE_COUNTS = pa.schema([("decisions", pa.int64()), ("rejects", pa.int64())])
#: What :func:`write_batches` yields when the driver asks for a metrics summary.
WRITE_SUMMARY = SUMMARY_SCHEMA


@dataclass(frozen=True)
class SinkSettings:
    redis_host: str
    redis_port: int
    key_prefix: str = "quotastream"
    #: How long a decision stays readable after it was written, at least (throttles stay
    #: until they end).
    keep_ms: int = 30_000
    dead_letter_topic: str = "quotastream.dead-letter"
    kafka_bootstrap: str = ""
    redis_username: str | None = None
    redis_password: str | None = field(default=None, repr=False)
    redis_ssl: bool = False


def decision_value(row: dict[str, Any]) -> dict[str, Any]:
    """What an enforcement point reads for one (quota, entity)."""
    limit = row["limit"]
    return {
        "quota": row["quota"],
        "entity": row["entity"],
        "throttle_ms": int(row["throttle_ms"]),
        "until": int(row["until"]),
        "rate": float(row["rate"]),
        "limit": None if limit is None or math.isnan(limit) else float(limit),
        "exceeded": bool(row["exceeded"]),
        "window_ms": int(row["window_ms"]),
        "decided_at": int(row["ts"]),
        # Only an enforced decision binds; shadow, exempt and disabled ones are reports.
        "enforced": row["mode"] == Mode.ENFORCED.value,
        "mode": row["mode"],
        "config_version": int(row["config_version"]),
        "released_at": None if row["released_at"] is None else int(row["released_at"]),
    }


def release_notice(row: dict[str, Any]) -> dict[str, Any]:
    """What subscribers of :func:`release_channel` receive."""
    return {
        "quota": row["quota"],
        "entity": row["entity"],
        "reason": row["notice"],
        "released_at": row["released_at"],
        "until": int(row["until"]),
    }


def write_batches(
    batches: Iterator[pa.RecordBatch],
    settings: SinkSettings,
    summary: SummaryRequest | None = None,
) -> Iterator[pa.RecordBatch]:
    """Writes one partition of a micro-batch's output; yields how many rows went where.

    With a ``summary`` request, yields instead a bounded summary of what was written for the
    metrics (:data:`WRITE_SUMMARY`, ``streaming/metrics.py``).
    """
    client = _redis(settings)
    producer: KafkaProducer | None = None
    for batch in batches:
        rows = batch.to_pylist()
        now = int(time.time() * 1000)
        report = BatchSummary(summary, now) if summary is not None else None
        pipeline = client.pipeline(transaction=False)
        decisions = rejects = 0
        prefix = settings.key_prefix
        for row in rows:
            if row["row_type"] == USAGE:
                value = decision_value(row)
                expire_at = max(value["until"], now + settings.keep_ms)
                key = decision_key(prefix, row["quota"], row["entity"])
                pipeline.set(key, _json(value), pxat=expire_at)
                if row["notice"] is not None:
                    channel = release_channel(prefix, row["quota"], row["entity"])
                    pipeline.publish(channel, _json(release_notice(row)))
                decisions += 1
            elif row["row_type"] == REMOTE_LOG:
                key = remote_log_key(prefix, row["topic"], row["partition"])
                # Sizes are kept, not expired: they change only with segment events.
                if row["remote_log"] is not None:
                    pipeline.set(key, row["remote_log"])
                else:
                    pipeline.delete(key)
            elif row["row_type"] == TIMERS:
                counts = {f.name: row[f"timers_{f.name}"] for f in fields(TimerStats)}
                pipeline.hset(timers_key(prefix), str(row["shard"]), _json(counts))
            elif row["row_type"] == REJECT:
                producer = producer or _producer(settings)
                producer.send(settings.dead_letter_topic, _dead_letter(row))
                rejects += 1
            if report is not None:
                report.add(row)
        pipeline.execute()
        if producer is not None:
            producer.flush()
        if report is not None:
            yield report.batch()
            continue
        yield pa.RecordBatch.from_pylist(
            [{"decisions": decisions, "rejects": rejects}], schema=WRITE_COUNTS
        )


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))


def _dead_letter(row: dict[str, Any]) -> bytes:
    record = dead_letter_record(row["reason"], row["detail"], row["payload"] or b"")
    record["source"] = {key: row[key] for key in ("topic", "partition", "offset")}
    return json.dumps(record).encode()


_REDIS: dict[tuple[str, int, str | None, str | None], redis.Redis] = {}
_PRODUCERS: dict[str, KafkaProducer] = {}


def _redis(settings: SinkSettings) -> redis.Redis:
    # Keyed by the credentials too: a worker may serve queries that log in differently.
    key = (
        settings.redis_host,
        settings.redis_port,
        settings.redis_username,
        settings.redis_password,
    )
    if key not in _REDIS:
        _REDIS[key] = redis.Redis(
            host=settings.redis_host,
            port=settings.redis_port,
            username=settings.redis_username,
            password=settings.redis_password,
            ssl=settings.redis_ssl,
        )
    return _REDIS[key]


def _producer(settings: SinkSettings) -> KafkaProducer:
    if settings.kafka_bootstrap not in _PRODUCERS:
        _PRODUCERS[settings.kafka_bootstrap] = KafkaProducer(
            bootstrap_servers=settings.kafka_bootstrap.split(",")
        )
    return _PRODUCERS[settings.kafka_bootstrap]
