"""The proxy's connection loop without servers: fake sockets, a clock the test moves, real frames.

Each test drives a :class:`~quotastream.proxy.connection.Connection` as the event loop would
(client bytes in, broker bytes in, timers firing) through handlers that ask for what the proxy's
handlers ask (hold, throttle, replace), or through the real throttling handler with holds the
test sets, and reads what each side was sent.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from prometheus_client import CollectorRegistry

from quotastream.proxy import wire
from quotastream.proxy.connection import Connection
from quotastream.proxy.context import Connection as HostedConnection
from quotastream.proxy.handler import Handler, HandlerContext, Request, Response
from quotastream.proxy.handlers.throttling import Throttling
from quotastream.proxy.hold_window import ClientKey
from quotastream.proxy.metrics import ProxyMetrics

NODE = 2
START_S = 1_000.0


class Timer:
    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self._when, self.callback, self._cancelled = when, callback, False

    def when(self) -> float:
        return self._when

    def cancel(self) -> None:
        self._cancelled = True

    def cancelled(self) -> bool:
        return self._cancelled


class FakeSocket:
    """One side's transport: what was written to it, whether it is read."""

    def __init__(self) -> None:
        self.sent = bytearray()
        self.reading = True
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.sent += data

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def is_read(self) -> bool:
        return self.reading

    def frames(self) -> list[bytes]:
        """What was written, as whole frames."""
        frames, data = [], bytes(self.sent)
        while data:
            size = wire.frame_size(data[:4])
            frames.append(data[: 4 + size])
            data = data[4 + size :]
        return frames


@dataclass
class Host:
    """The proxy as a connection sees it, with a clock the test moves and the broker side
    connected at once."""

    handlers: list[Handler]
    max_frame_bytes: int = 1 << 20
    now_s: float = START_S
    timers: list[Timer] = field(default_factory=list)
    broker: FakeSocket = field(default_factory=FakeSocket)
    closed_as: list[str] = field(default_factory=list)
    held_s: float = 0.0

    @property
    def clock(self) -> Host:
        return self

    def wall_ms(self) -> int:
        return int(self.now_s * 1000)

    def monotonic(self) -> float:
        return self.now_s

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(when, callback)
        self.timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        """Moves the clock, firing each timer due on the way, in order (and one due a hair
        later: the connection's deadlines are float sums)."""
        end = self.now_s + seconds + 1e-9
        while True:
            due = [t for t in self.timers if not t.cancelled() and t.when() <= end]
            if not due:
                break
            timer = min(due, key=Timer.when)
            self.timers.remove(timer)
            self.now_s = max(self.now_s, timer.when())
            timer.callback()
        self.now_s = end

    def new_handlers(self) -> list[Handler]:
        return self.handlers

    def connect(self, connection: HostedConnection) -> None:
        connection.broker_connected(self.broker)
        connection.broker_ready(NODE)

    def opened(self, connection: HostedConnection) -> None:
        pass

    def closed(self, connection: HostedConnection, reason: str) -> None:
        self.closed_as.append(reason)

    def held(self, seconds: float) -> None:
        self.held_s += seconds


def connect(*handlers: Handler) -> tuple[Connection, FakeSocket, Host]:
    host = Host(list(handlers))
    connection = Connection(host, NODE)
    client = FakeSocket()
    connection.client_connected(client)
    return connection, client, host


# --- real frames -----------------------------------------------------------------------------


def framed(message: Any, correlation_id: int, client_id: str | None = "c") -> bytes:
    if client_id is None:
        message.with_header(correlation_id=correlation_id)
    else:
        message.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(message.encode(header=True, framed=True))


def metadata_request(correlation_id: int) -> bytes:
    return framed(MetadataRequest[1](topics=None), correlation_id)


def metadata_response(correlation_id: int) -> bytes:
    return framed(MetadataResponse[1](brokers=[], topics=[]), correlation_id, None)


def produce_request(correlation_id: int, acks: int = 1) -> bytes:
    topic = ProduceRequest.TopicProduceData
    partition = topic.PartitionProduceData(index=0, records=b"\x00" * 100)
    message = ProduceRequest[9](
        transactional_id=None,
        acks=acks,
        timeout_ms=30_000,
        topic_data=[topic(name="t", partition_data=[partition])],
    )
    return framed(message, correlation_id)


