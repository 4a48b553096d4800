"""Simulated cluster traffic that exercises every quota, second by second.

A cluster an operator would recognise: five brokers and about 300 clients under two dozen
principals (services), with a few busy services and many quiet ones, and a few heavy clients
within each service. Each client talks to the brokers that lead its partitions, and each broker's
agent reports every client's bytes once a second (``count`` requests summed, docs/events.md).
Against ``conf/quotas.yaml`` most principals stay well under their per-broker quota and the busy
ones come near it; on top of that run the scenarios each quota is for:

* a bulk loader that bursts past its own (user, client-id) quota 10 s of every minute;
* two dozen Spark executors sharing the ``analytics`` user's fetch quota, near it and at times
  over it on the broker that serves the heaviest executors;
* a tiered-storage upload backlog on broker 3 (a smaller uplink) for 40 s of every minute, while
  the other brokers upload at an ordinary pace;
* remote reads, and a partition reassignment (``orders`` 0 and 1 onto broker 3) under a leader
  replication throttle.

Deterministic for a seed: the cluster's layout and every event come from one seeded generator.
The embedded default publishes it live; ``examples/events.jsonl`` is one minute of it.
"""

from __future__ import annotations

import logging
import random
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kafka import KafkaProducer
from kafka.errors import KafkaError, KafkaTimeoutError

from quotastream.clock import SYSTEM_CLOCK
from quotastream.producer_close import CLOSE_TIMEOUT_S, close_producer
from quotastream.publisher import batched_messages
from state.event_contract import (
    Event,
    Fetch,
    Produce,
    RemoteCopy,
    RemoteFetch,
    RemoteSegment,
    Replication,
    encode,
)
from streaming.engine.client_settings import settings_for

log = logging.getLogger(__name__)

BROKERS = (1, 2, 3, 4, 5)
#: Bytes per request a broker's agent assumes when it counts a client's requests.
_REQUEST_BYTES = 16_384


@dataclass(frozen=True)
class Service:
    """A principal and its client instances (``<prefix>-<n>``), which share ``bytes_per_s``
    unevenly; each instance talks to ``brokers_per_client`` brokers and is active (sends in a
    given second) with probability ``activity``."""

    user: str
    kind: Literal["produce", "fetch"]
    client_prefix: str
    clients: int
    bytes_per_s: int
    brokers_per_client: int
    activity: float = 0.9


#: Per-broker client quotas (conf/quotas.yaml): 1 MiB/s produce and 2 MiB/s fetch per user,
#: 10 MiB/s fetch for analytics. ``bytes_per_s`` is the whole service on all five brokers, so a
#: service's per-broker rate is about a fifth of it, more where its heavy clients are.
SERVICES = (
    Service("web", "produce", "web", 48, 2_400_000, 2),
    Service("mobile-api", "produce", "mobile-api", 36, 2_600_000, 2),
    Service("checkout", "produce", "checkout", 16, 1_900_000, 2),
    Service("payments", "produce", "payments", 10, 900_000, 2),
    Service("iot-gateway", "produce", "iot-gw", 24, 3_400_000, 3),
    Service("logs-shipper", "produce", "fluent-bit", 40, 1_800_000, 1, activity=0.7),
    Service("metrics-agent", "produce", "telegraf", 20, 700_000, 1, activity=0.8),
    Service("search-indexer", "produce", "indexer", 6, 1_100_000, 3),
    Service("inventory", "produce", "inventory", 8, 300_000, 2, activity=0.6),
    Service("notifications", "produce", "notifier", 6, 250_000, 2, activity=0.5),
    Service("ANONYMOUS", "produce", "legacy-app", 3, 60_000, 1, activity=0.4),
    Service("analytics", "fetch", "spark-executor", 24, 40_000_000, 2),
    Service("search", "fetch", "search-consumer", 12, 4_200_000, 2),
    Service("fraud-detector", "fetch", "fraud", 10, 4_600_000, 2),
    Service("mirror-maker", "fetch", "mirror", 6, 5_600_000, 3),
    Service("audit", "fetch", "audit", 4, 600_000, 2, activity=0.6),
    Service("dashboards", "fetch", "grafana-kafka", 8, 400_000, 1, activity=0.5),
    Service("billing", "fetch", "billing", 6, 1_500_000, 2),
    Service("recommendations", "fetch", "recs", 10, 3_000_000, 2),
    Service("data-lake", "fetch", "s3-sink", 6, 4_800_000, 3),
)


