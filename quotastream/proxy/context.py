"""What every connection of a proxy shares, and what a connection asks of it.

``ConnectionHost`` is all a :class:`~quotastream.proxy.connection.Connection` knows of the proxy
that made it: the clock and timers, its handlers, the way to its broker, and where to report its
life. ``ProxyContext`` is the proxy's: routes to the brokers, the handlers' chain, the metrics
of connections. Tests give a connection a host of their own, with fake sockets and a clock they
move.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Protocol

from quotastream.address import Address
from quotastream.clock import Clock
from quotastream.proxy.handler import Handler
from quotastream.proxy.metrics import ProxyMetrics
from quotastream.proxy.routing import Routes
from quotastream.proxy.settings import ProxySettings
from quotastream.proxy.transports import BrokerSide, BrokerSideEvents

log = logging.getLogger(__name__)

#: Reads the cluster's brokers, (node id, host, port) each (a blocking call: run off the loop).
BrokerReader = Callable[[], list[tuple[int, str, int]]]


class Timer(Protocol):
    def cancel(self) -> None: ...
    def cancelled(self) -> bool: ...
    def when(self) -> float: ...


class Connection(BrokerSideEvents, Protocol):
    """What the proxy asks of a connection (``connection.Connection``)."""

    node_id: int | None
    closed_as: str | None

    def broker_ready(self, node_id: int | None) -> None: ...
    def drain(self) -> None: ...
    def close(self, reason: str | None, label: str) -> None: ...


class ConnectionHost(Protocol):
    @property
    def clock(self) -> Clock: ...

    @property
    def max_frame_bytes(self) -> int: ...

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        """Calls ``callback`` at ``when`` (``clock.monotonic()`` seconds)."""
        ...

    def new_handlers(self) -> list[Handler]: ...

    def connect(self, connection: Connection) -> None:
        """Opens the connection's broker side: ``broker_connected`` then ``broker_ready``, or
        ``close`` with the reason it could not (a bootstrap connection learns its broker)."""
        ...

    def opened(self, connection: Connection) -> None: ...
    def closed(self, connection: Connection, reason: str) -> None: ...
    def held(self, seconds: float) -> None:
        """A client was muted ``seconds`` longer."""
        ...


class ProxyContext:
    """A proxy's ``ConnectionHost``, on its running event loop."""

    def __init__(
        self,
        settings: ProxySettings,
        *,
        routes: Routes,
        new_handlers: Callable[[], list[Handler]],
        metrics: ProxyMetrics,
        read_brokers: BrokerReader,
        clock: Clock,
    ) -> None:
        self.settings = settings
        self.routes = routes
        self.new_handlers = new_handlers
        self.metrics = metrics
        self.clock = clock
        self.max_frame_bytes = settings.max_frame_bytes
        self.upstream_ssl = settings.upstream.tls_context()
        #: Open connections, each with the future its close completes.
        self.connections: dict[Connection, asyncio.Future[str]] = {}
        self._read_brokers = read_brokers
        self._bootstrap = itertools.cycle(settings.upstream.addresses)
        self._turns = itertools.count()

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        # The loop's clock is time.monotonic, as SYSTEM_CLOCK's.
        return asyncio.get_running_loop().call_at(when, callback)

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

    def connect(self, connection: Connection) -> None:
        asyncio.get_running_loop().create_task(self._connect(connection))

    async def _connect(self, connection: Connection) -> None:
        node_id = connection.node_id
        try:
            address = await self.upstream_for(node_id)
            if node_id is None:
                node_id = self.routes.node_of(address)
            ssl = self.upstream_ssl
            _, protocol = await asyncio.get_running_loop().create_connection(
                lambda: BrokerSide(connection),
                address.host,
                address.port,
                ssl=ssl,
                server_hostname=address.host if ssl else None,
            )
        except (OSError, LookupError) as error:
            where = "bootstrap" if node_id is None else str(node_id)
            connection.close(f"broker {where} unreachable: {error}", "broker_unreachable")
            return
        del protocol  # its connection_made gave the connection its transport
        connection.broker_ready(node_id)

    def opened(self, connection: Connection) -> None:
        self.connections[connection] = asyncio.get_running_loop().create_future()
        self.metrics.connections.inc()
        self.metrics.connections_open.inc()

    def closed(self, connection: Connection, reason: str) -> None:
        done = self.connections.pop(connection, None)
        if done is not None:
            done.set_result(reason)
        self.metrics.connections_open.dec()
        self.metrics.connections_closed.labels(reason).inc()

    def held(self, seconds: float) -> None:
        self.metrics.held_seconds.inc(seconds)