def produce_response(correlation_id: int, throttle_ms: int = 0) -> bytes:
    topic = ProduceResponse.TopicProduceResponse
    partition = topic.PartitionProduceResponse(index=0, error_code=0, base_offset=1)
    message = ProduceResponse[9](
        responses=[topic(name="t", partition_responses=[partition])],
        throttle_time_ms=throttle_ms,
    )
    return framed(message, correlation_id, None)


def fetch_request(correlation_id: int, max_bytes: int = 50_000_000) -> bytes:
    wanted = FetchRequest.FetchTopic
    partition = wanted.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)
    message = FetchRequest[12](
        replica_id=-1,
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=max_bytes,
        topics=[wanted(topic="t", partitions=[partition])],
    )
    return framed(message, correlation_id)


def fetch_response(correlation_id: int, records: bytes = b"\x01" * 1000) -> bytes:
    topic = FetchResponse.FetchableTopicResponse
    partition = topic.PartitionData(partition_index=0, high_watermark=10, records=records)
    message = FetchResponse[12](
        throttle_time_ms=0,
        error_code=0,
        session_id=77,
        responses=[topic(topic="t", partitions=[partition])],
    )
    return framed(message, correlation_id, None)


def correlation_ids(frames: list[bytes]) -> list[int]:
    return [wire.read_int32(memoryview(frame), 8) for frame in frames]


def response_ids(frames: list[bytes]) -> list[int]:
    return [wire.read_int32(memoryview(frame), 4) for frame in frames]


# --- handlers that ask what the proxy's handlers ask -----------------------------------------


class Seen(Handler):
    """Records each request and response it sees."""

    requests = responses = frozenset({wire.METADATA, wire.PRODUCE, wire.FETCH})

    def __init__(self) -> None:
        self.requests_seen: list[tuple[int, bool]] = []

    def on_request(self, request: Request, context: HandlerContext) -> None:
        self.requests_seen.append((request.header.correlation_id, request.waited_out))


class HoldsOnce(Handler):
    """Holds each request ``hold_ms`` once."""

    requests = frozenset({wire.METADATA})

    def __init__(self, hold_ms: int) -> None:
        self.hold_ms = hold_ms

    def on_request(self, request: Request, context: HandlerContext) -> None:
        if not request.waited_out:
            context.hold(self.hold_ms)


class ThrottlesResponses(Handler):
    """Throttles the client by each response's throttle in ``throttles`` (by correlation id)."""

    responses = frozenset({wire.METADATA})

    def __init__(self, throttles: dict[int, int]) -> None:
        self.throttles = throttles

    def on_response(self, response: Response, context: HandlerContext) -> None:
        context.throttle(self.throttles.get(response.request.correlation_id, 0))


# --- the loop --------------------------------------------------------------------------------


def test_requests_reach_the_broker_whole_and_in_order_however_they_arrive() -> None:
    connection, client, host = connect()
    stream = metadata_request(1) + produce_request(2) + metadata_request(3)
    cuts = [0, 3, 30, len(stream) - 5]  # mid-prefix, mid-frame, mid-last-frame
    for start, end in itertools.pairwise(cuts):
        connection.client_data(stream[start:end])
    assert correlation_ids(host.broker.frames()) == [1, 2]  # the third is not whole yet
    connection.client_data(stream[cuts[-1] :])
    assert correlation_ids(host.broker.frames()) == [1, 2, 3]
    connection.broker_data(metadata_response(1) + produce_response(2) + metadata_response(3))
    assert response_ids(client.frames()) == [1, 2, 3]


def test_a_client_that_leaves_mid_request_leaves_nothing_half_written_upstream() -> None:
    connection, _, host = connect()
    frame = produce_request(1)
    connection.client_data(frame[:-1])
    connection.client_lost()
    assert host.broker.sent == b""
    assert host.broker.closed
    assert host.closed_as == ["client_closed"]


def test_a_throttled_client_is_not_read_until_its_throttle_ends() -> None:
    connection, client, host = connect(ThrottlesResponses({1: 300}))
    connection.client_data(metadata_request(1))
    connection.broker_data(metadata_response(1))
    assert not client.is_read()
    connection.client_data(metadata_request(2))  # already on its way when it was muted
    assert correlation_ids(host.broker.frames()) == [1]
    host.advance(0.299)
    assert correlation_ids(host.broker.frames()) == [1]
    host.advance(0.001)
    assert correlation_ids(host.broker.frames()) == [1, 2]
    assert client.is_read()
    assert host.held_s == pytest.approx(0.3)


