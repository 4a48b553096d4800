"""Requests, request bytes and response bytes per API, for every API (Prometheus)."""

from __future__ import annotations

from typing import Any

from quotastream.proxy import wire
from quotastream.proxy.handler import EVERY_API, Handler, HandlerContext, Request, Response
from quotastream.proxy.metrics import ProxyMetrics


class ApiMetrics(Handler):
    """Counts each frame as it leaves (after the handlers before it changed it). Shared by
    every connection: each API's labelled counters are looked up once (``labels()`` costs a
    lock and a hash on the hot path)."""

    requests = EVERY_API
    responses = EVERY_API

    def __init__(self, metrics: ProxyMetrics) -> None:
        self._metrics = metrics
        self._by_api: dict[int, tuple[Any, Any, Any]] = {}

    def on_request(self, request: Request, context: HandlerContext) -> None:
        requests, request_bytes, _ = self._of(request.header.api_key)
        requests.inc()
        request_bytes.inc(len(request.frame))

    def on_response(self, response: Response, context: HandlerContext) -> None:
        self._of(response.request.api_key)[2].inc(len(response.frame))

    def _of(self, api_key: int) -> tuple[Any, Any, Any]:
        found = self._by_api.get(api_key)
        if found is None:
            api = wire.api_name(api_key)
            found = self._by_api[api_key] = (
                self._metrics.requests.labels(api),
                self._metrics.bytes.labels(api, "request"),
                self._metrics.bytes.labels(api, "response"),
            )
        return found
