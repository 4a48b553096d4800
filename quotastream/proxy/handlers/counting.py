"""The bytes a broker's quotas count, published as usage for the engine: a Produce request's
size, and what a Fetch response's quota records (``Response.counted_bytes``: nothing for one
the proxy emptied)."""

from __future__ import annotations

from quotastream.proxy import wire
from quotastream.proxy.handler import Handler, HandlerContext, Request, Response
from quotastream.proxy.usage import FETCH, PRODUCE, UsageSums


class UsageCounting(Handler):
    requests = frozenset({wire.PRODUCE})
    responses = frozenset({wire.FETCH})

    def __init__(self, usage: UsageSums) -> None:
        self._usage = usage

    def on_request(self, request: Request, context: HandlerContext) -> None:
        self._count(PRODUCE, context, request.header, len(request.payload), request.at_ms)

    def on_response(self, response: Response, context: HandlerContext) -> None:
        self._count(FETCH, context, response.request, response.counted_bytes, response.at_ms)

    def _count(
        self,
        kind: str,
        context: HandlerContext,
        header: wire.RequestHeader,
        nbytes: int,
        at_ms: int,
    ) -> None:
        if context.node_id is None:
            return
        self._usage.record(
            kind=kind,
            user=context.user,
            client_id=header.client_id or "",
            broker=context.node_id,
            nbytes=nbytes,
            now_ms=at_ms,
        )
