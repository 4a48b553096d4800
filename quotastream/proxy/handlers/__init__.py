"""The proxy's handlers (``quotastream.proxy.handler``), one per concern, and their order.

The order is the chain's, for requests and responses alike:

1. ``SaslIdentity``: who the connection is, before anything counts its bytes;
2. ``Throttling``: a held request waits before the handlers after it see it, and a fetch
   response it empties records nothing with them;
3. ``UsageCounting``: publishes what is forwarded;
4. ``AddressRewriting``: rewrites what the client is told (after a throttle is raised in place);
5. ``ApiMetrics``: counts the frames as they leave.
"""

from __future__ import annotations

from collections.abc import Callable

from quotastream.proxy.handler import Handler
from quotastream.proxy.handlers.addresses import AddressRewriting
from quotastream.proxy.handlers.api_metrics import ApiMetrics
from quotastream.proxy.handlers.counting import UsageCounting
from quotastream.proxy.handlers.sasl import SaslIdentity
from quotastream.proxy.handlers.throttling import Throttling
from quotastream.proxy.holds import Holds
from quotastream.proxy.metrics import ProxyMetrics
from quotastream.proxy.routing import Routes
from quotastream.proxy.usage import UsageSums


def proxy_handlers(
    *,
    sasl_mechanisms: frozenset[str],
    holds: Holds,
    usage: UsageSums,
    routes: Routes,
    metrics: ProxyMetrics,
) -> Callable[[], list[Handler]]:
    """Each new connection's chain: the stateless handlers shared, the SASL one its own."""
    throttling = Throttling(holds, metrics)
    counting = UsageCounting(usage)
    addresses = AddressRewriting(routes)
    api_metrics = ApiMetrics(metrics)

    def new_chain() -> list[Handler]:
        return [SaslIdentity(sasl_mechanisms), throttling, counting, addresses, api_metrics]

    return new_chain
