"""The closed loop through ``quotastream proxy``: real clients held to their quota by the engine.

A 3-node Apache Kafka cluster, one Redis, the engine (local Spark, its default trigger) and the
proxy in front of the cluster, publishing usage to the engine's events topic on the cluster.
Quotas per client-id (``client_id: <default>``), produce and fetch with ``scope: cluster``: one
limit for a client over all brokers. Each client library in turn (kafka-python, aiokafka,
confluent-kafka):

* a producer offers 3x its quota for ``DURATION_S`` to a topic whose three partitions are led
  by the three brokers (so the quota it is held to is cluster-wide);
* a consumer offers to read 3x its quota (it reads no faster) from a topic filled beforehand
  with more than that.

``achieved_bytes_per_s``: every byte acknowledged (producer) or received (consumer), over the
run. Kafka's rate is padded to ten windows at first, so a client that offers more than its
quota may send ten windows' worth at once (a greedy consumer does, in its first fetches, which
the proxy caps at that as a broker does) and is then held until its average is back at the
quota: over a run the average is the quota, and the ratio shows how near the loop comes to it.
Measured from the first window's end instead, the consumer would show well under its quota for
the same reason, with Kafka itself as with the engine. The engine decides on usage it has read:
a decision
comes a trigger, a batch and a refresh after the bytes (``decision_latency_ms``: the mean
trigger-to-commit time of the engine's batches plus the proxy's flush and refresh intervals),
and a client that ignores ``throttle_time_ms`` sends at its offered rate until it comes.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the client libraries

from state.config import load_quota_config
from streaming.commands.proxy import RunningProxy
from streaming.engine.job import local_spark, start_query
from streaming.engine.settings import EngineSettings
from streaming.kafka_broker import start_kafka_cluster
from streaming.services import free_ports, start_redis
from tests.client_libraries import LIBRARIES, Access, Acks, Offer
from tests.servers import wait_until_in_sync

QUOTA_BYTES_PER_S = 500_000
DURATION_S = 30.0
QUOTAS = f"""
quota_types:
  produce: {{samples: 11, window_ms: 1000, scope: cluster}}
  fetch: {{samples: 11, window_ms: 1000, scope: cluster}}
clients:
  - client_id: <default>
    producer_byte_rate: {QUOTA_BYTES_PER_S}
    consumer_byte_rate: {QUOTA_BYTES_PER_S}
"""
EVENTS = "quotastream.events"
FILLED = "filled"


def achieved(acks: Acks, duration_s: float) -> float:
    """Bytes per second over the run: every byte acknowledged (or received) from the first,
    over the run's duration or to the last, whichever is longer."""
    if not acks:
        return 0.0
    first = min(at for at, _ in acks)
    last = max(at for at, _ in acks)
    return sum(n for _, n in acks) / max(last - first, duration_s)


