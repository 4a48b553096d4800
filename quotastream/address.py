"""A broker's address, as bootstrap servers name it (``host:port``): what the agents' shared
settings, the proxy and the broker agents all speak of, owned by none of them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_addresses(servers: str) -> list[Address]:
    """``host:port,host:port`` (bootstrap servers) as addresses; names the bad entry."""
    addresses = []
    for entry in servers.split(","):
        host, _, port = entry.strip().rpartition(":")
        if not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
            raise ValueError(f"{entry.strip()!r} is not host:port")
        addresses.append(Address(host.strip("[]"), int(port)))
    return addresses
