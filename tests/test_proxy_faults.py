"""The proxy under faults and bad input: each costs what it must and nothing more.

* A malformed or oversized frame closes that client's connection, with a log line; the proxy's
  other clients go on.
* A client that disconnects mid-request: nothing of its request reaches the broker, and its
  broker connection is closed with it.
* A broker restart: the proxy closes the clients' connections to it, and they reconnect through
  the proxy once it is back.
* Redis down: the failure policy answers (fail closed holds every client that long; fail open
  holds none), and the lookups say so.
* The events topic unreachable: client traffic flows on, and the usage that cannot be published
  is counted as dropped; also when it goes away before the proxy stops, which then stops within
  its drain time.
* A proxy restart (``quotastream proxy`` stopped by SIGTERM, which drains it, and started again
  on its ports): its clients reconnect and go on.
"""

from __future__ import annotations

import logging
import signal
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import pytest
import yaml
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from quotastream.proxy.usage import usage_publisher
from state.event_contract import Produce
from streaming.commands.proxy import RunningProxy
from streaming.engine.settings import EngineSettings
from streaming.kafka_broker import KafkaNode, start_kafka
from streaming.services import LocalService, start_redis
from tests.client_libraries import LIBRARIES, Access
from tests.kafka_quotas import record_batch
from tests.servers import start_command
from tests.support.proxy import create_topic, proxy_settings


def produce_one(proxy: RunningProxy, topic: str, client_id: str) -> None:
    LIBRARIES["kafka-python"].produce(Access(proxy.bootstrap_servers), topic, [b"ok"], client_id)


def end_offset(address: str, topic: str) -> int:
    consumer = KafkaConsumer(bootstrap_servers=address)
    try:
        partition = TopicPartition(topic, 0)
        return int(consumer.end_offsets([partition])[partition])
    finally:
        consumer.close()


def await_metric(
    proxy: RunningProxy,
    name: str,
    labels: dict[str, str],
    until: Callable[[float], bool] = bool,
) -> float:
    """Until the proxy's ``name`` metric satisfies ``until`` (positive by default), with a refresh
    pass of its decisions (what its thread runs every refresh_ms) each time it does not."""
    deadline = time.monotonic() + 10
    while not until(value := proxy.registry.get_sample_value(name, labels) or 0.0):
        assert time.monotonic() < deadline, f"{name}{labels} stayed {value}"
        proxy.proxy.holds.refresh()
    return value


def closed_by_peer(connection: socket.socket, timeout_s: float = 10.0) -> bool:
    """Whether the other end closes ``connection`` (reads until the end of the stream)."""
    connection.settimeout(timeout_s)
    try:
        while connection.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


def proxy_address(proxy: RunningProxy) -> tuple[str, int]:
    """The proxy's port for broker 1 (clients reach a broker there after Metadata)."""
    return proxy.settings.proxy.client_host, proxy.proxy.node_ports()[1]


def api_versions_frame(correlation_id: int = 7) -> bytes:
    """An ApiVersions v0 request: a header and no body."""
    client_id = b"raw"
    request = struct.pack(">hhih", 18, 0, correlation_id, len(client_id)) + client_id
    return struct.pack(">i", len(request)) + request


def produce_frame(topic: str, correlation_id: int = 1) -> bytes:
    request = ProduceRequest[9](
        transactional_id=None,
        acks=1,
        timeout_ms=10_000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=topic,
                partition_data=[
                    ProduceRequest.TopicProduceData.PartitionProduceData(
                        index=0, records=record_batch(2_000)
                    )
                ],
            )
        ],
    )
    request.with_header(correlation_id=correlation_id, client_id="raw")
    frame: bytes = request.encode(header=True, framed=True)
    return frame


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack(">i", 200 * 1024 * 1024),  # over max_frame_bytes
        struct.pack(">i", -5),  # a negative length
        struct.pack(">i", 3) + b"abc",  # too short for a request header
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS ClientHello on a plaintext port
    ],
    ids=["oversized", "negative", "no-header", "tls-on-plaintext"],
)
def test_a_malformed_frame_closes_its_connection_only(
    frame: bytes,
    kafka: KafkaNode,
    redis_server: LocalService,
    caplog: pytest.LogCaptureFixture,
    request: pytest.FixtureRequest,
) -> None:
    topic = f"malformed-{request.node.callspec.id}"
    create_topic(kafka.address, topic, partitions=1)
    settings = proxy_settings(kafka.address, kafka.address, redis_server, f"usage-{topic}")
    with RunningProxy(settings) as proxy:
        produce_one(proxy, topic, "neighbour")
        with socket.create_connection(proxy_address(proxy)) as bad:
            bad.sendall(frame)
            assert closed_by_peer(bad)
        produce_one(proxy, topic, "neighbour")
    assert any("closing a client connection" in r.getMessage() for r in caplog.records)