class TickingHost(Host):
    """A host whose clock moves ``tick`` seconds at each reading: time passes while the
    connection runs, as it does on a real loop."""

    tick: float = 0.0

    def monotonic(self) -> float:
        now = self.now_s
        self.now_s += self.tick
        return now


def test_a_mute_extended_after_its_wakeup_was_set_still_ends() -> None:
    """The wakeup set for the first throttle fires a microsecond before the mute, extended by a
    second response, ends; by the time the connection has looked, the mute is over. It must
    not be left unread with no wakeup (aiokafka's requests then timed out after 40 s)."""
    host = TickingHost([ThrottlesResponses({1: 100, 2: 100})])
    connection = Connection(host, NODE)
    client = FakeSocket()
    connection.client_connected(client)
    connection.client_data(metadata_request(1) + metadata_request(2))
    connection.broker_data(metadata_response(1))
    host.now_s += 1e-6
    connection.broker_data(metadata_response(2))  # the mute ends 1 us after its wakeup
    host.tick = 1e-6
    host.advance(0.2)
    assert client.is_read()
    connection.client_data(metadata_request(3))
    assert correlation_ids(host.broker.frames()) == [1, 2, 3]


def test_a_throttled_connection_forwards_one_request_at_a_time() -> None:
    connection, _, host = connect(ThrottlesResponses({1: 100}))
    connection.client_data(metadata_request(1))
    connection.broker_data(metadata_response(1))
    connection.client_data(metadata_request(2) + metadata_request(3))
    host.advance(0.1)
    assert correlation_ids(host.broker.frames()) == [1, 2]  # 3 waits for 2's response
    connection.broker_data(metadata_response(2))  # not throttled: the connection goes on
    assert correlation_ids(host.broker.frames()) == [1, 2, 3]


def test_an_unthrottled_connection_keeps_several_requests_in_flight() -> None:
    connection, _, host = connect(ThrottlesResponses({}))
    connection.client_data(metadata_request(1) + metadata_request(2) + metadata_request(3))
    assert correlation_ids(host.broker.frames()) == [1, 2, 3]


def test_a_held_request_waits_then_runs_the_rest_of_its_chain_from_the_handler_that_held_it() -> (
    None
):
    before, after = Seen(), Seen()
    connection, client, host = connect(before, HoldsOnce(200), after)
    connection.client_data(metadata_request(1))
    assert host.broker.sent == b""
    assert not client.is_read()
    host.advance(0.2)
    assert correlation_ids(host.broker.frames()) == [1]
    assert before.requests_seen == [(1, False)]  # not run again
    assert after.requests_seen == [(1, True)]
    connection.broker_data(metadata_response(1))
    assert response_ids(client.frames()) == [1]


def test_responses_out_of_order_close_the_connection_as_malformed() -> None:
    connection, client, host = connect()
    connection.client_data(metadata_request(1))
    connection.broker_data(metadata_response(9))
    assert host.closed_as == ["malformed"]
    assert client.closed
    assert host.broker.closed


def test_a_response_to_no_request_closes_the_connection_as_malformed() -> None:
    connection, _, host = connect()
    connection.broker_data(metadata_response(1))
    assert host.closed_as == ["malformed"]


def test_a_drained_connection_closes_once_its_forwarded_requests_are_answered() -> None:
    connection, client, host = connect()
    connection.client_data(metadata_request(1))
    connection.drain()
    assert host.closed_as == []
    connection.client_data(metadata_request(2))  # read before the drain paused the client
    assert correlation_ids(host.broker.frames()) == [1, 2]
    connection.broker_data(metadata_response(1) + metadata_response(2))
    assert response_ids(client.frames()) == [1, 2]
    assert host.closed_as == ["drained"]


# --- the throttling handler on the loop ------------------------------------------------------


@dataclass
class SetHolds:
    """Holds the test sets: ``held_until_s`` (monotonic) for every client, ``over_ms`` for a
    fetch response's bytes, ``after_record_ms`` for a produce request's."""

    host: Host
    held_until_s: float = 0.0
    over_ms: int = 0
    after_record_ms: int = 0
    recorded: list[tuple[ClientKey, int]] = field(default_factory=list)

    def remaining_ms(self, key: ClientKey) -> int:
        return max(round((self.held_until_s - self.host.now_s) * 1000), 0)

    def record_forwarded(self, key: ClientKey, nbytes: int, now_ms: int) -> int:
        self.recorded.append((key, nbytes))
        if self.after_record_ms:
            self.held_until_s = self.host.now_s + self.after_record_ms / 1000
        return self.after_record_ms

    def over_quota_with(self, key: ClientKey, nbytes: int) -> int:
        return self.over_ms

    def largest_fetch(self, key: ClientKey) -> int | None:
        return 64_000


