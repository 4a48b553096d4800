"""Real Kafka clients through ``quotastream proxy``, for the embedded default (``scripts/run``).

kafka-python producers at skewed rates, one that bursts past its quota every half minute, and a
consumer group reading what they write: unmodified clients, whose bytes the proxy publishes and
whom it holds by the engine's decisions, next to the simulated broker-internal traffic. On the
embedded broker's plaintext listener every client is ``User:ANONYMOUS``, so under the shipped
quotas (``user: <default>``, levels 6) they share one counter per quota, as on a Kafka broker:
a burst holds them all.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Final

from kafka import KafkaConsumer, KafkaProducer
from kafka.errors import KafkaError

from quotastream.producer_close import close_producer

log = logging.getLogger(__name__)

RECORD_BYTES: Final = 8_192


@dataclass(frozen=True)
class ProducerLoad:
    client_id: str
    bytes_per_s: float
    #: Every ``burst_every_s``, ``burst_for_s`` at ``burst_bytes_per_s`` instead.
    burst_bytes_per_s: float = 0.0
    burst_every_s: float = 30.0
    burst_for_s: float = 10.0

    def rate_at(self, elapsed_s: float) -> float:
        bursting = self.burst_bytes_per_s and elapsed_s % self.burst_every_s < self.burst_for_s
        return self.burst_bytes_per_s if bursting else self.bytes_per_s


#: Skewed steady producers and one that bursts to twice the default producer quota (1 MiB/s).
PRODUCERS: Final = (
    ProducerLoad("orders-service", 200_000),
    ProducerLoad("metrics-agent", 80_000),
    ProducerLoad("audit-log", 20_000),
    ProducerLoad("backfill-job", 50_000, burst_bytes_per_s=2_000_000),
)
CONSUMER_GROUP: Final = "dashboards"


class ClientTraffic:
    """The producers and a consumer, each on a thread of its own, until :meth:`stop`."""

    def __init__(self, bootstrap_servers: str, topic: str) -> None:
        self._bootstrap_servers = bootstrap_servers
        self._topic = topic
        self._stopped = threading.Event()
        self._threads = [
            threading.Thread(target=self._produce, args=(load,), name=load.client_id, daemon=True)
            for load in PRODUCERS
        ]
        self._threads.append(threading.Thread(target=self._consume, name="consumer", daemon=True))
        #: The first error that stopped a client (None: all run).
        self.failure: str | None = None

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stopped.set()
        for thread in self._threads:
            thread.join(10)

    def _produce(self, load: ProducerLoad) -> None:
        value = b"r" * RECORD_BYTES
        try:
            producer = KafkaProducer(
                bootstrap_servers=self._bootstrap_servers, client_id=load.client_id, linger_ms=20
            )
        except KafkaError as error:
            self._failed(load.client_id, error)
            return
        started = time.monotonic()
        due = started
        try:
            while not self._stopped.is_set():
                # A held producer blocks here (kafka-python holds back on throttle_time_ms,
                # and its buffer fills): the schedule restarts from now, it never catches up.
                due = max(due, time.monotonic() - 1.0)
                if self._stopped.wait(max(due - time.monotonic(), 0)):
                    break
                producer.send(self._topic, value)
                due += RECORD_BYTES / load.rate_at(time.monotonic() - started)
        except KafkaError as error:
            self._failed(load.client_id, error)
        finally:
            if not close_producer(producer):
                log.info("client %s stopped with records unsent: its quota held it", load.client_id)

    def _consume(self) -> None:
        consumer: Any = None
        try:
            consumer = KafkaConsumer(
                self._topic,
                bootstrap_servers=self._bootstrap_servers,
                group_id=CONSUMER_GROUP,
                client_id=CONSUMER_GROUP,
                auto_offset_reset="latest",
            )
            while not self._stopped.is_set():
                consumer.poll(timeout_ms=500)
        except KafkaError as error:
            self._failed("consumer", error)
        finally:
            if consumer is not None:
                consumer.close()

    def _failed(self, client: str, error: Exception) -> None:
        log.warning("client %s stopped: %s", client, error)
        self.failure = self.failure or f"{client}: {error}"
