"""The asyncio protocols of a proxied connection's two sockets: each hands what happens on its
socket to the connection it serves (``connection.Connection``), and knows nothing else."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol


class Transport(Protocol):
    """What a connection uses of a socket's transport (``asyncio.Transport``, or a test's)."""

    def write(self, data: bytes | bytearray | memoryview) -> None: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def is_closing(self) -> bool: ...
    def close(self) -> None: ...
    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None: ...


class ClientSideEvents(Protocol):
    def client_connected(self, transport: Transport) -> None: ...
    def client_data(self, data: bytes) -> None: ...
    def client_full(self, full: bool) -> None: ...
    def client_lost(self) -> None: ...


class BrokerSideEvents(Protocol):
    def broker_connected(self, transport: Transport) -> None: ...
    def broker_data(self, data: bytes) -> None: ...
    def broker_full(self, full: bool) -> None: ...
    def broker_lost(self) -> None: ...


class ClientSide(asyncio.Protocol):
    def __init__(self, factory: Callable[[], ClientSideEvents]) -> None:
        self._factory = factory
        self.connection: ClientSideEvents | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.connection = self._factory()
        self.connection.client_connected(transport)

    def data_received(self, data: bytes) -> None:
        assert self.connection is not None
        self.connection.client_data(data)

    def pause_writing(self) -> None:
        assert self.connection is not None
        self.connection.client_full(True)

    def resume_writing(self) -> None:
        assert self.connection is not None
        self.connection.client_full(False)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.connection is not None:
            self.connection.client_lost()


class BrokerSide(asyncio.Protocol):
    def __init__(self, connection: BrokerSideEvents) -> None:
        self._connection = connection
        self.transport: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._connection.broker_connected(transport)

    def data_received(self, data: bytes) -> None:
        self._connection.broker_data(data)

    def pause_writing(self) -> None:
        self._connection.broker_full(True)

    def resume_writing(self) -> None:
        self._connection.broker_full(False)

    def connection_lost(self, exc: Exception | None) -> None:
        self._connection.broker_lost()