def throttled_connection() -> tuple[Connection, FakeSocket, Host, SetHolds]:
    metrics = ProxyMetrics(CollectorRegistry())
    host = Host([])
    holds = SetHolds(host)
    host.handlers.append(Throttling(holds, metrics))
    connection = Connection(host, NODE)
    client = FakeSocket()
    connection.client_connected(client)
    return connection, client, host, holds


def test_an_acks_0_produce_expects_no_response_and_holds_its_client_as_it_goes() -> None:
    connection, client, host, holds = throttled_connection()
    holds.after_record_ms = 400
    connection.client_data(produce_request(1, acks=0) + metadata_request(2))
    assert correlation_ids(host.broker.frames()) == [1]  # forwarded, then held
    assert not client.is_read()
    host.advance(0.4)
    assert correlation_ids(host.broker.frames()) == [1, 2]
    connection.broker_data(metadata_response(2))  # answers 2: nothing waited for 1's
    assert response_ids(client.frames()) == [2]
    assert host.closed_as == []


def test_the_produce_request_that_breaks_the_quota_goes_and_holds_the_next() -> None:
    connection, client, host, holds = throttled_connection()
    holds.after_record_ms = 250
    connection.client_data(produce_request(1) + produce_request(2))
    assert correlation_ids(host.broker.frames()) == [1]
    connection.broker_data(produce_response(1))
    (answered,) = client.frames()
    layout = wire.throttled_response(wire.PRODUCE, 9, memoryview(answered)[4:])
    assert wire.read_int32(memoryview(answered)[4:], layout.throttle_offset or 0) == 250
    host.advance(0.25)
    assert correlation_ids(host.broker.frames()) == [1, 2]


def test_a_request_of_a_held_client_waits_out_the_hold_and_then_goes_even_if_renewed() -> None:
    connection, _, host, holds = throttled_connection()
    holds.held_until_s = START_S + 0.5
    connection.client_data(produce_request(1))
    assert host.broker.sent == b""
    host.now_s += 0.25
    holds.held_until_s = START_S + 0.9  # another connection of the client renewed the hold
    host.advance(0.25)
    assert correlation_ids(host.broker.frames()) == [1]


def test_a_fetch_over_the_quota_is_answered_empty_recorded_as_nothing_and_throttled() -> None:
    connection, client, host, holds = throttled_connection()
    connection.client_data(fetch_request(1))
    (forwarded,) = host.broker.frames()
    header = wire.read_request_header(memoryview(forwarded)[4:])
    offset = wire.fetch_max_bytes_offset(header, memoryview(forwarded)[4:])
    assert offset is not None
    assert wire.read_int32(memoryview(forwarded)[4:], offset) == 64_000  # capped
    holds.over_ms = 700
    connection.broker_data(fetch_response(1))
    (answered,) = client.frames()
    message = wire.decode_response(wire.FETCH, 12, memoryview(answered)[4:])
    assert message.responses == []
    assert message.throttle_time_ms == 700
    assert message.session_id == 77
    assert holds.recorded == [(("fetch", "ANONYMOUS", "c", NODE), 0)]
    assert not client.is_read()
    connection.client_data(fetch_request(2))
    host.advance(0.699)
    assert len(host.broker.frames()) == 1
    host.advance(0.001)
    assert correlation_ids(host.broker.frames()) == [1, 2]


def test_a_fetch_within_the_quota_is_recorded_as_the_broker_counts_it() -> None:
    connection, client, _host, holds = throttled_connection()
    connection.client_data(fetch_request(1))
    response = fetch_response(1)
    connection.broker_data(response)
    assert client.frames() == [response]
    counted = wire.fetch_counted_bytes(12, memoryview(response)[4:], tagged=False)
    assert holds.recorded == [(("fetch", "ANONYMOUS", "c", NODE), counted)]
    # The frame less its length prefix and its header (a correlation id and, flexible, an empty
    # tagged-fields byte), plus the 4 bytes Kafka's FetchResponse.sizeOf counts for the header.
    assert counted == len(response) - 4 - 5 + 4
