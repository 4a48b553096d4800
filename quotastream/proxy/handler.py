"""The one interface every concern of the proxy implements (as Kroxylicious' filters do).

A :class:`Handler` declares the API keys whose requests and responses it wants to see; the
connection runs each request through the handlers that declared its API, in the chain's order,
then forwards it, and each response through the same chain, then returns it. A handler acts
through the :class:`HandlerContext` it is given (the connection it serves): it may replace the
frame, hold the request (the chain stops; the connection waits and runs the rest of the chain
for it again when the hold ends), or throttle the client (the connection reads nothing from it
for that long, and forwards one request at a time while throttled). An API no handler declares is
forwarded as bytes, without a call.

The connection knows frames, ordering, muting and the chain; the handlers know what Kafka's
APIs mean. Counting one more API is a change to one handler.
"""

from __future__ import annotations

from typing import ClassVar, Final, Protocol

from quotastream.proxy import wire

#: Kafka's principal on a connection without SASL (``User:ANONYMOUS``).
ANONYMOUS: Final = "ANONYMOUS"

#: A handler's API set that matches every API.
EVERY_API: Final = frozenset({-1})


class HandlerContext(Protocol):
    """What a handler knows of its connection, and what it may do through it."""

    #: The broker the connection leads to (None until a bootstrap connection has one).
    node_id: int | None
    #: The connection's principal as the broker knows it (the SASL handler sets it).
    user: str

    def hold(self, delay_ms: int) -> None:
        """Forward this request ``delay_ms`` from now, not before: the chain stops here, and
        resumes with this handler then (the request's ``waited_out`` says so)."""
        ...

    def throttle(self, throttle_ms: int) -> None:
        """The client is throttled for ``throttle_ms`` from now (0: it is not): nothing is read
        from it until then, and requests go one at a time while it is throttled."""
        ...


class Request:
    """A request on its way to the broker: its header, and its whole frame (length prefix
    included), which a handler may replace (:meth:`replace`).

    Plain slots, not a dataclass: one is made per request on the proxy's hot path."""

    __slots__ = ("_expects_response", "at_ms", "frame", "header", "payload", "waited_out")

    def __init__(self, header: wire.RequestHeader, frame: memoryview) -> None:
        self.header = header
        self.frame: memoryview | bytes | bytearray = frame
        #: The frame without its length prefix.
        self.payload = frame[4:]
        #: When the chain ran for it (wall ms, the connection's clock).
        self.at_ms = 0
        #: It has waited out a hold a handler asked for.
        self.waited_out = False
        self._expects_response: bool | None = None

    def replace(self, frame: bytes | bytearray) -> None:
        """The frame the broker gets instead."""
        self.frame = frame
        self.payload = memoryview(frame)[4:]

    @property
    def expects_response(self) -> bool:
        """The broker answers it (all but an ``acks=0`` Produce)."""
        if self._expects_response is None:
            self._expects_response = wire.expects_response(self.header, self.payload)
        return self._expects_response


class Response:
    """A broker's response on its way to the client: the header of its request, and its whole
    frame, which a handler may replace (:meth:`replace`). Plain slots, as :class:`Request`."""

    __slots__ = ("_counted", "_layout", "_original", "at_ms", "frame", "payload", "request")

    def __init__(self, request: wire.RequestHeader, frame: memoryview, at_ms: int) -> None:
        self.request = request
        self.frame: memoryview | bytes | bytearray = frame
        self.payload = frame[4:]
        self.at_ms = at_ms
        #: The frame as the broker sent it.
        self._original = frame
        #: What a broker's quota records for this response (set by who empties it); None: not
        #: worked out yet (:attr:`counted_bytes`).
        self._counted: int | None = None
        self._layout: wire.ThrottledResponse | None = None

    @property
    def layout(self) -> wire.ThrottledResponse:
        """Where a Produce or Fetch response's throttle sits (of the frame as it is now)."""
        if self._layout is None:
            self._layout = wire.throttled_response(
                self.request.api_key, self.request.api_version, self.payload
            )
        return self._layout

    @property
    def counted_bytes(self) -> int:
        """The bytes a broker's fetch quota records for this response, as the broker sent it
        (``FetchResponse.sizeOf``, before any ``NodeEndpoints``)."""
        if self._counted is None:
            original = self._original[4:]
            version = self.request.api_version
            layout = (
                self.layout
                if self.frame is self._original
                else wire.throttled_response(wire.FETCH, version, original)
            )
            self._counted = wire.fetch_counted_bytes(version, original, layout.tagged)
        return self._counted

    def replace(self, frame: bytes | bytearray, counted_bytes: int | None = None) -> None:
        """The frame the client gets instead; ``counted_bytes``: what the broker's quota records
        for it, where a handler changes that (an emptied fetch records nothing)."""
        self.frame = frame
        self.payload = memoryview(frame)[4:]
        self._layout = None
        if counted_bytes is not None:
            self._counted = counted_bytes


class Handler:
    """One concern of the proxy. Subclasses set the API keys they see (``EVERY_API``: all)
    and override the calls they need; the defaults let everything through unchanged."""

    requests: ClassVar[frozenset[int]] = frozenset()
    responses: ClassVar[frozenset[int]] = frozenset()

    def on_request(self, request: Request, context: HandlerContext) -> None:
        """Called for each request of a declared API, before it is forwarded."""

    def on_response(self, response: Response, context: HandlerContext) -> None:
        """Called for each response of a declared API, before it is returned."""


class Chain:
    """A connection's handlers in order, and for each API the ones that see it (worked out at
    its first request)."""

    def __init__(self, handlers: list[Handler]) -> None:
        self._handlers = handlers
        self._requests: dict[int, tuple[Handler, ...]] = {}
        self._responses: dict[int, tuple[Handler, ...]] = {}

    def for_request(self, api_key: int) -> tuple[Handler, ...]:
        return self._declaring(self._requests, api_key, responses=False)

    def for_response(self, api_key: int) -> tuple[Handler, ...]:
        return self._declaring(self._responses, api_key, responses=True)

    def _declaring(
        self, known: dict[int, tuple[Handler, ...]], api_key: int, *, responses: bool
    ) -> tuple[Handler, ...]:
        found = known.get(api_key)
        if found is None:
            found = known[api_key] = tuple(
                handler
                for handler in self._handlers
                if _declares(handler.responses if responses else handler.requests, api_key)
            )
        return found


def _declares(api_keys: frozenset[int], api_key: int) -> bool:
    return api_keys is EVERY_API or api_key in api_keys
