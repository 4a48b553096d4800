"""No broker address reaches a client: every response that names brokers is rewritten to the
proxy's ports (``routing.Routes``), and ApiVersions is narrowed to what the proxy can follow."""

from __future__ import annotations

from quotastream.proxy import wire
from quotastream.proxy.handler import Handler, HandlerContext, Response
from quotastream.proxy.routing import REWRITTEN, Routes, advertised_versions

_LEADER_HINTS = frozenset({wire.PRODUCE, wire.FETCH})


class AddressRewriting(Handler):
    responses = REWRITTEN | {wire.API_VERSIONS}

    def __init__(self, routes: Routes) -> None:
        self._routes = routes

    def on_response(self, response: Response, context: HandlerContext) -> None:
        request = response.request
        api, version = request.api_key, request.api_version
        if api in _LEADER_HINTS and not response.layout.tagged:
            return  # no NodeEndpoints (KIP-951): the hot path, nothing decoded
        message = wire.decode_response(api, version, response.payload)
        if api == wire.API_VERSIONS:
            message.api_keys = advertised_versions(message.api_keys)
        elif not self._routes.rewrite(api, version, message):
            return
        response.replace(wire.encode_response(api, version, request.correlation_id, message))