def test_a_client_that_leaves_mid_request_leaves_nothing_behind(
    kafka: KafkaNode, redis_server: LocalService, caplog: pytest.LogCaptureFixture
) -> None:
    topic = "left-mid-request"
    create_topic(kafka.address, topic, partitions=1)
    settings = proxy_settings(kafka.address, kafka.address, redis_server, "usage-left")
    frame = produce_frame(topic)
    caplog.set_level(logging.INFO, "quotastream.proxy")
    with RunningProxy(settings) as proxy:
        with socket.create_connection(proxy_address(proxy)) as leaving:
            # A whole request answered first: the proxy reads this connection from then on.
            leaving.sendall(api_versions_frame())
            assert leaving.recv(4)
            leaving.sendall(frame[: len(frame) // 2])
        produce_one(proxy, topic, "after")  # a whole request goes through meanwhile
        # Every connection ends with its client (kafka-python's producer closed too).
        await_metric(proxy, "quotastream_proxy_connections", {}, until=lambda open: open == 0)
    # Only the whole request reached the broker: the half one was never forwarded.
    assert end_offset(kafka.address, topic) == 1
    assert any("left mid-request" in r.getMessage() for r in caplog.records)


def test_clients_reconnect_through_the_proxy_after_a_broker_restart(
    redis_server: LocalService,
) -> None:
    with start_kafka() as broker:
        topic = "broker-restart"
        create_topic(broker.address, topic, partitions=1)
        settings = proxy_settings(broker.address, broker.address, redis_server, "usage-restart")
        with RunningProxy(settings) as proxy:
            producer = KafkaProducer(
                bootstrap_servers=proxy.bootstrap_servers, client_id="survivor", acks="all"
            )
            restarted = broker
            try:
                producer.send(topic, b"before").get(timeout=30)
                restarted = broker.restart()
                producer.send(topic, b"after").get(timeout=60)
            finally:
                producer.close()
                restarted.stop()
            closed = proxy.registry.get_sample_value(
                "quotastream_proxy_connections_closed_total", {"reason": "broker_closed"}
            )
    assert closed is not None
    assert closed >= 1
    # Both records went through: the broker's log holds them (read after its restart).


@pytest.mark.parametrize(("policy", "held"), [("closed", True), ("open", False)])
def test_with_redis_down_the_failure_policy_decides(
    policy: str, held: bool, kafka: KafkaNode
) -> None:
    topic = f"redis-down-{policy}"
    create_topic(kafka.address, topic, partitions=1)
    with start_redis() as redis_server:
        settings = proxy_settings(
            kafka.address,
            kafka.address,
            redis_server,
            f"usage-{topic}",
            # The last answer read is trusted this long; the policy decides after that.
            decisions={
                "failure_policy": policy,
                "fail_closed_delay_ms": 1_500,
                "fail_open_staleness_ms": 200,
            },
        )
        with RunningProxy(settings) as proxy:
            produce_one(proxy, topic, "client")
            redis_server.stop()
            await_metric(proxy, "quotastream_agent_answers_total", {"source": f"fail_{policy}"})
            started = time.monotonic()
            produce_one(proxy, topic, "client")
            elapsed = time.monotonic() - started
    assert (elapsed >= 1.2) is held, f"produce took {elapsed:.2f} s under fail {policy}"


def test_traffic_flows_while_the_events_topic_is_unreachable_and_drops_are_counted(
    kafka: KafkaNode, redis_server: LocalService
) -> None:
    topic = "events-unreachable"
    create_topic(kafka.address, topic, partitions=1)
    with start_kafka() as events_broker:
        settings = proxy_settings(
            kafka.address,
            events_broker.address,
            redis_server,
            "usage-unreachable",
            max_queued_flushes=2,
            drain_timeout_s=3,
        )
        events_broker.stop()
        with RunningProxy(settings) as proxy:
            values = [b"v" * 500] * 200
            deadline = time.monotonic() + 30
            dropped = 0.0
            while dropped == 0 and time.monotonic() < deadline:
                LIBRARIES["kafka-python"].produce(
                    Access(proxy.bootstrap_servers), topic, values, "unpublished"
                )
                dropped = sum(
                    proxy.registry.get_sample_value(
                        "quotastream_proxy_events_dropped_total", {"reason": reason}
                    )
                    or 0.0
                    for reason in ("queue_full", "publish_failed")
                )
    assert dropped > 0
    assert end_offset(kafka.address, topic) >= len(values)


def test_a_proxy_stopping_after_its_events_broker_did_counts_the_last_usage_dropped(
    kafka: KafkaNode, redis_server: LocalService, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = "events-gone-at-the-stop"
    create_topic(kafka.address, topic, partitions=1)
    thread_failures: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", thread_failures.append)
    dropped = {"reason": "publish_failed"}
    with start_kafka() as events_broker:
        settings = proxy_settings(
            kafka.address, events_broker.address, redis_server, "usage-gone", drain_timeout_s=2
        )
        with RunningProxy(settings) as proxy:
            produce_one(proxy, topic, "before")
            await_metric(proxy, "quotastream_proxy_events_published_total", {})
            events_broker.stop()
            # Its usage is published at the stop, into a producer whose broker is gone.
            produce_one(proxy, topic, "after")
        assert (
            proxy.registry.get_sample_value("quotastream_proxy_events_dropped_total", dropped) or 0
        ) > 0
    assert thread_failures == []


def test_a_publisher_closing_without_its_broker_has_counted_every_event_when_it_returns() -> None:
    topic = "usage-at-the-close"
    counts: Counter[str] = Counter()
    published = threading.Event()

    def on_published(events: int) -> None:
        counts["published"] += events
        published.set()

    def on_drop(reason: str, events: int, nbytes: int) -> None:
        counts[reason] += events

    def usage(ts: int) -> Produce:
        return Produce(ts=ts, bytes=100, count=1, user="u", client_id="c", broker=1)

    with start_kafka() as events_broker:
        create_topic(events_broker.address, topic, partitions=1)
        publisher = usage_publisher(
            lambda: KafkaProducer(bootstrap_servers=events_broker.address, max_block_ms=1000),
            topic=topic,
            instance="closing",
            max_message_bytes=1 << 20,
            max_queued_flushes=4,
            on_published=on_published,
            on_drop=on_drop,
        )
        publisher.offer([usage(1)])
        assert published.wait(60)
        events_broker.stop()
        # Sent into a producer that holds the topic's metadata but can reach no broker.
        publisher.offer([usage(2), usage(3)])
        publisher.close(timeout_s=1.0)
        assert counts == {"published": 1, "publish_failed": 2}


@pytest.fixture
def proxy_process_settings(
    kafka: KafkaNode, redis_server: LocalService, tmp_path: Path
) -> tuple[Path, EngineSettings]:
    settings = proxy_settings(kafka.address, kafka.address, redis_server, "usage-proxy-restart")
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump(settings.model_dump(mode="json")))
    return path, settings


def test_clients_reconnect_after_the_proxy_restarts(
    proxy_process_settings: tuple[Path, EngineSettings], kafka: KafkaNode
) -> None:
    path, settings = proxy_process_settings
    topic = "proxy-restart"
    create_topic(kafka.address, topic, partitions=1)
    bootstrap = f"{settings.proxy.client_host}:{settings.proxy.bootstrap_port}"
    output = path.parent / "proxy.log"
    command = ["proxy", "--engine-config", str(path)]
    process = start_command(command, output, "proxy ready")
    producer = KafkaProducer(bootstrap_servers=bootstrap, client_id="patient", acks="all")
    try:
        producer.send(topic, b"before").get(timeout=30)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, output.read_text()
        assert "draining" in output.read_text()
        process = start_command(command, output, "proxy ready")
        producer.send(topic, b"after").get(timeout=60)
    finally:
        producer.close()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    assert end_offset(kafka.address, topic) == 2


class ScriptedBroker:
    """One connection's worth of a broker that answers each Produce v9 at once with the next
    of ``throttles_ms`` as its ``throttle_time_ms``: the throttles a broker's quota would set,
    in an order the test chooses."""

    def __init__(self, throttles_ms: list[int]) -> None:
        self._throttles = list(throttles_ms)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        connection, _ = self._server.accept()
        with connection, self._server:
            reader = connection.makefile("rb")
            while self._throttles:
                request = reader.read(struct.unpack(">i", reader.read(4))[0])
                response = ProduceResponse[9](responses=[], throttle_time_ms=self._throttles.pop(0))
                response.with_header(correlation_id=struct.unpack_from(">i", request, 4)[0])
                connection.sendall(response.encode(header=True, framed=True))


def read_frame(reader: BinaryIO) -> bytes:
    return reader.read(struct.unpack(">i", reader.read(4))[0])


def test_a_client_muted_by_a_longer_throttle_is_read_again_when_it_ends(
    kafka: KafkaNode, redis_server: LocalService
) -> None:
    """Two pipelined requests whose responses carry 0.3 s and then 1.5 s: the mute is extended
    after its first end was set. With nothing pending when that first end came, the client was
    never read again (kafka-python gave up on its requests 30 s later)."""
    broker = ScriptedBroker([300, 1_500, 0])
    settings = proxy_settings(f"127.0.0.1:{broker.port}", kafka.address, redis_server, "scripted")
    with (
        RunningProxy(settings, read_brokers=lambda: [(1, "127.0.0.1", broker.port)]) as proxy,
        socket.create_connection(proxy_address(proxy), timeout=10) as client,
    ):
        responses = client.makefile("rb")
        client.sendall(produce_frame("t", 1) + produce_frame("t", 2))
        read_frame(responses), read_frame(responses)
        extended = time.monotonic()
        client.sendall(produce_frame("t", 3))
        third = read_frame(responses)  # a socket timeout (10 s) if never read
        waited = time.monotonic() - extended
    assert struct.unpack_from(">i", third, 0)[0] == 3
    assert waited > 1.2, "the third request went through before the longer throttle ended"
