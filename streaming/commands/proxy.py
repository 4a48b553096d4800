"""``quotastream proxy``: the Kafka proxy, built from the engine settings (``docs/proxy.md``).

One function builds it from the settings for every caller: the command, the embedded run
(``scripts/run``), the tests and ``bench/proxy.py``; :class:`RunningProxy` runs it on an event
loop in a thread of its own, for those that do not make the proxy their whole process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from prometheus_client import CollectorRegistry, start_http_server

from quotastream.cache import CachedQuotaClient
from quotastream.proxy.context import BrokerReader
from quotastream.proxy.holds import Holds
from quotastream.proxy.metrics import ProxyMetrics
from quotastream.proxy.server import Proxy, cluster_brokers
from quotastream.proxy.usage import FETCH, PRODUCE, usage_publisher
from quotastream.publisher import events_producer
from state.config import QuotaConfig, load_quota_config
from state.quota_types import QuotaType
from streaming.commands.exit_codes import EXIT_OK
from streaming.engine.settings import EngineSettings

log = logging.getLogger(__name__)


def build_proxy(
    settings: EngineSettings,
    config: QuotaConfig,
    registry: CollectorRegistry,
    read_brokers: BrokerReader | None = None,
) -> Proxy:
    """The proxy the settings describe: reading decisions from their Redis, publishing usage to
    their first events topic, in front of ``proxy.upstream`` (whose brokers ``read_brokers``
    lists: by default the cluster's own answer to the proxy's admin client)."""
    proxy = settings.proxy
    metrics = ProxyMetrics(registry)
    redis_options = {
        name: value
        for name, value in settings.redis.connection().items()
        if name not in ("host", "port", "socket_timeout", "socket_connect_timeout")
    }
    decisions = CachedQuotaClient.connect(
        settings.redis.host,
        settings.redis.port,
        settings.redis.key_prefix,
        config,
        proxy.decisions.cache(),
        registry=registry,
        **redis_options,
    )
    holds = Holds(
        decisions,
        proxy.decisions.refresh_ms,
        proxy.decisions.idle_ms,
    )

    def new_producer() -> Any:
        return events_producer(
            settings.kafka.bootstrap_servers,
            settings.kafka.client_settings(),
            # A send waits this long for a broker that is down before its flush is dropped.
            max_block_ms=max(proxy.flush_interval_ms, 1000),
        )

    publisher = usage_publisher(
        new_producer,
        topic=settings.kafka.topics[0],
        instance=proxy.instance_name,
        max_message_bytes=settings.events.max_payload_bytes,
        max_queued_flushes=proxy.max_queued_flushes,
        on_published=metrics.events_published.inc,
        on_drop=metrics.dropped,
    )
    upstream = proxy.upstream
    return Proxy(
        proxy,
        holds=holds,
        publisher=publisher,
        windows_ms={
            PRODUCE: config.quota_types.of(QuotaType.PRODUCE).window_ms,
            FETCH: config.quota_types.of(QuotaType.FETCH).window_ms,
        },
        metrics=metrics,
        read_brokers=read_brokers
        or (lambda: cluster_brokers(upstream.bootstrap_servers, upstream.client_settings())),
    )


class RunningProxy:
    """A proxy on its own event loop thread: ``with RunningProxy(settings) as proxy: ...``."""

    def __init__(
        self,
        settings: EngineSettings,
        config: QuotaConfig | None = None,
        read_brokers: BrokerReader | None = None,
    ) -> None:
        self.settings = settings
        self.registry = CollectorRegistry()
        self.proxy = build_proxy(
            settings,
            config or load_quota_config(Path(settings.quotas)),
            self.registry,
            read_brokers,
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="proxy", daemon=True)

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.settings.proxy.client_host}:{self.proxy.bootstrap_port}"

    def __enter__(self) -> Self:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self._loop).result(60)
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            # Its own bounds, and time for the loop's hops between them.
            asyncio.run_coroutine_threadsafe(self.proxy.stop(), self._loop).result(
                self.proxy.longest_stop_s + 10
            )
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def run_proxy(settings: EngineSettings) -> int:
    """The proxy as the process's whole job, until SIGTERM or SIGINT (which drain it)."""
    config = load_quota_config(Path(settings.quotas))
    registry = CollectorRegistry()
    proxy = build_proxy(settings, config, registry)
    if settings.proxy.metrics.enabled:
        server, _ = start_http_server(
            settings.proxy.metrics.port, settings.proxy.metrics.host, registry
        )
        log.info(
            "proxy metrics on http://%s:%d/metrics",
            settings.proxy.metrics.host,
            server.server_port,
        )
    asyncio.run(_serve_until_signalled(proxy))
    return EXIT_OK


async def _serve_until_signalled(proxy: Proxy) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await proxy.start()
    print(f"proxy ready on port {proxy.bootstrap_port}", flush=True)
    await stop.wait()
    log.info("stopping: draining forwarded requests")
    with contextlib.suppress(asyncio.CancelledError):
        await proxy.stop()
