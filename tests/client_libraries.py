"""Real Kafka client libraries no one here wrote, driven the same way: kafka-python, aiokafka,
confluent-kafka (librdkafka) and Kafka's own Java clients (kafka-clients, the release the tests
run, through ``tests/java/JavaClients.java``). Used by the proxy's tests and ``bench/proxy.py``.

Each library produces a list of values (each its own key, so that they spread over the
partitions deterministically; waiting for every acknowledgement) and consumes a
number of values in a consumer group, through whatever bootstrap address it is given, with
SASL/SCRAM-SHA-512 and TLS when :class:`Access` says so. They differ in what matters to a
proxy: kafka-python holds back on ``throttle_time_ms`` and keeps up to five requests in flight
per connection; aiokafka and librdkafka ignore ``throttle_time_ms`` and keep sending; the Java
producer holds back on it too (KIP-219: it sends a throttled broker nothing until the throttle
ends), keeps up to five requests in flight per broker and buffers up to 32 MB of records meanwhile.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import aiokafka
import confluent_kafka
import kafka
from aiokafka.helpers import create_ssl_context

from streaming.kafka_broker import java, kafka_libs
from tests.support.rates import Acks

#: How long a consumer may take to read what it was asked for before the test fails.
CONSUME_TIMEOUT_S: Final = 60.0


@dataclass(frozen=True)
class Access:
    """How a client reaches Kafka: bootstrap servers, and optionally SCRAM and TLS."""

    bootstrap_servers: str
    #: (user, password) for SASL/SCRAM-SHA-512.
    scram: tuple[str, str] | None = None
    #: The CA of the server's certificate: TLS.
    ca_file: str | None = None

    def _python_options(self) -> dict[str, Any]:
        """What kafka-python and aiokafka name alike."""
        options: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "security_protocol": _protocol(self),
        }
        if self.scram is not None:
            options.update(
                sasl_mechanism="SCRAM-SHA-512",
                sasl_plain_username=self.scram[0],
                sasl_plain_password=self.scram[1],
            )
        return options

    def kafka_python(self) -> dict[str, Any]:
        options = self._python_options()
        if self.ca_file is not None:
            options.update(ssl_cafile=self.ca_file, ssl_check_hostname=False)
        return options

    def aiokafka(self) -> dict[str, Any]:
        options = self._python_options()
        if self.ca_file is not None:
            context = create_ssl_context(cafile=self.ca_file)
            context.check_hostname = False
            options["ssl_context"] = context
        return options

    def librdkafka(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": _protocol(self).lower(),
        }
        if self.scram is not None:
            options.update(
                {
                    "sasl.mechanism": "SCRAM-SHA-512",
                    "sasl.username": self.scram[0],
                    "sasl.password": self.scram[1],
                }
            )
        if self.ca_file is not None:
            options.update(
                {"ssl.ca.location": self.ca_file, "ssl.endpoint.identification.algorithm": "none"}
            )
        return options

    def java(self) -> dict[str, str]:
        """Kafka's Java client properties."""
        options = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": _protocol(self),
        }
        if self.scram is not None:
            user, password = self.scram
            options["sasl.mechanism"] = "SCRAM-SHA-512"
            options["sasl.jaas.config"] = (
                "org.apache.kafka.common.security.scram.ScramLoginModule required "
                f'username="{user}" password="{password}";'
            )
        if self.ca_file is not None:
            options.update(
                {
                    "ssl.truststore.type": "PEM",
                    "ssl.truststore.location": self.ca_file,
                    "ssl.endpoint.identification.algorithm": "",
                }
            )
        return options


def _protocol(access: Access) -> str:
    transport = "SSL" if access.ca_file is not None else "PLAINTEXT"
    return f"SASL_{transport}" if access.scram is not None else transport


@dataclass(frozen=True)
class Offer:
    """A producer offering ``bytes_per_s`` of records of ``record_bytes`` for ``duration_s``."""

    bytes_per_s: float
    duration_s: float
    record_bytes: int = 10_000

    def schedule(self) -> Iterator[float]:
        """When each record is due (monotonic seconds), for ``duration_s``. A producer held back
        catches up at most a second of its schedule: an offered rate, not a growing debt that
        it would send all at once when released."""
        due = time.monotonic()
        end = due + self.duration_s
        while due < end:
            yield due
            due = max(due + self.record_bytes / self.bytes_per_s, time.monotonic() - 1.0)

    def read_pace(self) -> Callable[[int], float]:
        """For a consumer offered this rate: given the bytes read so far, when it may read on
        (it never lags more than a second behind, as :meth:`schedule`)."""
        started = time.monotonic()

        def due(read: int) -> float:
            nonlocal started
            started = max(started, time.monotonic() - 1.0 - read / self.bytes_per_s)
            return started + read / self.bytes_per_s

        return due

    @property
    def backlog(self) -> int:
        """Records sent and not yet acknowledged that the producer keeps at most: a second of
        its rate (a producer's bounded buffer; the offer stops with at most that much left)."""
        return max(int(self.bytes_per_s / self.record_bytes), 1)


