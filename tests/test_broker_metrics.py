"""The brokers' counters as counts (quotastream/brokers/broker_metrics.py): what a scrape reads,
the events its deltas make, an exporter that is down, a restart, an events topic that is down.
The exporters here are texts in the JMX exporter's format; the source on a real cluster's
exporters is in tests/test_broker_metrics_cluster.py."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from quotastream.brokers.broker_metrics import (
    BrokerCount,
    BrokerMetricsSource,
    ScrapeMetrics,
    UnreadableMetricsError,
    read_scrape,
)
from state.event_contract import RemoteFetch, Replication
from tests.support.agents import FakeClock


def exporter(started: float, fetched: int, requests: int, moved_out: int) -> str:
    """A broker's exporter text, as the JMX exporter 1.0.1 writes it (the lines this reads and
    some it does not)."""
    count = "kafka_server_BrokerTopicMetrics_Count"
    return f"""# HELP process_start_time_seconds Start time of the process since unix epoch.
# TYPE process_start_time_seconds gauge
process_start_time_seconds {started}
# TYPE {count} untyped
{count}{{name="RemoteFetchBytesPerSec",topic="orders"}} {fetched}.0
{count}{{name="RemoteFetchRequestsPerSec",topic="orders"}} {requests}.0
{count}{{name="RemoteFetchBytesPerSec"}} {fetched}.0
{count}{{name="ReassignmentBytesOutPerSec"}} {moved_out}.0
{count}{{name="ReassignmentBytesInPerSec"}} 0.0
{count}{{name="BytesInPerSec",topic="orders"}} 123.0
kafka_server_BrokerTopicMetrics_Value{{name="RemoteLogSizeBytes",topic="orders"}} 5.0
"""


def test_a_scrape_reads_the_counters_it_publishes_and_the_process_start() -> None:
    scrape = read_scrape(exporter(1_700_000_000.5, 900, 3, 40))
    assert scrape.started_at == 1_700_000_000.5
    assert scrape.values == {
        ("RemoteFetchBytesPerSec", "orders"): 900.0,
        ("RemoteFetchRequestsPerSec", "orders"): 3.0,
        ("RemoteFetchBytesPerSec", ""): 900.0,
        ("ReassignmentBytesOutPerSec", ""): 40.0,
        ("ReassignmentBytesInPerSec", ""): 0.0,
    }
    with pytest.raises(UnreadableMetricsError, match="process_start_time_seconds"):
        read_scrape("up 1\n")


class Cluster:
    """Exporters whose texts a test sets, down ones raising as urllib does."""

    def __init__(self) -> None:
        self.texts: dict[str, str | None] = {}
        self.published: list[BrokerCount] = []
        self.topic_down = False

    def fetch(self, url: str) -> str:
        text = self.texts[url]
        if text is None:
            raise ConnectionRefusedError(111, "Connection refused")
        return text

    def publish(self, events: Sequence[BrokerCount]) -> None:
        if self.topic_down:
            raise OSError("the events topic is unreachable")
        self.published += events


def source(cluster: Cluster, max_backlog: int = 100) -> BrokerMetricsSource:
    return BrokerMetricsSource(
        {1: "http://b1/metrics", 2: "http://b2/metrics"},
        fetch=cluster.fetch,
        publish=cluster.publish,
        metrics=ScrapeMetrics(CollectorRegistry()),
        max_backlog=max_backlog,
        clock=FakeClock(wall_ms=1_000),
    )


def test_counts_are_what_each_broker_counted_since_its_last_scrape() -> None:
    cluster = Cluster()
    metrics = source(cluster)
    cluster.texts = {"http://b1/metrics": exporter(1.0, 900, 3, 40), "http://b2/metrics": None}
    assert metrics.poll() == []  # broker 1's baseline; broker 2 is down
    cluster.texts = {
        "http://b1/metrics": exporter(1.0, 1_500, 5, 40),
        "http://b2/metrics": exporter(7.0, 50, 1, 10),
    }
    assert metrics.poll() == [
        RemoteFetch(ts=1_000, bytes=600, count=2, broker=1, topic="orders")
    ]  # broker 2's first scrape is its baseline
    # Broker 1 restarted: its counters started over.
    cluster.texts["http://b1/metrics"] = exporter(2.0, 100, 1, 0)
    cluster.texts["http://b2/metrics"] = exporter(7.0, 50, 1, 4_010)
    assert metrics.poll() == [
        RemoteFetch(ts=1_000, bytes=100, count=1, broker=1, topic="orders"),
        Replication(ts=1_000, bytes=4_000, count=1, broker=2, role="leader"),
    ]


def test_counts_wait_while_the_events_topic_is_down_and_the_oldest_go_past_the_backlog() -> None:
    cluster = Cluster()
    metrics = source(cluster, max_backlog=2)
    cluster.topic_down = True
    for nbytes in (1, 2, 3):
        with pytest.raises(OSError, match="unreachable"):
            metrics.publish([Replication(ts=1, bytes=nbytes, broker=1, role="leader")])
    cluster.topic_down = False
    metrics.publish([])
    assert [e.bytes for e in cluster.published] == [2, 3]  # 1 dropped, and counted
