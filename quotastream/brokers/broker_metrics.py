"""The brokers' own counters as the engine's events: each broker's Prometheus JMX exporter
(``conf/kafka/jmx-exporter.yaml``) scraped every interval, what its counters counted since the
previous scrape (:class:`~quotastream.brokers.counters.CounterDeltas`) published as counts.

Counters (``kafka_server_BrokerTopicMetrics_Count{name=...}``) and the events they make:

* ``RemoteFetchBytesPerSec{topic}``: ``remote_fetch`` of the topic, no partition, its ``count``
  from ``RemoteFetchRequestsPerSec{topic}``;
* ``ReassignmentBytesOutPerSec``: ``replication``, ``role: leader``, broker-wide;
* ``ReassignmentBytesInPerSec``: ``replication``, ``role: follower``, broker-wide.

The reassignment counters, not the replication ones: they count the bytes of partitions being
reassigned, which are what a reassignment's throttled lists name, and so what Kafka's quota
counts under such a throttle; the replication counters count every replica's bytes
(``docs/events.md``). Remote copies come per partition from ``__remote_log_metadata``
(:mod:`quotastream.brokers.bridge`), not from here.

A broker that cannot be scraped is counted and logged (once per outage) and gives no event; its
counters' growth meanwhile is published at the next scrape that reaches it. Events that cannot be
published wait for the next interval, up to ``max_backlog`` of them; beyond that the oldest are
counted as dropped, never silently.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Final, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.parser import text_string_to_metric_families

from quotastream.brokers.counters import CounterDeltas, Scrape
from quotastream.clock import SYSTEM_CLOCK, Clock
from quotastream.outage import Outage
from quotastream.publisher import publish_every
from state.event_contract import RemoteFetch, Replication

log = logging.getLogger(__name__)

COUNT_METRIC: Final = "kafka_server_BrokerTopicMetrics_Count"
START_METRIC: Final = "process_start_time_seconds"
REMOTE_FETCH_BYTES: Final = "RemoteFetchBytesPerSec"
REMOTE_FETCH_REQUESTS: Final = "RemoteFetchRequestsPerSec"
#: Broker-wide counters, and the replication role whose bytes each counts.
REASSIGNMENT_BYTES: Final[dict[str, Literal["leader", "follower"]]] = {
    "ReassignmentBytesOutPerSec": "leader",
    "ReassignmentBytesInPerSec": "follower",
}
_READ: Final = frozenset({REMOTE_FETCH_BYTES, REMOTE_FETCH_REQUESTS, *REASSIGNMENT_BYTES})

#: (counter name, topic; "" for a broker-wide counter)
SeriesKey = tuple[str, str]


#: A count this source publishes: ``remote_fetch`` of a topic, or broker-wide ``replication``.
BrokerCount = RemoteFetch | Replication


class UnreadableMetricsError(ValueError):
    """An exporter's answer without the process start time (not a JMX exporter's)."""


def read_scrape(text: str) -> Scrape[SeriesKey]:
    """The counters this source reads, and the process start time, from an exporter's text."""
    values: dict[SeriesKey, float] = {}
    started_at = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == START_METRIC:
                started_at = sample.value
            elif sample.name == COUNT_METRIC and sample.labels.get("name") in _READ:
                values[(sample.labels["name"], sample.labels.get("topic", ""))] = sample.value
    if started_at is None:
        raise UnreadableMetricsError(f"no {START_METRIC}: not a JMX exporter's metrics")
    return Scrape(started_at, values)