class ClientLibrary(Protocol):
    name: str
    #: Whether a call runs in this process, so that its time is its requests' (Java's calls
    #: start a JVM and compile the program first: seconds, more on a loaded machine).
    in_process: bool

    def produce(self, access: Access, topic: str, values: list[bytes], client_id: str) -> None: ...

    def offer(self, access: Access, topic: str, client_id: str, offer: Offer) -> Acks:
        """Records sent at the offered rate (never faster; slower when the library blocks),
        each acknowledgement timed."""
        ...

    def read_for(self, access: Access, topic: str, client_id: str, offer: Offer) -> Acks:
        """A consumer (no group: every partition from the start) reading at the offered rate at
        most, for its duration, each record timed as it arrives."""
        ...

    def consume(
        self, access: Access, topic: str, group: str, client_id: str, count: int
    ) -> list[bytes]: ...


class KafkaPython:
    name = "kafka-python"
    in_process = True

    def produce(self, access: Access, topic: str, values: list[bytes], client_id: str) -> None:
        producer = kafka.KafkaProducer(client_id=client_id, acks="all", **access.kafka_python())
        try:
            for future in [producer.send(topic, value, key=value) for value in values]:
                future.get(timeout=CONSUME_TIMEOUT_S)
        finally:
            producer.close()

    def offer(self, access: Access, topic: str, client_id: str, offer: Offer) -> Acks:
        producer = kafka.KafkaProducer(client_id=client_id, acks=1, **access.kafka_python())
        acks: Acks = []
        value = b"o" * offer.record_bytes
        sent = 0
        try:
            for due in offer.schedule():
                _pace(due)
                while sent - len(acks) >= offer.backlog:
                    _pace(time.monotonic() + 0.005)
                future = producer.send(topic, value, key=str(sent).encode())
                future.add_callback(lambda _m: acks.append((time.monotonic(), offer.record_bytes)))
                sent += 1
            producer.flush(timeout=CONSUME_TIMEOUT_S)
        finally:
            producer.close()
        return acks

    def read_for(self, access: Access, topic: str, client_id: str, offer: Offer) -> Acks:
        consumer = kafka.KafkaConsumer(
            client_id=client_id, auto_offset_reset="earliest", **access.kafka_python()
        )
        # Without a group, kafka-python assigns nothing to a subscription: every partition.
        partitions = consumer.partitions_for_topic(topic) or set()
        consumer.assign([kafka.TopicPartition(topic, p) for p in partitions])
        received: Acks = []
        pace = offer.read_pace()
        read = 0
        deadline = time.monotonic() + offer.duration_s
        try:
            while time.monotonic() < deadline:
                _pace(min(pace(read), deadline))
                for records in consumer.poll(timeout_ms=200, max_records=100).values():
                    now = time.monotonic()
                    received.extend((now, len(record.value)) for record in records)
                    read += sum(len(record.value) for record in records)
        finally:
            consumer.close()
        return received

    def consume(
        self, access: Access, topic: str, group: str, client_id: str, count: int
    ) -> list[bytes]:
        consumer = kafka.KafkaConsumer(
            topic,
            group_id=group,
            client_id=client_id,
            auto_offset_reset="earliest",
            **access.kafka_python(),
        )
        values: list[bytes] = []
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        try:
            while len(values) < count and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=500).values():
                    values.extend(record.value for record in records)
            consumer.commit()
        finally:
            consumer.close()
        return values


