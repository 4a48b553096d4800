"""``quotastream run``: the streaming engine, on its embedded default or on configured servers.

Embedded (the default without ``--engine-config``): an Apache Kafka broker and a Redis on free
loopback ports, the simulated traffic, local Spark, and a live view. Pointing the engine at a real
cluster is configuration only (``conf/engine.yaml`` and ``QUOTASTREAM_*`` variables).
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from kafka.admin import KafkaAdminClient, NewTopic
from redis.backoff import NoBackoff
from redis.retry import Retry
from rich.console import Console
from rich.live import Live
from rich.markup import escape

from quotastream.outage import first_line
from quotastream.proxy.settings import ProxySettings
from state.config import QuotaConfig, load_quota_config
from streaming.commands.client_traffic import ClientTraffic
from streaming.commands.exit_codes import EXIT_FAILURE, EXIT_OK
from streaming.commands.live_view import snapshot
from streaming.commands.preflight import check_servers
from streaming.commands.proxy import RunningProxy
from streaming.commands.redaction import redact_logs
from streaming.commands.traffic import LiveTraffic
from streaming.engine.exporter import EngineMetrics
from streaming.engine.job import GracefulStop, local_spark, start_query
from streaming.engine.settings import EngineSettings
from streaming.engine.source_process import source_process_ended
from streaming.kafka_broker import start_kafka
from streaming.services import LOOPBACK, free_ports, start_redis

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunOptions:
    settings: EngineSettings
    embedded: bool
    simulate: bool
    duration_s: float | None
    #: Process what the topics hold now, then stop (Spark's availableNow trigger).
    available_now: bool = False


def run(options: RunOptions) -> int:
    config = load_quota_config(Path(options.settings.quotas))
    redact_logs(options.settings)
    console = Console(stderr=True)
    with contextlib.ExitStack() as stack:
        # First in, last out: a Ctrl-C while starting or stopping asks for the same clean stop.
        stop = stack.enter_context(_StopOnSignal())
        settings = options.settings
        if options.embedded:
            settings = stack.enter_context(_embedded(settings, console))
        # Nothing is started against a server that does not answer (UnreachableError).
        check_servers(settings)
        traffic = None
        if options.simulate:
            kafka = settings.kafka
            traffic = LiveTraffic(
                kafka.bootstrap_servers, kafka.topics[0], client=kafka.client_settings()
            )
            traffic.start()
            stack.callback(traffic.stop)
            if options.embedded:
                stack.enter_context(_real_clients(settings, config, console))
        console.print("starting Spark …")
        spark = local_spark(settings)
        stack.callback(spark.stop)
        stop.take_over()
        if stop.requested:
            return EXIT_OK
        metrics = _start_metrics(settings, console)
        if metrics is not None:
            stack.callback(metrics.close)
        graceful_stop = GracefulStop()
        query = start_query(
            spark,
            settings,
            config,
            available_now=options.available_now,
            metrics=metrics,
            graceful_stop=graceful_stop,
        )
        # Unwound first: the query stops before the exporter, Spark and the traffic.
        stack.callback(_stop_query, query, graceful_stop)
        _watch(settings, query, console, options.duration_s, stop)
        if traffic is not None and traffic.failure is not None:
            console.print(f"[yellow]simulated traffic stopped:[/yellow] {traffic.failure}")
        failure = query.exception()
        if failure is not None:
            log.debug("the query failed: %s", failure)
            line = escape(failure_line(failure))
            console.print(f"[red]the query failed:[/red] {line}", soft_wrap=True)
            return EXIT_FAILURE
    return EXIT_OK


_TRACEBACK = "Traceback (most recent call last):"
_OWN_MODULES = ("quotastream.", "state.", "streaming.")


def failure_line(error: BaseException) -> str:
    """One line for the operator: the error the engine's Python code raised.

    A failure in a Python worker reaches the driver as a Spark error whose text holds the
    worker's traceback, then the query's offsets and plan (kept in the debug log); the line that
    ends the traceback names the error. The engine's own errors are shown by their message. The
    Kafka source's process on the driver ending without an error leaves Spark with no message:
    the line says what happened (``streaming/engine/source_process.py``).
    """
    ended = source_process_ended(error)
    if ended is not None:
        return ended
    _, found, raised = str(error).rpartition(_TRACEBACK)
    if not found:
        return first_line(error)
    line = next((ln for ln in raised.splitlines()[1:] if ln and not ln[0].isspace()), "")
    name, _, message = line.partition(": ")
    message = re.sub(r"(\s*SQLSTATE: \w+)+$", "", message)
    if name.startswith(_OWN_MODULES) and message:
        return message
    return f"{name.rpartition('.')[2]}: {message}" if message else name or first_line(error)


def _start_metrics(settings: EngineSettings, console: Console) -> EngineMetrics | None:
    """The Prometheus exporter, once per process (``docs/metrics.md``).

    A port already in use is reported and the engine runs on without its metrics: decisions
    matter more than their metrics, and Prometheus reports the target down.
    """
    if not settings.metrics.enabled:
        return None
    metrics = EngineMetrics.from_settings(
        settings.metrics, keep_ms=settings.redis.keep_ms, kafka=settings.kafka
    )
    try:
        port = metrics.serve()
    except OSError as exc:
        log.error("metrics exporter not started on %s:%d: %s", metrics.host, metrics.port, exc)
        console.print(f"[red]metrics exporter not started:[/red] {exc}")
        return None
    console.print(f"metrics: http://{metrics.host}:{port}/metrics")
    return metrics


@contextlib.contextmanager
def _embedded(settings: EngineSettings, console: Console) -> Iterator[EngineSettings]:
    """Real servers on free loopback ports, and settings that point at them."""
    with start_kafka() as kafka, start_redis() as redis_server:
        topic = settings.kafka.topics[0]
        admin = KafkaAdminClient(bootstrap_servers=kafka.address)
        admin.create_topics([NewTopic(topic, 3, 1)])
        admin.close()
        checkpoint = tempfile.mkdtemp(prefix="quotastream-checkpoint-")
        console.print(
            f"embedded: Apache Kafka {kafka.version} broker {kafka.address}, "
            f"Redis {redis_server.address}, checkpoint {checkpoint}",
            soft_wrap=True,  # one line, whatever the terminal's width: scripts read it
        )
        try:
            yield settings.pointed_at(
                kafka.address,
                redis_server.host,
                redis_server.port,
                checkpoint,
                starting_offsets="earliest",
            )
        finally:
            # The broker's log ends with it: the checkpoint could not resume.
            shutil.rmtree(checkpoint, ignore_errors=True)


#: The embedded default's topic of real client traffic (``_real_clients``).
CLIENTS_TOPIC = "clients"


@contextlib.contextmanager
def _real_clients(
    settings: EngineSettings, config: QuotaConfig, console: Console
) -> Iterator[ClientTraffic]:
    """``quotastream proxy`` in front of the embedded broker, and real clients through it: their
    bytes are published to the events topic and they are held by the engine's decisions."""
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
    admin.create_topics([NewTopic(CLIENTS_TOPIC, 3, 1)])
    admin.close()
    first = free_ports(3)  # the bootstrap port, then node_port_base: broker 1 on first + 2
    proxy = ProxySettings.model_validate(
        {
            **settings.proxy.model_dump(),
            "listen_host": LOOPBACK,
            "advertised_host": None,
            "bootstrap_port": first,
            "node_port_base": first + 1,
            "upstream": {"bootstrap_servers": settings.kafka.bootstrap_servers},
            "metrics": {"enabled": False},
        }
    )
    with RunningProxy(settings.model_copy(update={"proxy": proxy}), config) as running:
        console.print(
            f"proxy: {running.bootstrap_servers} in front of the broker, with kafka-python "
            f"clients producing to and consuming {CLIENTS_TOPIC!r} through it",
            soft_wrap=True,
        )
        clients = ClientTraffic(running.bootstrap_servers, CLIENTS_TOPIC)
        clients.start()
        try:
            yield clients
        finally:
            clients.stop()


