"""One client connection and the broker connection it maps to: the proxy's connection loop.

Frames are forwarded whole (a request reaches the broker only once all of it arrived, so a
client that disconnects mid-request leaves nothing half-written upstream), in order, each
through the chain of handlers that declared its API (``handler.py``); only a request's header
is read here. What the handlers ask is carried out here: a held request waits at the head of
the queue, and the rest of its chain runs when the hold ends; a throttled client is muted
(nothing is read from it) and, while it is throttled, its requests go one at a time, the next
only after the previous response and its throttle, as a broker processes one request per
connection: a client with several requests in flight (kafka-python's five) would otherwise slip
them through at each unmute.

Flow control: past ``BROKER_HIGH_WATER`` unsent towards the broker, no more requests are
forwarded and nothing more is read from the client until it drains (a client that sends faster
than its broker takes is slowed as by the broker itself, and the proxy's memory stays bounded);
past ``CLIENT_HIGH_WATER`` (more than a large fetch response) towards the client, nothing more
is read from the broker.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Final

from quotastream.proxy import wire
from quotastream.proxy.context import ConnectionHost, Timer
from quotastream.proxy.frames import FrameReader, write_frames
from quotastream.proxy.handler import ANONYMOUS, Chain, Request, Response
from quotastream.proxy.transports import Transport

log = logging.getLogger(__name__)

BROKER_HIGH_WATER: Final = 1 << 20
CLIENT_HIGH_WATER: Final = 8 << 20


class Connection:
    """A client connection through the proxy to one broker (``node_id``; None: a bootstrap
    connection, whose broker is known once it is connected). It is its handlers' context
    (``handler.HandlerContext``)."""

    def __init__(self, host: ConnectionHost, node_id: int | None) -> None:
        self._host = host
        self._clock = host.clock
        self.node_id = node_id
        self.user = ANONYMOUS
        self._chain = Chain(host.new_handlers())
        self._client: Transport | None = None
        self._broker: Transport | None = None
        self._ready = False
        self._requests = FrameReader(host.max_frame_bytes)
        self._responses = FrameReader(host.max_frame_bytes)
        self._pending: deque[memoryview] = deque()
        #: The pending request a handler held, and the handler its chain resumes with.
        self._held: tuple[Request, int] | None = None
        self._hold_ms = 0
        self._in_flight: deque[wire.RequestHeader] = deque()
        self._muted_until = 0.0
        self._throttled = False
        self._wakeup: Timer | None = None
        self._reading = True
        self._broker_full = False
        self._draining = False
        self.closed_as: str | None = None

    # --- what handlers ask (handler.HandlerContext) ---------------------------------------

    def hold(self, delay_ms: int) -> None:
        self._hold_ms = max(self._hold_ms, delay_ms)

    def throttle(self, throttle_ms: int) -> None:
        self._throttled = throttle_ms > 0
        if throttle_ms > 0:
            self._mute(throttle_ms)

    # --- the client side ---------------------------------------------------------------------

    def client_connected(self, transport: Transport) -> None:
        self._client = transport
        transport.set_write_buffer_limits(high=CLIENT_HIGH_WATER)
        self._host.opened(self)
        self._pause_client()  # until the broker connection is up
        self._host.connect(self)

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
        batch: list[memoryview | bytes | bytearray] = []
        while self._pending and self._ready and not self.closed_as:
            if self._broker_full:
                break  # broker_full(False) calls _pump again
            if self._clock.monotonic() < self._muted_until:
                self._wake_at(self._muted_until)
                break
            if self._throttled and self._in_flight:
                break  # one request at a time: the response calls _pump again
            try:
                request = self._through_chain()
            except Exception as error:
                self._failed(error, "a request refused")
                return
            if request is None:
                continue  # held: muted until the hold ends
            self._pending.popleft()
            if request.expects_response:
                self._in_flight.append(request.header)
            batch.append(request.frame)
        if batch and self._broker is not None:
            write_frames(self._broker, batch)
        # One reading decides both: a client left unread for a mute has a wakeup at its end
        # (read twice, a mute ending between the readings left it unread for good).
        muted = self._clock.monotonic() < self._muted_until
        if muted and not self.closed_as:
            self._wake_at(self._muted_until)
        if self._pending or self._draining or muted:
            self._pause_client()
        else:
            self._resume_client()

    def _through_chain(self) -> Request | None:
        """The head request through its handlers (from where a hold stopped it); None if one
        held it."""
        if self._held is not None:
            (request, first), self._held = self._held, None
            request.waited_out = True
        else:
            frame = self._pending[0]
            request = Request(wire.read_request_header(frame[4:]), frame)
            first = 0
        request.at_ms = self._clock.wall_ms()
        self._hold_ms = 0
        handlers = self._chain.for_request(request.header.api_key)
        for index in range(first, len(handlers)):
            handlers[index].on_request(request, self)
            if self._hold_ms > 0:
                self._held = (request, index)
                self.throttle(self._hold_ms)
                self._hold_ms = 0
                return None
        return request

    # --- responses ---------------------------------------------------------------------------

    def broker_connected(self, transport: Transport) -> None:
        self._broker = transport
        transport.set_write_buffer_limits(high=BROKER_HIGH_WATER)

    def broker_ready(self, node_id: int | None) -> None:
        """The broker connection is up (``node_id``: its broker, learnt for a bootstrap one)."""
        self.node_id = node_id
        if self._client is None or self._client.is_closing() or self.closed_as:
            if self._broker is not None:
                self._broker.close()
            return
        self._ready = True
        self._pump()

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
            write_frames(self._client, replies)
        if self._draining and not self._in_flight:
            self.close(None, "drained")
            return
        self._pump()

    def broker_lost(self) -> None:
        self.close(None if self.closed_as else "the broker closed the connection", "broker_closed")

    def _respond(self, frame: memoryview) -> memoryview | bytes | bytearray:
        """The frame to send the client for a response, through its handlers."""
        if not self._in_flight:
            raise wire.MalformedFrameError("a response to no request")
        request = self._in_flight.popleft()
        if len(frame) < 8 or wire.read_int32(frame, 4) != request.correlation_id:
            raise wire.MalformedFrameError(
                f"a response out of order (expected correlation id {request.correlation_id})"
            )
        handlers = self._chain.for_response(request.api_key)
        if not handlers:
            return frame
        response = Response(request, frame, self._clock.wall_ms())
        for handler in handlers:
            handler.on_response(response, self)
        return response.frame

    # --- muting, draining, closing -----------------------------------------------------------

    def _mute(self, throttle_ms: int) -> None:
        now = self._clock.monotonic()
        until = now + throttle_ms / 1000
        if until > self._muted_until:
            self._host.held(until - max(self._muted_until, now))
            self._muted_until = until
        self._pause_client()
        self._wake_at(self._muted_until)

    def _wake_at(self, when: float) -> None:
        if self._wakeup is not None and not self._wakeup.cancelled():
            if self._wakeup.when() <= when:
                return
            self._wakeup.cancel()
        self._wakeup = self._host.call_at(when, self._woken)

    def _woken(self) -> None:
        # The mute may outlast this wakeup (a later response's longer throttle extended it after
        # the wakeup was set): _pump then sets the next one.
        self._wakeup = None
        self._pump()

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
        if isinstance(error, wire.MalformedFrameError):
            self.close(f"{what}: {error}", "malformed")
        else:
            log.exception("closing a client connection of broker %s", self._describe_broker())
            self.close(None, "internal_error")

    def close(self, reason: str | None, label: str) -> None:
        if self.closed_as:
            return
        if reason is not None:
            log.warning(
                "closing a client connection of broker %s: %s", self._describe_broker(), reason
            )
        self.closed_as = label
        if self._wakeup is not None:
            self._wakeup.cancel()
        for transport in (self._client, self._broker):
            if transport is not None:
                transport.close()
        self._host.closed(self, label)

    def _describe_broker(self) -> str:
        return "bootstrap" if self.node_id is None else str(self.node_id)
