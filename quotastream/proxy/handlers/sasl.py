"""Whose bytes these are: the connection's principal, followed through its SASL exchange."""

from __future__ import annotations

from quotastream.proxy import wire
from quotastream.proxy.handler import Handler, HandlerContext, Request, Response
from quotastream.proxy.identity import Identity


class SaslIdentity(Handler):
    """Reads the user from a PLAIN or SCRAM login as it passes (``identity.Identity``) and names
    the connection's user once the broker accepts the login. One per connection."""

    requests = frozenset({wire.SASL_HANDSHAKE, wire.SASL_AUTHENTICATE})
    responses = frozenset({wire.SASL_AUTHENTICATE})

    def __init__(self, mechanisms: frozenset[str]) -> None:
        self._identity = Identity(mechanisms)

    def on_request(self, request: Request, context: HandlerContext) -> None:
        message = wire.decode_request(request.header, request.payload)
        if request.header.api_key == wire.SASL_HANDSHAKE:
            self._identity.handshake(message.mechanism)
        else:
            self._identity.authenticate(bytes(message.auth_bytes))

    def on_response(self, response: Response, context: HandlerContext) -> None:
        request = response.request
        message = wire.decode_response(request.api_key, request.api_version, response.payload)
        self._identity.authenticated(message.error_code)
        context.user = self._identity.user