class AioKafka:
    name = "aiokafka"
    in_process = True

    def produce(self, access: Access, topic: str, values: list[bytes], client_id: str) -> None:
        async def run() -> None:
            producer = aiokafka.AIOKafkaProducer(
                client_id=client_id, acks="all", **access.aiokafka()
            )
            await producer.start()
            try:
                sent = [await producer.send(topic, value, key=value) for value in values]
                await asyncio.gather(*sent)
            finally:
                await producer.stop()

        asyncio.run(run())

    def offer(self, access: Access, topic: str, client_id: str, offer: Offer) -> Acks:
        async def run() -> Acks:
            producer = aiokafka.AIOKafkaProducer(client_id=client_id, acks=1, **access.aiokafka())
            await producer.start()
            acks: Acks = []
            value = b"o" * offer.record_bytes
            sent = 0
            pending = []
            try:
                for due in offer.schedule():
                    await asyncio.sleep(max(due - time.monotonic(), 0))
                    while sent - len(acks) >= offer.backlog:
                        await asyncio.sleep(0.005)
                    future = await producer.send(topic, value, key=str(sent).encode())
                    future.add_done_callback(
                        lambda _f: acks.append((time.monotonic(), offer.record_bytes))
                    )
                    pending.append(future)
                    sent += 1
                await asyncio.gather(*pending)
            finally:
                await producer.stop()
            return acks

        return asyncio.run(run())

    def read_for(self, access: Access, topic: str, client_id: str, offer: Offer) -> Acks:
        async def run() -> Acks:
            consumer = aiokafka.AIOKafkaConsumer(
                topic, client_id=client_id, auto_offset_reset="earliest", **access.aiokafka()
            )
            await consumer.start()
            received: Acks = []
            pace = offer.read_pace()
            read = 0
            deadline = time.monotonic() + offer.duration_s
            try:
                while time.monotonic() < deadline:
                    await asyncio.sleep(max(min(pace(read), deadline) - time.monotonic(), 0))
                    batches = await consumer.getmany(timeout_ms=200, max_records=100)
                    now = time.monotonic()
                    for records in batches.values():
                        sizes = [len(record.value or b"") for record in records]
                        received.extend((now, size) for size in sizes)
                        read += sum(sizes)
            finally:
                await consumer.stop()
            return received

        return asyncio.run(run())

    def consume(
        self, access: Access, topic: str, group: str, client_id: str, count: int
    ) -> list[bytes]:
        async def run() -> list[bytes]:
            consumer = aiokafka.AIOKafkaConsumer(
                topic,
                group_id=group,
                client_id=client_id,
                auto_offset_reset="earliest",
                **access.aiokafka(),
            )
            await consumer.start()
            values: list[bytes] = []
            deadline = time.monotonic() + CONSUME_TIMEOUT_S
            try:
                while len(values) < count and time.monotonic() < deadline:
                    batches = await consumer.getmany(timeout_ms=500)
                    for records in batches.values():
                        values.extend(record.value for record in records if record.value)
                await consumer.commit()
            finally:
                await consumer.stop()
            return values

        return asyncio.run(run())