def _watch(
    settings: EngineSettings,
    query: Any,
    console: Console,
    duration_s: float | None,
    stop: _StopOnSignal,
) -> None:
    client = redis.Redis(**settings.redis.connection(), retry=Retry(NoBackoff(), 0))
    deadline = None if duration_s is None else time.monotonic() + duration_s
    interactive = console.is_terminal
    with (
        Live(console=console, auto_refresh=False, transient=False)
        if interactive
        else (contextlib.nullcontext()) as live
    ):
        while query.isActive and not stop.requested:
            if deadline is not None and time.monotonic() >= deadline:
                break
            summary = _view(client, settings, live)
            if live is None:
                print(f"quotastream: {summary}", flush=True)
            time.sleep(1.0)
    print(f"quotastream: final: {_view(client, settings, None)}", flush=True)
    client.close()


def _view(client: redis.Redis, settings: EngineSettings, live: Live | None) -> str:
    """The live view's summary line; Redis being down is shown, never fatal (the query's
    writes wait for it: ``redis.max_outage_s``)."""
    try:
        view = snapshot(client, settings.redis.key_prefix)
    except redis.exceptions.NoPermissionError:
        # A least-privilege user (quotastream/acl.py) may write its keys but not list them.
        return (
            f"no view: Redis user {settings.redis.username or 'default'} may not list the "
            "decisions (SCAN); they are written all the same"
        )
    except (redis.RedisError, OSError) as exc:
        return f"Redis at {settings.redis.endpoint} unreachable: {first_line(exc)}"
    if live is not None:
        live.update(view.table(), refresh=True)
    return view.summary()


class _StopOnSignal:
    """Turns Ctrl-C / SIGTERM into a clean stop of everything the run started; the handlers
    before it are restored on exit."""

    _SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopOnSignal:
        self._previous = {signum: signal.getsignal(signum) for signum in self._SIGNALS}
        self.take_over()
        return self

    def take_over(self) -> None:
        """Installs the handlers (again): a new SparkContext installs its own for SIGINT, which
        cancels every job and raises KeyboardInterrupt, killing the batch being written."""
        for signum in self._SIGNALS:
            signal.signal(signum, self._request)

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _request(self, signum: int, frame: object) -> None:
        self.requested = True


def _stop_query(query: Any, graceful_stop: GracefulStop) -> None:
    with contextlib.suppress(Exception):
        graceful_stop.stop(query)
