"""The proxy's listeners, shared state and lifecycle: start, run, drain.

At start the proxy reads the cluster's brokers with its own client (``upstream.client``) and
opens the bootstrap port and one port per broker; later Metadata responses open and close
ports as brokers join and leave. A connection to a broker's port whose broker the proxy does
not know (a client reconnecting with addresses from before a proxy restart) reads the cluster
again before it gives up. A stop closes the listeners, lets every connection finish the
requests it forwarded (``drain_timeout_s`` at most), publishes the last sums and closes.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import socket
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from quotastream.proxy import wire
from quotastream.proxy.connection import ClientSide, Connection
from quotastream.proxy.holds import Holds
from quotastream.proxy.metrics import ProxyMetrics
from quotastream.proxy.routing import Address, Routes
from quotastream.proxy.settings import ProxySettings
from quotastream.proxy.usage import UsagePublisher, UsageSums

log = logging.getLogger(__name__)

#: Reads the cluster's brokers, (node id, host, port) each (a blocking call: run off the loop).
BrokerReader = Callable[[], list[tuple[int, str, int]]]


def cluster_brokers(bootstrap_servers: str, client: dict[str, Any]) -> list[tuple[int, str, int]]:
    """The cluster's unfenced brokers, read with kafka-python's admin client."""
    from kafka import KafkaAdminClient  # noqa: PLC0415 (kafka-python loads slowly; only here)

    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, **client)
    try:
        cluster = admin.describe_cluster()
    finally:
        admin.close()
    return [
        (broker["broker_id"], broker["host"], broker["port"])
        for broker in cluster["brokers"]
        if not broker.get("is_fenced", False)
    ]


class ProxyContext:
    """What every connection shares: routes, usage sums, holds, metrics."""

    def __init__(
        self,
        settings: ProxySettings,
        *,
        routes: Routes,
        usage: UsageSums,
        holds: Holds,
        metrics: ProxyMetrics,
        read_brokers: BrokerReader,
    ) -> None:
        self.settings = settings
        self.routes = routes
        self.usage = usage
        self.holds = holds
        self.metrics = metrics
        self.upstream_ssl = settings.upstream.tls_context()
        self.connections: set[Connection] = set()
        self._read_brokers = read_brokers
        self._bootstrap = itertools.cycle(settings.upstream.addresses)
        self._turns = itertools.count()
        self._by_api: dict[int, tuple[Any, Any, Any]] = {}

    async def refresh_brokers(self) -> None:
        brokers = await asyncio.get_running_loop().run_in_executor(None, self._read_brokers)
        self.routes.learn(brokers)

    async def upstream_for(self, node_id: int | None) -> Address:
        """The broker a new connection leads to: a broker's own, or for the bootstrap port the
        next known broker (the configured bootstrap servers while none is known)."""
        if node_id is None:
            known = self.routes.brokers
            if known:
                ids = sorted(known)
                return known[ids[next(self._turns) % len(ids)]]
            return next(self._bootstrap)
        address = self.routes.upstream(node_id)
        if address is None:
            await self.refresh_brokers()
            address = self.routes.upstream(node_id)
        if address is None:
            raise LookupError(f"the cluster has no broker {node_id}")
        return address

    def opened(self, connection: Connection) -> None:
        self.connections.add(connection)
        self.metrics.connections.inc()
        self.metrics.connections_open.inc()

    def closed(self, connection: Connection, reason: str) -> None:
        self.connections.discard(connection)
        self.metrics.connections_open.dec()
        self.metrics.connections_closed.labels(reason).inc()

    def forwarded(self, api_key: int, nbytes: int) -> None:
        requests, request_bytes, _ = self._api_metrics(api_key)
        requests.inc()
        request_bytes.inc(nbytes)

    def returned(self, api_key: int, nbytes: int) -> None:
        self._api_metrics(api_key)[2].inc(nbytes)

    def _api_metrics(self, api_key: int) -> tuple[Any, Any, Any]:
        """An API's labelled counters, looked up once (``labels()`` costs a lock and a hash
        on the hot path)."""
        found = self._by_api.get(api_key)
        if found is None:
            api = wire.api_name(api_key)
            found = self._by_api[api_key] = (
                self.metrics.requests.labels(api),
                self.metrics.bytes.labels(api, "request"),
                self.metrics.bytes.labels(api, "response"),
            )
        return found


class Proxy:
    """The proxy: ``await start()``, then ``await stop()`` (drains)."""

    def __init__(
        self,
        settings: ProxySettings,
        *,
        holds: Holds,
        publisher: UsagePublisher,
        windows_ms: dict[str, int],
        metrics: ProxyMetrics,
        read_brokers: BrokerReader,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self._publisher = publisher
        self._holds = holds
        self.routes = Routes(settings.client_host, settings.node_port_base, self._brokers_changed)
        holds.count_brokers_with(lambda: len(self.routes.brokers))
        usage = UsageSums(windows_ms, settings.max_pending_sums, metrics.dropped)
        self.context = ProxyContext(
            settings,
            routes=self.routes,
            usage=usage,
            holds=holds,
            metrics=metrics,
            read_brokers=read_brokers,
        )
        self._client_ssl = settings.tls.context() if settings.tls is not None else None
        self._servers: dict[int | None, asyncio.Server] = {}
        self._flusher: asyncio.Task[None] | None = None
        self.bootstrap_port = settings.bootstrap_port

    @staticmethod
    def new_registry() -> tuple[CollectorRegistry, ProxyMetrics]:
        registry = CollectorRegistry()
        return registry, ProxyMetrics(registry)

    def node_ports(self) -> dict[int, int]:
        return {node_id: self.routes.proxy_port(node_id) for node_id in self.routes.brokers}

    async def start(self) -> None:
        self._holds.start()
        await self.context.refresh_brokers()
        bootstrap = self._listen(self.settings.bootstrap_port)
        self._servers[None] = await self._serve(bootstrap, None)
        self.bootstrap_port = bootstrap.getsockname()[1]
        self._flusher = asyncio.get_running_loop().create_task(self._flush_forever())
        log.info(
            "proxy listening on %s:%d for brokers %s",
            self.settings.listen_host,
            self.bootstrap_port,
            ", ".join(f"{n}->{a}" for n, a in sorted(self.routes.brokers.items())),
        )

    @property
    def longest_stop_s(self) -> float:
        """How long :meth:`stop` may take: each of its waits at its bound."""
        drain = self.settings.drain_timeout_s
        return drain + UsagePublisher.longest_close_s(drain) + Holds.STOP_TIMEOUT_S

    async def stop(self) -> None:
        """Stops accepting, drains forwarded requests, publishes the last usage, closes."""
        for server in self._servers.values():
            server.close()
        connections = list(self.context.connections)
        for connection in connections:
            connection.drain()
        if connections:
            _, late = await asyncio.wait(
                [c.closed for c in connections], timeout=self.settings.drain_timeout_s
            )
            for connection in connections:
                if not connection.closed.done():
                    connection.close(
                        "still waiting for a response at the end of the drain", "stopped"
                    )
            if late:
                log.warning("%d connections closed before their responses came", len(late))
        if self._flusher is not None:
            self._flusher.cancel()
        self._publisher.offer(self.context.usage.take())
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._publisher.close, self.settings.drain_timeout_s)
        await loop.run_in_executor(None, self._holds.stop)

    async def _flush_forever(self) -> None:
        interval = self.settings.flush_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            self._publisher.offer(self.context.usage.take())

    def _listen(self, port: int) -> socket.socket:
        return socket.create_server((self.settings.listen_host, port), backlog=512)

    async def _serve(self, sock: socket.socket, node_id: int | None) -> asyncio.Server:
        context = self.context

        def protocol() -> ClientSide:
            return ClientSide(lambda: Connection(context, node_id))

        return await asyncio.get_running_loop().create_server(
            protocol, sock=sock, ssl=self._client_ssl
        )

    def _brokers_changed(self, joined: set[int], left: set[int]) -> None:
        loop = asyncio.get_running_loop()
        for node_id in sorted(joined):
            port = self.routes.proxy_port(node_id)
            try:
                # Bound now, so that a client told this port in the response being rewritten
                # finds it; connections wait in the backlog until the server accepts.
                sock = self._listen(port)
            except OSError as error:
                log.error("cannot open port %d for broker %d: %s", port, node_id, error)
                continue
            task = loop.create_task(self._serve(sock, node_id))
            task.add_done_callback(functools.partial(self._served, node_id))
            log.info("broker %d joined: port %d", node_id, port)
        for node_id in sorted(left):
            server = self._servers.pop(node_id, None)
            if server is not None:
                server.close()
            log.info("broker %d left: port %d closed", node_id, self.routes.proxy_port(node_id))
        self.metrics.brokers.set(len(self.routes.brokers))

    def _served(self, node_id: int, done: asyncio.Task[asyncio.Server]) -> None:
        if not done.cancelled() and done.exception() is None:
            self._servers[node_id] = done.result()