class ConfluentKafka:
    name = "confluent-kafka"
    in_process = True

    def produce(self, access: Access, topic: str, values: list[bytes], client_id: str) -> None:
        producer = confluent_kafka.Producer(
            {**access.librdkafka(), "client.id": client_id, "acks": "all"}
        )
        failures: list[str] = []

        def delivered(error: Any, _message: Any) -> None:
            if error is not None:
                failures.append(str(error))

        for value in values:
            _produce_waiting_for_room(producer, topic, value, delivered)
        remaining = producer.flush(CONSUME_TIMEOUT_S)
        assert not failures, failures[:3]
        assert remaining == 0, f"{remaining} records undelivered"

    def offer(self, access: Access, topic: str, client_id: str, offer: Offer) -> Acks:
        producer = confluent_kafka.Producer(
            {**access.librdkafka(), "client.id": client_id, "acks": "1", "linger.ms": 5}
        )
        acks: Acks = []

        def delivered(error: Any, _message: Any) -> None:
            if error is None:
                acks.append((time.monotonic(), offer.record_bytes))

        value = b"o" * offer.record_bytes
        for sent, due in enumerate(offer.schedule()):
            while time.monotonic() < due or sent - len(acks) >= offer.backlog:
                producer.poll(max(due - time.monotonic(), 0.005))
            _produce_waiting_for_room(producer, topic, value, delivered, key=str(sent).encode())
        producer.flush(CONSUME_TIMEOUT_S)
        return acks

    def read_for(self, access: Access, topic: str, client_id: str, offer: Offer) -> Acks:
        consumer = confluent_kafka.Consumer(
            {
                **access.librdkafka(),
                # librdkafka needs a group id to subscribe; it commits nothing here.
                "group.id": f"{client_id}-reader",
                "client.id": client_id,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                # Its prefetch queue (64 MB by default) would read far ahead of the pace.
                "queued.max.messages.kbytes": max(int(offer.bytes_per_s / 1024), 1),
            }
        )
        consumer.subscribe([topic])
        received: Acks = []
        pace = offer.read_pace()
        read = 0
        deadline = time.monotonic() + offer.duration_s
        try:
            while time.monotonic() < deadline:
                _pace(min(pace(read), deadline))
                for message in consumer.consume(num_messages=100, timeout=0.2):
                    if message.error() is None:
                        size = len(message.value() or b"")
                        received.append((time.monotonic(), size))
                        read += size
        finally:
            consumer.close()
        return received

    def consume(
        self, access: Access, topic: str, group: str, client_id: str, count: int
    ) -> list[bytes]:
        consumer = confluent_kafka.Consumer(
            {
                **access.librdkafka(),
                "group.id": group,
                "client.id": client_id,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        consumer.subscribe([topic])
        values: list[bytes] = []
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        try:
            while len(values) < count and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is None:
                    continue
                assert message.error() is None, message.error()
                value = message.value()
                assert value is not None
                values.append(value)
            consumer.commit(asynchronous=False)
        finally:
            consumer.close()
        return values


class JavaClients:
    """Kafka's own ``KafkaProducer`` and ``KafkaConsumer`` with their defaults, one JVM per call
    (``tests/java/JavaClients.java``, a single-file program on the brokers' jars)."""

    name = "java"
    in_process = False
    PROGRAM: Final = Path(__file__).with_name("java") / "JavaClients.java"
    LOGGING: Final = Path(__file__).with_name("java") / "client_log4j2.properties"
    #: A run's own limit past its offer: the JVM's start and compiling the program.
    STARTUP_S: Final = 60.0

    def _run(
        self,
        mode: str,
        access: Access,
        client_id: str,
        harness: dict[str, object],
        timeout_s: float,
        stdin: str = "",
    ) -> str:
        properties = {**access.java(), "client.id": client_id}
        properties.update({f"offer.{key}": str(value) for key, value in harness.items()})
        command = [
            java(),
            f"-Dlog4j2.configurationFile={self.LOGGING}",
            "-cp",
            f"{kafka_libs()}/*",
            str(self.PROGRAM),
            mode,
            *(f"{key}={value}" for key, value in properties.items()),
        ]
        done = subprocess.run(
            command,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout_s + self.STARTUP_S,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"Kafka's Java client ({mode}) failed: {done.stderr[-3000:]}")
        if done.stderr:
            sys.stderr.write(f"Kafka's Java client ({mode}, {client_id}): {done.stderr}")
        return done.stdout

    @staticmethod
    def _timed(output: str) -> Acks:
        return [
            (float(at), int(size)) for at, size in (line.split() for line in output.splitlines())
        ]

    def produce(self, access: Access, topic: str, values: list[bytes], client_id: str) -> None:
        lines = "".join(f"{value.hex()}\n" for value in values)
        self._run("produce", access, client_id, {"topic": topic}, CONSUME_TIMEOUT_S, lines)

    def offer(self, access: Access, topic: str, client_id: str, offer: Offer) -> Acks:
        """As the other libraries' offers, with the producer's own buffer (32 MB) as its backlog
        bound, as Kafka's ``ProducerPerformance`` offers load: what it sends when a hold ends."""
        harness = {
            "topic": topic,
            "bytes_per_s": offer.bytes_per_s,
            "duration_s": offer.duration_s,
            "record_bytes": offer.record_bytes,
        }
        timeout_s = offer.duration_s + CONSUME_TIMEOUT_S
        return self._timed(self._run("offer", access, client_id, harness, timeout_s))

    def read_for(self, access: Access, topic: str, client_id: str, offer: Offer) -> Acks:
        harness = {"topic": topic, "bytes_per_s": offer.bytes_per_s, "duration_s": offer.duration_s}
        return self._timed(self._run("read", access, client_id, harness, offer.duration_s))

    def consume(
        self, access: Access, topic: str, group: str, client_id: str, count: int
    ) -> list[bytes]:
        harness = {"topic": topic, "group": group, "count": count}
        output = self._run("consume", access, client_id, harness, CONSUME_TIMEOUT_S)
        return [bytes.fromhex(line) for line in output.splitlines()]


def _pace(due: float) -> None:
    """Waits until ``due``: the offered rate's schedule, not a wait for something to happen."""
    time.sleep(max(due - time.monotonic(), 0))


def _produce_waiting_for_room(
    producer: Any,
    topic: str,
    value: bytes,
    delivered: Callable[[Any, Any], None],
    key: bytes | None = None,
) -> None:
    while True:
        try:
            producer.produce(topic, value, key=value if key is None else key, on_delivery=delivered)
            return
        except BufferError:  # librdkafka's queue is full: serve callbacks until there is room
            producer.poll(0.1)


LIBRARIES: Final[dict[str, ClientLibrary]] = {
    library.name: library
    for library in (KafkaPython(), AioKafka(), ConfluentKafka(), JavaClients())
}
