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
import logging
import socket
from typing import Any

from quotastream.clock import SYSTEM_CLOCK, Clock
from quotastream.proxy.connection import Connection
from quotastream.proxy.context import BrokerReader, ProxyContext
from quotastream.proxy.handlers import proxy_handlers
from quotastream.proxy.holds import Holds
from quotastream.proxy.metrics import ProxyMetrics
from quotastream.proxy.routing import Routes
from quotastream.proxy.settings import ProxySettings
from quotastream.proxy.transports import ClientSide
from quotastream.proxy.usage import UsageSums
from quotastream.publisher import QueuedPublisher

log = logging.getLogger(__name__)


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


class Proxy:
    """The proxy: ``await start()``, then ``await stop()`` (drains)."""

    def __init__(
        self,
        settings: ProxySettings,
        *,
        holds: Holds,
        publisher: QueuedPublisher,
        windows_ms: dict[str, int],
        metrics: ProxyMetrics,
        read_brokers: BrokerReader,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self._publisher = publisher
        self.holds = holds
        self.routes = Routes(settings.client_host, settings.node_port_base, self._brokers_changed)
        holds.count_brokers_with(lambda: len(self.routes.brokers))
        usage = UsageSums(windows_ms, settings.max_pending_sums, metrics.dropped)
        self.usage = usage
        self.context = ProxyContext(
            settings,
            routes=self.routes,
            new_handlers=proxy_handlers(
                sasl_mechanisms=frozenset(settings.sasl_mechanisms),
                holds=holds,
                usage=usage,
                routes=self.routes,
                metrics=metrics,
            ),
            metrics=metrics,
            read_brokers=read_brokers,
            clock=clock,
        )
        self._client_ssl = settings.tls.context() if settings.tls is not None else None
        self._servers: dict[int | None, asyncio.Server] = {}
        self._flusher: asyncio.Task[None] | None = None
        self.bootstrap_port = settings.bootstrap_port

    def node_ports(self) -> dict[int, int]:
        return {node_id: self.routes.proxy_port(node_id) for node_id in self.routes.brokers}

    async def start(self) -> None:
        self.holds.start()
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
        return drain + QueuedPublisher.longest_close_s(drain) + Holds.STOP_TIMEOUT_S

    async def stop(self) -> None:
        """Stops accepting, drains forwarded requests, publishes the last usage, closes."""
        for server in self._servers.values():
            server.close()
        connections = dict(self.context.connections)
        for connection in connections:
            connection.drain()
        if connections:
            _, late = await asyncio.wait(
                connections.values(), timeout=self.settings.drain_timeout_s
            )
            for connection in connections:
                if connection.closed_as is None:
                    connection.close(
                        "still waiting for a response at the end of the drain", "stopped"
                    )
            if late:
                log.warning("%d connections closed before their responses came", len(late))
        if self._flusher is not None:
            self._flusher.cancel()
        self._publisher.offer(self.usage.take())
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._publisher.close, self.settings.drain_timeout_s)
        await loop.run_in_executor(None, self.holds.stop)

    async def _flush_forever(self) -> None:
        interval = self.settings.flush_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            self._publisher.offer(self.usage.take())

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