def counts_of(broker: int, deltas: Mapping[SeriesKey, float], ts: int) -> list[BrokerCount]:
    """The events a broker's counter deltas make at ``ts``."""
    events: list[BrokerCount] = []
    for (name, topic), nbytes in sorted(deltas.items()):
        if name == REMOTE_FETCH_BYTES and topic:
            requests = deltas.get((REMOTE_FETCH_REQUESTS, topic), 0)
            events.append(
                RemoteFetch(
                    ts=ts,
                    bytes=int(nbytes),
                    count=max(int(requests), 1),
                    broker=broker,
                    topic=topic,
                )
            )
        elif name in REASSIGNMENT_BYTES and not topic:
            events.append(
                Replication(
                    ts=ts,
                    bytes=int(nbytes),
                    count=1,
                    broker=broker,
                    role=REASSIGNMENT_BYTES[name],
                )
            )
    return events


class ScrapeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.scrapes = Counter(
            "quotastream_broker_metrics_scrapes",
            "Scrapes of the brokers' exporters, by broker and outcome (ok, failed)",
            ["broker", "outcome"],
            registry=registry,
        )
        self.published = Counter(
            "quotastream_broker_metrics_events_published",
            "Counts from the brokers' metrics published to the events topic, by kind",
            ["kind"],
            registry=registry,
        )
        self.dropped = Counter(
            "quotastream_broker_metrics_events_dropped",
            "Counts dropped: the events topic was unreachable for longer than the backlog holds",
            registry=registry,
        )
        self.backlog = Gauge(
            "quotastream_broker_metrics_backlog",
            "Counts waiting to be published",
            registry=registry,
        )


class BrokerMetricsSource:
    """Scrapes every endpoint each pass (:meth:`poll`), publishes what the counters counted;
    :meth:`run` passes every interval until stopped.

    ``fetch(url)`` returns an exporter's text (raising ``OSError`` when unreachable);
    ``publish(events)`` sends events to the events topic and returns once the brokers have them
    (raising on failure). Both are injected: the command passes HTTP and a Kafka producer."""

    def __init__(
        self,
        endpoints: Mapping[int, str],
        *,
        fetch: Callable[[str], str],
        publish: Callable[[Sequence[BrokerCount]], None],
        metrics: ScrapeMetrics,
        max_backlog: int,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._endpoints = dict(endpoints)
        self._fetch = fetch
        self._publish = publish
        self._metrics = metrics
        self._max_backlog = max_backlog
        self._clock = clock
        self._deltas: CounterDeltas[SeriesKey] = CounterDeltas()
        self._outages = {
            broker: Outage(f"broker {broker}'s metrics at {url}", float("inf"), clock=clock)
            for broker, url in self._endpoints.items()
        }
        self._backlog: list[BrokerCount] = []

    def poll(self) -> list[BrokerCount]:
        """One scrape of every broker: the counts their counters made since the last one."""
        events = []
        for broker, url in sorted(self._endpoints.items()):
            try:
                scrape = read_scrape(self._fetch(url))
            except (OSError, UnreadableMetricsError) as error:
                self._metrics.scrapes.labels(str(broker), "failed").inc()
                self._outages[broker].failed(error)
                continue
            self._metrics.scrapes.labels(str(broker), "ok").inc()
            self._outages[broker].recovered()
            events += counts_of(broker, self._deltas.update(broker, scrape), self._clock.wall_ms())
        return events

    def publish(self, events: Sequence[BrokerCount]) -> None:
        """Publishes ``events`` after those still waiting; what fails waits for the next pass."""
        self._backlog += events
        overflow = len(self._backlog) - self._max_backlog
        if overflow > 0:
            log.error("dropping %d counts: the events topic is unreachable for too long", overflow)
            self._metrics.dropped.inc(overflow)
            del self._backlog[:overflow]
        self._metrics.backlog.set(len(self._backlog))
        if self._backlog:
            self._publish(self._backlog)
            for event in self._backlog:
                self._metrics.published.labels(event.kind).inc()
            self._backlog = []
            self._metrics.backlog.set(0)

    def run(self, stopped: threading.Event, interval_s: float, outage: Outage) -> None:
        """A pass every ``interval_s`` until ``stopped`` (:func:`publish_every`): counts that
        could not be published wait for the next pass's."""
        publish_every(self, stopped, interval_s, outage)