def fill(address: str, topic: str, nbytes: int) -> None:
    """``nbytes`` of 10 kB records, every one acknowledged (batches under the broker's
    ``max.message.bytes``)."""
    producer = KafkaProducer(bootstrap_servers=address, acks=1, linger_ms=20, batch_size=256_000)
    value = b"f" * 10_000
    sent = [producer.send(topic, value, key=str(i).encode()) for i in range(nbytes // len(value))]
    for future in sent:
        future.get(timeout=60)
    producer.close()


def engine_running(query: Any, address: str, timeout_s: float = 120) -> None:
    """Until the query has decided its first batch (Spark's first one takes seconds to plan):
    a warm-up event, and its read offset."""
    producer = KafkaProducer(bootstrap_servers=address)
    event = {"kind": "produce", "ts": int(time.time() * 1000), "bytes": 1, "user": "warm-up"}
    producer.send(EVENTS, json.dumps({**event, "client_id": "", "broker": 1}).encode()).get(60)
    producer.close()
    deadline = time.monotonic() + timeout_s
    while not any(_batch_rows(progress) for progress in query.recentProgress):
        if time.monotonic() > deadline or not query.isActive:
            raise RuntimeError(f"the engine decided nothing in {timeout_s} s: {query.exception()}")
        time.sleep(0.2)


def _batch_rows(progress: Any) -> int:
    rows = getattr(progress, "numInputRows", None)
    return int(progress["numInputRows"] if rows is None else rows)


def _batch_ms(progress: Any) -> float:
    """A batch's trigger-to-commit time (PySpark 4 gives progress objects; older, dicts)."""
    durations = getattr(progress, "durationMs", None) or progress["durationMs"]
    return float(durations.get("triggerExecution", 0))


def closed_loop() -> dict[str, Any]:
    result: dict[str, Any] = {}
    with (
        start_kafka_cluster(3) as cluster,
        start_redis() as redis_server,
        tempfile.TemporaryDirectory() as workdir,
    ):
        quotas = Path(workdir) / "quotas.yaml"
        quotas.write_text(QUOTAS)
        first = free_ports(5)
        settings = EngineSettings.model_validate(
            {
                "quotas": str(quotas),
                "kafka": {
                    "bootstrap_servers": cluster.address,
                    "topics": [EVENTS],
                    "starting_offsets": "earliest",
                    "config_topic": None,
                },
                "redis": {"host": redis_server.host, "port": redis_server.port},
                "spark": {"checkpoint": str(Path(workdir) / "checkpoint")},
                "metrics": {"enabled": False},
                "proxy": {
                    "bootstrap_port": first,
                    "node_port_base": first + 1,
                    "upstream": {"bootstrap_servers": cluster.address},
                    "metrics": {"enabled": False},
                },
            }
        )
        topics = [EVENTS, FILLED, *(f"offered-{name}" for name in LIBRARIES)]
        admin = KafkaAdminClient(bootstrap_servers=cluster.address)
        admin.create_topics([NewTopic(topic, 3, 1) for topic in topics])
        admin.close()
        wait_until_in_sync(cluster.address, topics)
        # More than a consumer offered 3x its quota reads in the run (each reads it all anew).
        fill(cluster.address, FILLED, int(4 * QUOTA_BYTES_PER_S * DURATION_S))
        config = load_quota_config(quotas)
        spark = local_spark(settings)
        query = start_query(spark, settings, config)
        try:
            engine_running(query, cluster.address)
            with RunningProxy(settings, config) as proxy:
                access = Access(proxy.bootstrap_servers)
                offer = Offer(bytes_per_s=3 * QUOTA_BYTES_PER_S, duration_s=DURATION_S)
                for name, library in LIBRARIES.items():
                    produced = library.offer(access, f"offered-{name}", f"{name}-producer", offer)
                    read = library.read_for(access, FILLED, f"{name}-consumer", offer)
                    # The keys name the producer's figures; the consumer's add ".consumer".
                    for prefix, acks in (
                        (f"closed_loop.{name}", produced),
                        (f"closed_loop.{name}.consumer", read),
                    ):
                        result[f"{prefix}.quota_bytes_per_s"] = QUOTA_BYTES_PER_S
                        rate = achieved(acks, DURATION_S)
                        result[f"{prefix}.achieved_bytes_per_s"] = round(rate)
                        result[f"{prefix}.ratio"] = round(rate / QUOTA_BYTES_PER_S, 3)
                    print({k: v for k, v in result.items() if k.startswith(f"closed_loop.{name}")})
            batches = [_batch_ms(progress) for progress in query.recentProgress]
        finally:
            query.stop()
            spark.stop()
    batch_ms = statistics.mean(batches) if batches else 0.0
    trigger_ms = settings.spark.trigger_ms
    result["closed_loop.brokers"] = 3
    result["closed_loop.offered_x_quota"] = 3
    result["closed_loop.duration_s"] = DURATION_S
    result["closed_loop.engine_batch_ms"] = round(batch_ms)
    # Bytes reach a decision the proxy holds by: a flush, up to a trigger, a batch, a refresh.
    result["closed_loop.decision_latency_ms"] = round(
        settings.proxy.flush_interval_ms / 2
        + trigger_ms / 2
        + batch_ms
        + settings.proxy.decisions.refresh_ms / 2
    )
    return result


if __name__ == "__main__":
    print(closed_loop())
