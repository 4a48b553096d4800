"""Which broker each proxy port leads to, and every broker address a client is told.

The proxy listens on a bootstrap port and on one port per broker node id (``node_port_base +
node id``). Clients learn brokers only from responses: Metadata, FindCoordinator (v0-3 one node,
v4+ a list), DescribeCluster, and the ``NodeEndpoints`` of Produce v10+ and Fetch v16+ (KIP-951
leader hints). Each of them is rewritten here, in one place, so that no address of a broker
reaches a client: a client that learnt one would bypass the proxy from then on, silently.

The broker set is what the latest Metadata response lists: a broker that joins gets a port, one
that leaves loses it (its open connections stay until they end).

ApiVersions is narrowed to what the proxy can follow: the APIs whose responses it rewrites are
capped at the versions its codecs know, and APIs whose responses carry addresses it does not
rewrite (DescribeQuorum, KIP-932 ShareFetch/ShareAcknowledge) are not advertised at all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Final

from quotastream.address import Address
from quotastream.proxy import wire

log = logging.getLogger(__name__)

#: APIs whose responses name brokers the proxy does not rewrite: never advertised.
NOT_ADVERTISED: Final = frozenset({wire.DESCRIBE_QUORUM, wire.SHARE_FETCH, wire.SHARE_ACKNOWLEDGE})

#: The responses that carry broker addresses (``Routes.rewrite``).
REWRITTEN: Final = frozenset(
    {wire.METADATA, wire.FIND_COORDINATOR, wire.DESCRIBE_CLUSTER, wire.PRODUCE, wire.FETCH}
)


class Routes:
    """Node id to upstream broker, and the proxy's address for each node id.

    ``on_change(joined, left)`` is called with the node ids that appeared or disappeared, so that
    the server opens and closes their ports.
    """

    def __init__(
        self,
        advertised_host: str,
        node_port_base: int,
        on_change: Callable[[set[int], set[int]], None] = lambda joined, left: None,
    ) -> None:
        self.advertised_host = advertised_host
        self.node_port_base = node_port_base
        self._brokers: dict[int, Address] = {}
        self._on_change = on_change

    @property
    def brokers(self) -> dict[int, Address]:
        return dict(self._brokers)

    def proxy_port(self, node_id: int) -> int:
        return self.node_port_base + node_id

    def upstream(self, node_id: int) -> Address | None:
        return self._brokers.get(node_id)

    def node_of(self, address: Address) -> int | None:
        """The node id of an upstream broker address (a bootstrap connection's broker)."""
        for node_id, known in self._brokers.items():
            if known == address:
                return node_id
        return None

    def learn(self, brokers: Iterable[tuple[int, str, int]]) -> None:
        """The cluster's brokers as a Metadata response lists them: (node id, host, port)."""
        current = {node_id: Address(host, port) for node_id, host, port in brokers}
        joined = current.keys() - self._brokers.keys()
        left = self._brokers.keys() - current.keys()
        moved = {
            node_id
            for node_id in current.keys() & self._brokers.keys()
            if current[node_id] != self._brokers[node_id]
        }
        self._brokers = current
        for node_id in sorted(moved):
            log.info("broker %d is now at %s", node_id, current[node_id])
        if joined or left:
            self._on_change(set(joined), set(left))

    def rewrite(self, api_key: int, api_version: int, message: Any) -> bool:
        """Points every broker address in a response at the proxy; True when one was there."""
        if api_key == wire.METADATA:
            self.learn((b.node_id, b.host, b.port) for b in message.brokers)
            return self._rewrite_nodes(message.brokers, "node_id")
        if api_key == wire.FIND_COORDINATOR:
            # v0-3 name one coordinator in the body, v4+ a list; -1: none (an error).
            coordinators = [message] if api_version < 4 else message.coordinators
            return self._rewrite_nodes([c for c in coordinators if c.node_id >= 0], "node_id")
        if api_key == wire.DESCRIBE_CLUSTER:
            return self._rewrite_nodes(message.brokers, "broker_id")
        if api_key in (wire.PRODUCE, wire.FETCH):
            return self._rewrite_nodes(message.node_endpoints or [], "node_id")
        return False

    def _rewrite_nodes(self, nodes: list[Any], id_field: str) -> bool:
        for node in nodes:
            node.host = self.advertised_host
            node.port = self.proxy_port(getattr(node, id_field))
        return bool(nodes)


def advertised_versions(api_keys: list[Any]) -> list[Any]:
    """The broker's ApiVersions entries narrowed to what the proxy can follow."""
    kept = []
    for entry in api_keys:
        if entry.api_key in NOT_ADVERTISED:
            continue
        ceiling = entry.max_version
        for codecs in (wire.REQUESTS, wire.RESPONSES):
            if entry.api_key in codecs:
                ceiling = min(ceiling, codecs[entry.api_key].max_version)
        if ceiling < entry.min_version:
            continue
        entry.max_version = ceiling
        kept.append(entry)
    return kept
