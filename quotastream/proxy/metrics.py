"""The proxy's Prometheus metrics (``docs/proxy.md``, "Metrics").

Its decision lookups are counted by the agents' cached client in the same registry
(``quotastream_agent_answers_total{source}``, ``quotastream_agent_redis_up``, ...): the proxy is
an agent, and one metric says how agents read decisions.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class ProxyMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.connections_open = Gauge(
            "quotastream_proxy_connections",
            "Client connections open through the proxy",
            registry=registry,
        )
        self.connections = Counter(
            "quotastream_proxy_connections_accepted",
            "Client connections accepted",
            registry=registry,
        )
        self.connections_closed = Counter(
            "quotastream_proxy_connections_closed",
            "Client connections closed, by reason",
            ["reason"],
            registry=registry,
        )
        self.requests = Counter(
            "quotastream_proxy_requests",
            "Requests forwarded to brokers, by API",
            ["api"],
            registry=registry,
        )
        self.bytes = Counter(
            "quotastream_proxy_bytes",
            "Bytes of frames forwarded, by API and direction (request: to brokers)",
            ["api", "direction"],
            registry=registry,
        )
        self.throttled_responses = Counter(
            "quotastream_proxy_throttled_responses",
            "Produce and Fetch responses whose throttle_time_ms the engine's decision raised",
            ["api"],
            registry=registry,
        )
        self.emptied_fetches = Counter(
            "quotastream_proxy_emptied_fetches",
            "Fetch responses over the client's quota, answered empty as a broker answers them",
            registry=registry,
        )
        self.held_seconds = Counter(
            "quotastream_proxy_held_seconds",
            "Time client connections were muted by a throttle (the broker's or the engine's)",
            registry=registry,
        )
        self.events_published = Counter(
            "quotastream_proxy_events_published",
            "Usage events the events topic acknowledged",
            registry=registry,
        )
        self.events_dropped = Counter(
            "quotastream_proxy_events_dropped",
            "Usage events that could not be published, by reason",
            ["reason"],
            registry=registry,
        )
        self.bytes_dropped = Counter(
            "quotastream_proxy_counted_bytes_dropped",
            "Counted client bytes in usage events that could not be published, by reason",
            ["reason"],
            registry=registry,
        )
        self.brokers = Gauge(
            "quotastream_proxy_brokers",
            "Brokers the proxy has a port for (from the latest Metadata response)",
            registry=registry,
        )

    def dropped(self, reason: str, events: int, nbytes: int) -> None:
        self.events_dropped.labels(reason).inc(events)
        self.bytes_dropped.labels(reason).inc(nbytes)
