"""Simulated cluster traffic that exercises every quota, second by second.

Skewed steady producers, a bulk loader that bursts past its quota, two consumers sharing their
user's quota, a tiered-storage upload backlog, remote reads, and a partition reassignment under a
leader replication throttle. The embedded default publishes it live; ``examples/events.jsonl``
is one minute of it.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from kafka import KafkaProducer

log = logging.getLogger(__name__)

Event = dict[str, Any]


def second_of_traffic(second: int, start_ms: int, rng: random.Random) -> list[Event]:
    """The events of one second of the scenario (``second`` counts from 0), in time order."""
    now = start_ms + second * 1000
    events: list[Event] = []
    for user in ("web", "billing", "search"):
        events.append(
            {
                "kind": "produce",
                "user": user,
                "client_id": f"{user}-app",
                "broker": rng.randrange(1, 4),
                "bytes": rng.randrange(100_000, 300_000),
                "ts": now + rng.randrange(1000),
            }
        )
    # The bulk loader bursts past its 5 MiB/s quota for 10 s of every minute.
    burst = 20 <= second % 60 < 30
    events.append(
        {
            "kind": "produce",
            "user": "ingest",
            "client_id": "bulk-loader",
            "broker": 1,
            "bytes": 12_000_000 if burst else 2_000_000,
            "ts": now + 500,
        }
    )
    for client in ("spark-1", "spark-2"):
        events.append(
            {
                "kind": "fetch",
                "user": "analytics",
                "client_id": client,
                "broker": 2,
                "bytes": rng.randrange(3_000_000, 7_000_000),
                "ts": now + rng.randrange(1000),
            }
        )
    # An upload backlog on broker 3 for 40 s of every minute: 8 MiB segments.
    for _ in range(3 if second % 60 < 40 else 1):
        events.append(
            {
                "kind": "remote_copy",
                "broker": 3,
                "topic": "clicks",
                "partition": rng.randrange(6),
                "bytes": 8_388_608,
                "ts": now + rng.randrange(1000),
            }
        )
    events.append(
        {
            "kind": "remote_fetch",
            "broker": 1,
            "topic": "clicks",
            "partition": 2,
            "bytes": rng.randrange(1_000_000, 4_000_000),
            "ts": now + 250,
            "client_id": "backfill",
        }
    )
    # orders-0/1 moving onto broker 3: the new replica is out of sync, the old one in sync.
    for partition, leader in ((0, 1), (1, 2)):
        for replica, in_sync in ((3, False), (leader % 2 + 1, True)):
            events.append(
                {
                    "kind": "replication",
                    "broker": leader,
                    "role": "leader",
                    "topic": "orders",
                    "partition": partition,
                    "replica": replica,
                    "in_sync": in_sync,
                    "bytes": rng.randrange(1_000_000, 3_000_000),
                    "ts": now + rng.randrange(1000),
                }
            )
    if second % 15 == 0:
        events.append(
            {
                "kind": "remote_segment",
                "broker": 3,
                "topic": "clicks",
                "partition": 0,
                "leader_epoch": 4,
                "segment_id": f"seg-{second}",
                "state": "copy_finished",
                "bytes": 8_388_608,
                "ts": now,
            }
        )
    events.sort(key=lambda event: int(event["ts"]))
    return events


def traffic(seconds: int, start_ms: int, seed: int = 2026) -> Iterator[Event]:
    rng = random.Random(seed)
    for second in range(seconds):
        yield from second_of_traffic(second, start_ms, rng)


def messages(events: list[Event], events_per_message: int) -> Iterator[bytes]:
    """``events`` as Kafka message values: one JSON object each, or JSON arrays of up to
    ``events_per_message`` events (batched messages, docs/events.md)."""
    if events_per_message == 1:
        for event in events:
            yield json.dumps(event).encode()
        return
    for first in range(0, len(events), events_per_message):
        yield json.dumps(events[first : first + events_per_message]).encode()


class LiveTraffic(threading.Thread):
    """Publishes the scenario to Kafka in real time until stopped."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        seed: int = 2026,
        client: Mapping[str, Any] | None = None,
        events_per_message: int = 1,
    ) -> None:
        if events_per_message < 1:
            raise ValueError(f"events per message must be >= 1, got {events_per_message}")
        super().__init__(name="quotastream-traffic", daemon=True)
        # ``client``: kafka-python settings (TLS, SASL), as the engine's own clients take them.
        self._producer = KafkaProducer(
            bootstrap_servers=bootstrap_servers.split(","), linger_ms=5, **(client or {})
        )
        self._topic = topic
        self._events_per_message = events_per_message
        self._rng = random.Random(seed)
        self._stopping = threading.Event()

    def run(self) -> None:
        start_ms = int(time.time() * 1000) // 1000 * 1000
        second = 0
        while not self._stopping.is_set():
            events = second_of_traffic(second, start_ms, self._rng)
            for value in messages(events, self._events_per_message):
                self._producer.send(self._topic, value)
            self._producer.flush()
            second += 1
            # Publish each second's events when that second has begun.
            self._stopping.wait(max(start_ms / 1000 + second - time.time(), 0))
        self._producer.close()

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=10)