@dataclass(frozen=True)
class Client:
    service: Service
    client_id: str
    bytes_per_s: float
    brokers: tuple[int, ...]


def cluster_clients(rng: random.Random) -> list[Client]:
    """Every service's clients: Pareto-skewed shares of its rate (a few heavy instances, many
    light ones) and their brokers."""
    clients = []
    for service in SERVICES:
        weights = [rng.paretovariate(2.0) for _ in range(service.clients)]
        total = sum(weights)
        for number, weight in enumerate(weights):
            clients.append(
                Client(
                    service,
                    f"{service.client_prefix}-{number}",
                    service.bytes_per_s * weight / total,
                    tuple(sorted(rng.sample(BROKERS, service.brokers_per_client))),
                )
            )
    return clients


class Scenario:
    """The simulated cluster, second by second; the same seed gives the same events."""

    def __init__(self, seed: int = 2026) -> None:
        self._rng = random.Random(seed)
        self.clients = cluster_clients(self._rng)

    def second(self, second: int, start_ms: int) -> list[Event]:
        """The events of one second (``second`` counts from 0), in time order."""
        now = start_ms + second * 1000
        rng = self._rng
        events: list[Event] = []
        for client in self.clients:
            service = client.service
            if rng.random() >= service.activity:
                continue
            # Active seconds carry the idle ones' share: the mean rate is bytes_per_s.
            per_broker = client.bytes_per_s / service.activity / len(client.brokers)
            for broker in client.brokers:
                sent = int(per_broker * rng.uniform(0.6, 1.4))
                events.append(
                    (Produce if service.kind == "produce" else Fetch)(
                        user=service.user,
                        client_id=client.client_id,
                        broker=broker,
                        bytes=sent,
                        count=max(1, sent // _REQUEST_BYTES),
                        ts=now + rng.randrange(1000),
                    )
                )
        events.extend(self._bulk_loader(second, now))
        events.extend(self._tiered_storage(second, now))
        events.extend(self._reassignment(now))
        events.sort(key=lambda event: event.ts)
        return events

    def _bulk_loader(self, second: int, now: int) -> list[Event]:
        # Bursts past its 5 MiB/s (user, client-id) quota for 10 s of every minute.
        burst = 20 <= second % 60 < 30
        return [
            Produce(
                user="ingest",
                client_id="bulk-loader",
                broker=1,
                bytes=12_000_000 if burst else 2_000_000,
                count=64 if burst else 12,
                ts=now + 500,
            )
        ]

    def _tiered_storage(self, second: int, now: int) -> list[Event]:
        rng = self._rng
        events: list[Event] = []
        # An upload backlog on broker 3 (a 20 MiB/s uplink) for 40 s of every minute: 8 MiB
        # segments; the other brokers upload a segment every other second or so.
        uploads = [(3, "clicks", rng.randrange(6)) for _ in range(3 if second % 60 < 40 else 1)]
        uploads += [
            (broker, "logs", rng.randrange(12)) for broker in (1, 2, 4, 5) if rng.random() < 0.4
        ]
        for broker, topic, partition in uploads:
            events.append(
                RemoteCopy(
                    broker=broker,
                    topic=topic,
                    partition=partition,
                    bytes=8_388_608,
                    ts=now + rng.randrange(1000),
                )
            )
        for broker, client_id in ((1, "backfill"), (4, "audit-0")):
            events.append(
                RemoteFetch(
                    broker=broker,
                    topic="clicks",
                    partition=2 if broker == 1 else 7,
                    bytes=rng.randrange(1_000_000, 4_000_000),
                    ts=now + 250,
                    client_id=client_id,
                )
            )
        if second % 15 == 0:
            events.append(
                RemoteSegment(
                    broker=3,
                    topic="clicks",
                    partition=0,
                    leader_epoch=4,
                    segment_id=f"seg-{second}",
                    state="copy_finished",
                    bytes=8_388_608,
                    ts=now,
                )
            )
        return events

    def _reassignment(self, now: int) -> list[Event]:
        # orders-0/1 moving onto broker 3: the new replica is out of sync, the old one in sync.
        rng = self._rng
        events: list[Event] = []
        for partition, leader in ((0, 1), (1, 2)):
            for replica, in_sync in ((3, False), (leader % 2 + 1, True)):
                events.append(
                    Replication(
                        broker=leader,
                        role="leader",
                        topic="orders",
                        partition=partition,
                        replica=replica,
                        in_sync=in_sync,
                        bytes=rng.randrange(1_000_000, 3_000_000),
                        ts=now + rng.randrange(1000),
                    )
                )
        return events


def traffic(seconds: int, start_ms: int, seed: int = 2026) -> Iterator[Event]:
    scenario = Scenario(seed)
    for second in range(seconds):
        yield from scenario.second(second, start_ms)


def messages(events: list[Event], events_per_message: int) -> Iterator[bytes]:
    """``events`` as Kafka message values: one JSON object each, or JSON arrays of up to
    ``events_per_message`` events (batched messages, docs/events.md)."""
    if events_per_message == 1:
        yield from map(encode, events)
        return
    for first in range(0, len(events), events_per_message):
        # No byte bound: the array is as long as asked (the broker's message.max.bytes is).
        (message,) = batched_messages(events[first : first + events_per_message], sys.maxsize)
        yield message.value


class LiveTraffic(threading.Thread):
    """Publishes the scenario to Kafka in real time until stopped, or for ``seconds`` seconds.

    A bounded run counts scenario seconds, not wall-clock time: a second is published as it
    begins, and a slow flush delays the next one rather than adding one, so ``seconds=3`` gives
    exactly three seconds of events however loaded the machine is.

    A Kafka error ends the publishing and is kept in :attr:`failure` for the caller to report:
    a thread's traceback would tell an operator less than the one line the caller prints.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        seed: int = 2026,
        client: Mapping[str, Any] | None = None,
        events_per_message: int = 1,
        seconds: int | None = None,
    ) -> None:
        if events_per_message < 1:
            raise ValueError(f"events per message must be >= 1, got {events_per_message}")
        if seconds is not None and seconds < 1:
            raise ValueError(f"seconds must be >= 1, got {seconds}")
        super().__init__(name="quotastream-traffic", daemon=True)
        # ``client``: kafka-python settings (TLS, SASL), as the engine's own clients take them.
        self._producer = KafkaProducer(
            **settings_for(
                KafkaProducer,
                client or {},
                bootstrap_servers=bootstrap_servers.split(","),
                linger_ms=5,
            )
        )
        self._topic = topic
        self._events_per_message = events_per_message
        self._scenario = Scenario(seed)
        self._seconds = seconds
        self._stopping = threading.Event()
        self.failure: KafkaError | None = None

    def run(self) -> None:
        try:
            self._publish()
        except KafkaError as exc:
            self.failure = exc
        if not close_producer(self._producer, CLOSE_TIMEOUT_S):
            unsent = KafkaTimeoutError(f"events not delivered within {CLOSE_TIMEOUT_S:.0f} s")
            self.failure = self.failure or unsent

    def _publish(self) -> None:
        start_ms = SYSTEM_CLOCK.wall_ms() // 1000 * 1000
        second = 0
        while not self._stopping.is_set() and (self._seconds is None or second < self._seconds):
            events = self._scenario.second(second, start_ms)
            for value in messages(events, self._events_per_message):
                self._producer.send(self._topic, value)
            self._producer.flush(timeout=10)
            second += 1
            # Publish each second's events when that second has begun.
            self._stopping.wait(max(start_ms + second * 1000 - SYSTEM_CLOCK.wall_ms(), 0) / 1000)

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=15)
