"""The Kafka source read outside Spark: topics made and filled, and a reader's planned partitions
read as a worker reads them."""

from __future__ import annotations

import pickle
import uuid

from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from streaming.engine.kafka_source import KafkaStreamReader
from streaming.engine.offsets import SourceOptions
from streaming.services import LocalService


def new_topic(broker: LocalService, partitions: int, name: str | None = None) -> str:
    """A topic of ``partitions`` partitions: ``name``, or a new name."""
    name = name or f"events-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=broker.address)
    admin.create_topics([NewTopic(name, partitions, 1)])
    admin.close()
    return name


def produce(broker: LocalService, topic: str, count: int, partitions: int, first: int = 0) -> None:
    producer = KafkaProducer(bootstrap_servers=broker.address, linger_ms=20)
    for i in range(first, first + count):
        producer.send(topic, str(i).encode(), partition=i % partitions)
    producer.flush()
    producer.close()


def reader(broker: LocalService, topic: str, **options: str) -> KafkaStreamReader:
    return KafkaStreamReader(
        SourceOptions.parse(
            {"kafka.bootstrap.servers": broker.address, "subscribe": topic, **options}
        )
    )


Checkpoint = dict[str, dict[str, int]]


def read_all(
    source: KafkaStreamReader, start: Checkpoint, end: Checkpoint
) -> list[tuple[int, int, bytes]]:
    """Reads every planned partition in a copy of the reader, as a Spark worker would."""
    worker = pickle.loads(pickle.dumps(source))
    rows: list[tuple[int, int, bytes]] = []
    for partition in source.partitions(start, end):
        for records in worker.records(partition.value):
            rows += (
                (records.partition, offset, value)
                for offset, value in zip(records.offsets, records.values, strict=True)
            )
    return rows
