"""What a local Apache Kafka costs the tests and the embedded default: start time and memory.

For a single KRaft node (``start_kafka``, as the embedded default and most tests start it) and a
3-node cluster (``start_kafka_cluster``): the wall time from the call to a node that serves
clients (the storage tool's format included), and each JVM's resident memory right after the
start and after 100,000 records of 200 bytes were written and read back. Appends one JSON
object to bench/results/kafka_broker.jsonl::

    {"kafka_version": ..., "single.start_s": [...], "single.rss_mib": ...,
     "single.rss_after_traffic_mib": ..., "cluster.start_s": [...], "cluster.rss_mib": [...]}

    python bench/kafka_broker.py [--runs 3] [--records 100000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from results import record  # bench/ is on sys.path when a script in it runs

from streaming.kafka_broker import KafkaNode, kafka_version, start_kafka, start_kafka_cluster


def rss_mib(node: KafkaNode) -> float:
    """The node's JVM resident memory (Linux ``VmRSS``)."""
    for line in Path(f"/proc/{node.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for pid {node.process.pid}")


def traffic(node: KafkaNode, records: int) -> None:
    producer = KafkaProducer(bootstrap_servers=node.address, linger_ms=5)
    for _ in range(records):
        producer.send("bench", b"x" * 200, partition=0)
    producer.flush()
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=node.address, consumer_timeout_ms=5000)
    partition = TopicPartition("bench", 0)
    consumer.assign([partition])
    consumer.seek_to_beginning(partition)
    read = sum(1 for _ in consumer)
    consumer.close()
    assert read == records, read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="starts of each kind")
    parser.add_argument("--records", type=int, default=100_000, help="traffic: 200-byte records")
    args = parser.parse_args()
    single_start_s, single_rss, after_traffic = [], [], []
    for _ in range(args.runs):
        began = time.monotonic()
        with start_kafka() as node:
            single_start_s.append(round(time.monotonic() - began, 2))
            single_rss.append(rss_mib(node))
            traffic(node, args.records)
            after_traffic.append(rss_mib(node))
    cluster_start_s, cluster_rss = [], []
    for _ in range(args.runs):
        began = time.monotonic()
        with start_kafka_cluster(3) as cluster:
            cluster_start_s.append(round(time.monotonic() - began, 2))
            cluster_rss.append([rss_mib(node) for node in cluster.nodes])
    record(
        "kafka_broker",
        {
            "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "kafka_version": kafka_version(),
            "records": args.records,
            "single.start_s": single_start_s,
            "single.start_s_median": statistics.median(single_start_s),
            "single.rss_mib": statistics.median(single_rss),
            "single.rss_after_traffic_mib": statistics.median(after_traffic),
            "cluster.start_s": cluster_start_s,
            "cluster.start_s_median": statistics.median(cluster_start_s),
            "cluster.rss_mib": cluster_rss[-1],
        },
    )


if __name__ == "__main__":
    main()
