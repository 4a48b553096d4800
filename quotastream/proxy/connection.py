"""One client connection and the broker connection it maps to: the proxy's connection loop.

Frames are forwarded whole (a request reaches the broker only once all of it arrived, so a
client that disconnects mid-request leaves nothing half-written upstream), without being
decoded: only a request's header is read, and the responses that must be rewritten (broker
addresses, ApiVersions, a raised throttle) are decoded with kafka-python's codecs.

A client is held as a broker holds it (KIP-219): when a Produce or Fetch response carries a
throttle, the connection is muted that long, reading nothing from the client. The throttle is
the larger of the broker's and what remains of the engine's decision for the client, and the
response says so in ``throttle_time_ms`` for clients that hold back by themselves; muting holds
those that do not (librdkafka, aiokafka). While a connection is throttled it forwards one
request at a time, the next only after the previous response and its throttle, as a broker
processes one request per connection: a client with several requests in flight (kafka-python's
five) would otherwise slip them through at each unmute. A request of a client the engine holds
waits out the hold before it is forwarded, on every connection of that client; an ``acks=0``
Produce, which has no response, mutes its connection right after it is forwarded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from quotastream.proxy import wire
from quotastream.proxy.identity import Identity, UnreadablePrincipalError
from quotastream.proxy.routing import REWRITTEN, Address, advertised_versions
from quotastream.proxy.usage import FETCH, PRODUCE

if TYPE_CHECKING:
    from quotastream.proxy.server import ProxyContext

log = logging.getLogger(__name__)

_KIND = {wire.PRODUCE: PRODUCE, wire.FETCH: FETCH}


class FrameReader:
    """Splits a byte stream into whole frames (each with its 4-byte length prefix).

    A chunk holding whole frames is sliced without copying; a frame spread over chunks is joined
    once, when its last byte arrives.
    """

    def __init__(self, max_frame_bytes: int) -> None:
        self._max = max_frame_bytes
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._needed = 4

    @property
    def partial(self) -> bool:
        """Part of a frame is buffered (its sender stopped mid-frame if the stream ends here)."""
        return self._buffered > 0

    def feed(self, data: bytes) -> list[memoryview]:
        if self._chunks:
            self._chunks.append(data)
            self._buffered += len(data)
            if self._buffered < self._needed:
                return []
            data = b"".join(self._chunks)
            self._chunks, self._buffered = [], 0
        view = memoryview(data)
        frames = []
        offset, end = 0, len(data)
        self._needed = 4
        while end - offset >= 4:
            size = wire.frame_size(view[offset : offset + 4])
            if not 0 <= size <= self._max:
                raise wire.MalformedFrameError(
                    f"a frame of {size} bytes (the most accepted is {self._max})"
                )
            if end - offset < 4 + size:
                self._needed = 4 + size
                break
            frames.append(view[offset : offset + 4 + size])
            offset += 4 + size
        if offset < end:
            self._chunks = [data[offset:]]
            self._buffered = end - offset
        return frames


@dataclass(slots=True)
class _InFlight:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str


#: Write-buffer marks. Towards a broker: past 1 MiB unsent, no more requests are forwarded and
#: nothing more is read from the client until it drains (a client that sends faster than its
#: broker takes is slowed as by the broker itself, and the proxy's memory stays bounded).
#: Towards a client: past 8 MiB (more than a large fetch response), nothing more is read from
#: the broker.
BROKER_HIGH_WATER: Final = 1 << 20
CLIENT_HIGH_WATER: Final = 8 << 20
#: Frames that leave in one write when they arrived together (small requests, pipelined).
_JOINED_WRITE_BYTES: Final = 256 * 1024


class Connection:
    """A client connection through the proxy to one broker (``node_id``; None: a bootstrap
    connection, whose broker is known once it is connected)."""

    def __init__(self, context: ProxyContext, node_id: int | None) -> None:
        self._context = context
        self._loop = asyncio.get_running_loop()
        self.node_id = node_id
        self.identity = Identity(frozenset(context.settings.sasl_mechanisms))
        self._client: asyncio.Transport | None = None
        self._broker: asyncio.Transport | None = None
        self._requests = FrameReader(context.settings.max_frame_bytes)
        self._responses = FrameReader(context.settings.max_frame_bytes)
        self._pending: deque[memoryview] = deque()
        self._in_flight: deque[_InFlight] = deque()
        self._muted_until = 0.0
        self._throttled = False
        #: The next pending request has waited out a hold: it is forwarded when the mute ends.
        self._waited_out = False
        self._wakeup: asyncio.TimerHandle | None = None
        self._reading = True
        self._broker_full = False
        self._draining = False
        self.closed = asyncio.get_running_loop().create_future()

    # --- the client side ---------------------------------------------------------------------

    def client_connected(self, transport: asyncio.Transport) -> None:
        self._client = transport
        transport.set_write_buffer_limits(high=CLIENT_HIGH_WATER)
        self._context.opened(self)
        self._pause_client()  # until the broker connection is up
        self._loop.create_task(self._connect_broker())

    async def _connect_broker(self) -> None:
        try:
            address = await self._context.upstream_for(self.node_id)
            if self.node_id is None:
                self.node_id = self._context.routes.node_of(address)
            _, protocol = await self._loop.create_connection(
                lambda: _BrokerSide(self),
                address.host,
                address.port,
                ssl=self._context.upstream_ssl,
                server_hostname=address.host if self._context.upstream_ssl else None,
            )
        except (OSError, LookupError) as error:
            self.close(
                f"broker {self._describe_broker()} unreachable: {error}", "broker_unreachable"
            )
            return
        if self._client is None or self._client.is_closing():
            protocol.transport.close()
            return
        self._pump()

    def client_data(self, data: bytes) -> None:
        try:
            self._pending.extend(self._requests.feed(data))
        except wire.MalformedFrameError as error:
            self._failed(error, "a malformed request from the client")
            return
        self._pump()

    def client_lost(self) -> None:
        if self._requests.partial:
            log.info(
                "client of broker %s left mid-request: its partial request was not forwarded",
                self._describe_broker(),
            )
        self.close(None, "client_closed")

    def client_full(self, full: bool) -> None:
        """The client's write buffer passed its high mark (or drained below its low one)."""
        if self._broker is not None and not self._broker.is_closing():
            if full:
                self._broker.pause_reading()
            else:
                self._broker.resume_reading()

    # --- requests ----------------------------------------------------------------------------

    def _pump(self) -> None:
        """Forwards pending requests while the connection may; otherwise waits for the event
        that unblocks it (the broker connection, a response, the end of a throttle, room in the
        broker's write buffer)."""
        batch: list[memoryview] = []
        while self._pending and self._broker is not None and not self._closing():
            if self._broker_full:
                break  # resume_writing calls _pump again
            now = self._loop.time()
            if now < self._muted_until:
                self._wake_at(self._muted_until)
                break
            if self._throttled and self._in_flight:
                break  # one request at a time: the response calls _pump again
            frame = self._pending[0]
            try:
                header = wire.read_request_header(frame[4:])
                # A request that waited out a hold goes on, even if another connection of the
                # client has started a new hold meanwhile (each request is checked as it is
                # forwarded): otherwise the connection whose wakeup comes first each time would
                # renew the hold before the others' requests, and starve them (aiokafka's timed
                # out after 40 s on one broker of three under a cluster-wide quota).
                hold_ms = 0 if self._waited_out else self._hold_ms(header)
                if hold_ms > 0:
                    self._throttled = True
                    self._waited_out = True
                    self._mute(hold_ms)
                    continue
                self._waited_out = False
                self._pending.popleft()
                self._forward(frame, header, batch)
            except Exception as error:
                self._failed(error, "a request refused")
                return
        if batch and self._broker is not None:
            _write(self._broker, batch)
        if self._pending or self._draining or self._loop.time() < self._muted_until:
            self._pause_client()
        else:
            self._resume_client()

    def _hold_ms(self, header: wire.RequestHeader) -> int:
        kind = _KIND.get(header.api_key)
        if kind is None or self.node_id is None:
            return 0
        key = (kind, self.identity.user, header.client_id or "", self.node_id)
        return self._context.holds.remaining_ms(key)

    def _forward(
        self, frame: memoryview, header: wire.RequestHeader, batch: list[memoryview]
    ) -> None:
        payload = frame[4:]
        client_id = header.client_id or ""
        api = header.api_key
        expects_response = True
        if api == wire.SASL_HANDSHAKE:
            self.identity.handshake(wire.decode_request(header, payload).mechanism)
        elif api == wire.SASL_AUTHENTICATE:
            self.identity.authenticate(bytes(wire.decode_request(header, payload).auth_bytes))
        elif api == wire.PRODUCE:
            # Recorded, then checked: the request that breaks the quota goes on, and holds the
            # connection from here, as a broker holds one (the next ones wait out the hold).
            over_ms = self._record(PRODUCE, client_id, len(payload))
            if over_ms > 0:
                self._throttled = True
                self._mute(over_ms)
            expects_response = wire.produce_acks(header, payload) != 0
        elif api == wire.FETCH:
            frame = self._capped_fetch(frame, header, client_id)
        if expects_response:
            self._in_flight.append(
                _InFlight(api, header.api_version, header.correlation_id, client_id)
            )
        batch.append(frame)
        self._context.forwarded(api, len(frame))
        if api == wire.PRODUCE and not expects_response:
            # acks=0: no response to carry a throttle, so the hold starts now.
            hold_ms = self._hold_ms(header)
            if hold_ms > 0:
                self._throttled = True
                self._mute(hold_ms)

    def _capped_fetch(
        self, frame: memoryview, header: wire.RequestHeader, client_id: str
    ) -> memoryview:
        """A Fetch request whose ``max_bytes`` is at most what the client's fetch quota allows
        in its window, as a broker caps it: a greedy consumer's first fetch would otherwise
        take many windows' worth at once, and be held for as long."""
        if self.node_id is None:
            return frame
        key = (FETCH, self.identity.user, client_id, self.node_id)
        largest = self._context.holds.largest_fetch(key)
        offset = wire.fetch_max_bytes_offset(header, frame[4:])
        if largest is None or offset is None or wire.read_int32(frame[4:], offset) <= largest:
            return frame
        capped = bytearray(frame)
        wire.write_int32(capped, 4 + offset, max(largest, 1))
        return memoryview(capped)

    def _record(self, kind: str, client_id: str, nbytes: int) -> int:
        """Counts bytes as the broker does: published as usage, and held for (``Holds``); how
        long the client is held from now for them (0: within its quota)."""
        if self.node_id is None:
            return 0
        now_ms = int(time.time() * 1000)
        self._context.usage.record(
            kind=kind,
            user=self.identity.user,
            client_id=client_id,
            broker=self.node_id,
            nbytes=nbytes,
            now_ms=now_ms,
        )
        key = (kind, self.identity.user, client_id, self.node_id)
        return self._context.holds.record_forwarded(key, nbytes, now_ms)

    # --- responses ---------------------------------------------------------------------------

    def broker_connected(self, transport: asyncio.Transport) -> None:
        self._broker = transport
        transport.set_write_buffer_limits(high=BROKER_HIGH_WATER)

    def broker_full(self, full: bool) -> None:
        """The broker's write buffer passed its high mark (or drained below its low one)."""
        self._broker_full = full
        if full:
            self._pause_client()
        else:
            self._pump()

    def broker_data(self, data: bytes) -> None:
        try:
            replies = [self._respond(frame) for frame in self._responses.feed(data)]
        except Exception as error:
            self._failed(error, f"a malformed response from broker {self._describe_broker()}")
            return
        if replies and self._client is not None:
            _write(self._client, replies)
        if self._draining and not self._in_flight:
            self.close(None, "drained")
            return
        self._pump()

    def broker_lost(self) -> None:
        self.close(None if self._closing() else "the broker closed the connection", "broker_closed")

    def _respond(self, frame: memoryview) -> memoryview | bytes | bytearray:
        """The frame to send the client for a response, and its throttle applied."""
        if not self._in_flight:
            raise wire.MalformedFrameError("a response to no request")
        request = self._in_flight.popleft()
        payload = frame[4:]
        if len(payload) < 4 or wire.read_int32(payload, 0) != request.correlation_id:
            raise wire.MalformedFrameError(
                f"a response out of order (expected correlation id {request.correlation_id})"
            )
        api = request.api_key
        out: memoryview | bytes | bytearray = frame
        if api in _KIND:
            out, throttle_ms = self._throttled_response(request, frame)
            self._throttled = throttle_ms > 0
            if throttle_ms > 0:
                self._mute(throttle_ms)
        elif api in wire.RESPONSES:
            out = self._rewritten(request, frame)
        self._context.returned(api, len(out))
        return out

    def _throttled_response(
        self, request: _InFlight, frame: memoryview
    ) -> tuple[memoryview | bytes | bytearray, int]:
        """A Produce or Fetch response with ``throttle_time_ms`` raised to the client's hold
        and broker addresses rewritten; and the throttle to mute for."""
        payload = frame[4:]
        api, version = request.api_key, request.api_version
        hold_ms = 0
        key = None
        if self.node_id is not None:
            key = (_KIND[api], self.identity.user, request.client_id, self.node_id)
            hold_ms = self._context.holds.remaining_ms(key)
        found = wire.throttled_response(api, version, payload)
        offset = found.throttle_offset
        throttle_ms = 0 if offset is None else wire.read_int32(payload, offset)
        counted = 0  # what the broker's fetch quota records: FetchResponse.sizeOf
        if api == wire.FETCH:
            counted = len(payload) - wire.response_header_size(api, version, payload) + 4
        if api == wire.FETCH and offset is not None and key is not None:
            over_ms = self._context.holds.over_quota_with(key, counted)
            if over_ms > 0:  # as a broker answers a fetch over its quota: empty, un-recorded
                # Published with 0 bytes (docs/events.md): the engine measures the client again
                # as its window slides, so the next decision is not one of stale bytes.
                self._record(FETCH, request.client_id, 0)
                throttle_ms = max(throttle_ms, over_ms)
                self._context.metrics.throttled_responses.labels(wire.api_name(api)).inc()
                self._context.metrics.emptied_fetches.inc()
                emptied = wire.emptied_fetch_response(
                    version, request.correlation_id, payload, offset, throttle_ms
                )
                return emptied, throttle_ms
        if found.tagged:  # NodeEndpoints (a leader moved): rare, decoded and rewritten
            return self._with_endpoints_rewritten(request, frame, hold_ms)
        if api == wire.FETCH:
            self._record(FETCH, request.client_id, counted)
        if offset is None or hold_ms <= throttle_ms:
            return frame, throttle_ms
        raised = bytearray(frame)
        wire.write_int32(raised, 4 + offset, hold_ms)
        self._context.metrics.throttled_responses.labels(wire.api_name(api)).inc()
        return raised, hold_ms

    def _with_endpoints_rewritten(
        self, request: _InFlight, frame: memoryview, hold_ms: int
    ) -> tuple[bytes, int]:
        payload = frame[4:]
        api, version = request.api_key, request.api_version
        message = wire.decode_response(api, version, payload)
        throttle_ms = message.throttle_time_ms
        if api == wire.FETCH:
            # The broker counted the response before it added its NodeEndpoints.
            endpoints, message.node_endpoints = message.node_endpoints, []
            unpointed = wire.encode_response(api, version, request.correlation_id, message)
            header_size = wire.response_header_size(api, version, payload)
            self._record(FETCH, request.client_id, len(unpointed) - header_size)
            message.node_endpoints = endpoints
        self._context.routes.rewrite(api, version, message)
        if hold_ms > throttle_ms:
            message.throttle_time_ms = hold_ms
            self._context.metrics.throttled_responses.labels(wire.api_name(api)).inc()
        rewritten = wire.encode_response(api, version, request.correlation_id, message)
        return rewritten, max(throttle_ms, hold_ms)

    def _rewritten(self, request: _InFlight, frame: memoryview) -> memoryview | bytes:
        api, version = request.api_key, request.api_version
        message = wire.decode_response(api, version, frame[4:])
        if api == wire.API_VERSIONS:
            message.api_keys = advertised_versions(message.api_keys)
        elif api == wire.SASL_AUTHENTICATE:
            self.identity.authenticated(message.error_code)
            return frame
        elif api not in REWRITTEN or not self._context.routes.rewrite(api, version, message):
            return frame
        return wire.encode_response(api, version, request.correlation_id, message)

    # --- muting, draining, closing -----------------------------------------------------------

    def _mute(self, throttle_ms: int) -> None:
        now = self._loop.time()
        until = now + throttle_ms / 1000
        if until > self._muted_until:
            self._context.metrics.held_seconds.inc(until - max(self._muted_until, now))
            self._muted_until = until
        self._pause_client()
        self._wake_at(self._muted_until)

    def _wake_at(self, when: float) -> None:
        if self._wakeup is not None and not self._wakeup.cancelled():
            if self._wakeup.when() <= when:
                return
            self._wakeup.cancel()
        self._wakeup = self._loop.call_at(when, self._woken)

    def _woken(self) -> None:
        self._wakeup = None
        self._pump()
        if self._loop.time() < self._muted_until and not self._closing():
            # The mute outlasts this wakeup: a later response's longer throttle extended it after
            # the wakeup was set. Wake again at its end, or a client with no request pending
            # would stay unread (until it gave up on its requests: 30 s for kafka-python).
            self._wake_at(self._muted_until)

    def _pause_client(self) -> None:
        if self._reading and self._client is not None and not self._client.is_closing():
            self._client.pause_reading()
            self._reading = False

    def _resume_client(self) -> None:
        if not self._reading and self._client is not None and not self._client.is_closing():
            self._client.resume_reading()
            self._reading = True

    def drain(self) -> None:
        """Reads no more requests; closes once the requests forwarded have their responses."""
        self._draining = True
        self._pause_client()
        if not self._in_flight:
            self.close(None, "drained")

    def _failed(self, error: Exception, what: str) -> None:
        """Closes the connection over a frame it cannot follow (named in the log), or over a bug
        (with its traceback): either costs this connection only."""
        if isinstance(error, (wire.MalformedFrameError, UnreadablePrincipalError)):
            self.close(f"{what}: {error}", "malformed")
        else:
            log.exception("closing a client connection of broker %s", self._describe_broker())
            self.close(None, "internal_error")

    def _closing(self) -> bool:
        return self.closed.done()

    def close(self, reason: str | None, label: str) -> None:
        if self._closing():
            return
        if reason is not None:
            log.warning(
                "closing a client connection of broker %s: %s", self._describe_broker(), reason
            )
        if self._wakeup is not None:
            self._wakeup.cancel()
        for transport in (self._client, self._broker):
            if transport is not None:
                transport.close()
        self._context.closed(self, label)
        self.closed.set_result(label)

    def _describe_broker(self) -> str:
        return "bootstrap" if self.node_id is None else str(self.node_id)


def _write(transport: asyncio.Transport, frames: list[Any]) -> None:
    """Frames that arrived together leave together: one send for pipelined small ones."""
    if len(frames) == 1:
        transport.write(frames[0])
    elif sum(len(frame) for frame in frames) <= _JOINED_WRITE_BYTES:
        transport.write(b"".join(frames))
    else:
        for frame in frames:
            transport.write(frame)


class ClientSide(asyncio.Protocol):
    def __init__(self, factory: Callable[[], Connection]) -> None:
        self._factory = factory
        self.connection: Connection | None = None

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


class _BrokerSide(asyncio.Protocol):
    def __init__(self, connection: Connection) -> None:
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


__all__ = ["Address", "ClientSide", "Connection", "FrameReader"]
