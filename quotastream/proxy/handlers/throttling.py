"""Clients held as a broker holds them (KIP-219), by the engine's decisions (``holds.Holds``).

* A Produce or Fetch request of a client the engine holds waits out the hold before it is
  forwarded, on every connection of that client; a request that has waited one out goes on even
  if another connection of the client renewed the hold meanwhile (it is checked as it goes):
  otherwise the connection woken first each time would renew the hold before the others'
  requests, and starve them (aiokafka's timed out after 40 s on one broker of three under a
  cluster-wide quota).
* A Produce request is recorded, then checked, as a broker does: the request that breaks the
  quota goes on and throttles its client from there; an ``acks=0`` one, which has no response
  to carry a throttle, throttles its client as it is forwarded.
* A Fetch request asks for no more than the client's fetch quota lets through in its window
  (``max_bytes`` capped, as a broker caps it): a greedy consumer's first fetch would otherwise
  take many windows' worth at once, and be held for as long.
* A Produce or Fetch response carries the larger of the broker's throttle and what remains of
  the engine's hold in ``throttle_time_ms`` (for clients that hold back by themselves), and
  throttles the connection as long (muting holds those that do not: librdkafka, aiokafka). A
  Fetch response that would put the client over its quota is answered empty instead, as a
  broker answers one, and records nothing.
"""

from __future__ import annotations

from typing import Protocol

from quotastream.proxy import wire
from quotastream.proxy.handler import Handler, HandlerContext, Request, Response
from quotastream.proxy.hold_window import ClientKey
from quotastream.proxy.metrics import ProxyMetrics
from quotastream.proxy.usage import FETCH, PRODUCE

_QUOTA = {wire.PRODUCE: PRODUCE, wire.FETCH: FETCH}


class ClientHolds(Protocol):
    """How long each client is held (``holds.Holds``: by the engine's decisions)."""

    def remaining_ms(self, key: ClientKey) -> int: ...
    def record_forwarded(self, key: ClientKey, nbytes: int, now_ms: int) -> int: ...
    def over_quota_with(self, key: ClientKey, nbytes: int) -> int: ...
    def largest_fetch(self, key: ClientKey) -> int | None: ...


class Throttling(Handler):
    requests = frozenset(_QUOTA)
    responses = frozenset(_QUOTA)

    def __init__(self, holds: ClientHolds, metrics: ProxyMetrics) -> None:
        self._holds = holds
        self._metrics = metrics

    def on_request(self, request: Request, context: HandlerContext) -> None:
        key = _key(request.header, context)
        if key is None:
            return
        holds = self._holds
        if not request.waited_out:
            hold_ms = holds.remaining_ms(key)
            if hold_ms > 0:
                context.hold(hold_ms)
                return
        if request.header.api_key == wire.FETCH:
            self._cap(request, key)
            return
        over_ms = holds.record_forwarded(key, len(request.payload), request.at_ms)
        if over_ms > 0:
            context.throttle(over_ms)
        if not request.expects_response:
            hold_ms = holds.remaining_ms(key)
            if hold_ms > 0:
                context.throttle(hold_ms)

    def _cap(self, request: Request, key: ClientKey) -> None:
        largest = self._holds.largest_fetch(key)
        payload = request.payload
        offset = wire.fetch_max_bytes_offset(request.header, payload)
        if largest is None or offset is None or wire.read_int32(payload, offset) <= largest:
            return
        capped = bytearray(request.frame)
        wire.write_int32(capped, 4 + offset, max(largest, 1))
        request.replace(capped)

    def on_response(self, response: Response, context: HandlerContext) -> None:
        key = _key(response.request, context)
        hold_ms = 0 if key is None else self._holds.remaining_ms(key)
        offset = response.layout.throttle_offset
        throttle_ms = 0 if offset is None else wire.read_int32(response.payload, offset)
        if response.request.api_key == wire.FETCH and key is not None:
            if offset is not None and self._emptied(response, key, offset, throttle_ms, context):
                return
            self._holds.record_forwarded(key, response.counted_bytes, response.at_ms)
        if offset is not None and hold_ms > throttle_ms:
            raised = bytearray(response.frame)
            wire.write_int32(raised, 4 + offset, hold_ms)
            response.replace(raised)
            self._count_throttled(response)
            throttle_ms = hold_ms
        context.throttle(throttle_ms)

    def _emptied(
        self,
        response: Response,
        key: ClientKey,
        offset: int,
        throttle_ms: int,
        context: HandlerContext,
    ) -> bool:
        """Answers the fetch empty if its bytes would put the client over its quota."""
        over_ms = self._holds.over_quota_with(key, response.counted_bytes)
        if over_ms <= 0:
            return False
        # Recorded as 0 bytes (docs/events.md): the engine measures the client again as its
        # window slides, so the next decision is not one of stale bytes.
        self._holds.record_forwarded(key, 0, response.at_ms)
        throttle_ms = max(throttle_ms, over_ms)
        request = response.request
        emptied = wire.emptied_fetch_response(
            request.api_version, request.correlation_id, response.payload, offset, throttle_ms
        )
        response.replace(emptied, counted_bytes=0)
        self._count_throttled(response)
        self._metrics.emptied_fetches.inc()
        context.throttle(throttle_ms)
        return True

    def _count_throttled(self, response: Response) -> None:
        self._metrics.throttled_responses.labels(wire.api_name(response.request.api_key)).inc()


def _key(header: wire.RequestHeader, context: HandlerContext) -> ClientKey | None:
    """The client's decision key on this connection's broker (None: no broker yet)."""
    if context.node_id is None:
        return None
    return (_QUOTA[header.api_key], context.user, header.client_id or "", context.node_id)
