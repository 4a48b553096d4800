"""Who a client connection is: the user its bytes count against (Kafka's principal name).

Kafka's principal is ``User:ANONYMOUS`` on a connection without SASL, and the SASL login's user
once the broker accepted it: PLAIN's authentication id (RFC 4616; an authorisation id, when
given, must equal it), SCRAM's ``n=`` name from the client-first message, or its ``a=``
authorisation id when given (RFC 5802, with ``=2C`` and ``=3D`` for ``,`` and ``=``). The
proxy reads the client's login as it passes and records the name only when the broker's
SaslAuthenticate response for the last step of that mechanism says it succeeded; a failed login
leaves the connection anonymous (the broker closes it). Re-authentication (KIP-368) goes the
same way. Mechanisms whose principal the proxy cannot read (GSSAPI, OAUTHBEARER) are refused
with a log line rather than counted under a wrong user.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from quotastream.proxy import wire
from quotastream.proxy.handler import ANONYMOUS

log = logging.getLogger(__name__)


#: SaslAuthenticate round trips to the end of a successful login, per mechanism.
_STEPS: Final = {"PLAIN": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2}
INSPECTED_MECHANISMS: Final = tuple(_STEPS)


class UnreadablePrincipalError(wire.MalformedFrameError):
    """A login whose principal the proxy cannot read (mechanism or message)."""


def plain_user(message: bytes) -> str:
    """The user of a SASL PLAIN message ``authzid NUL authcid NUL passwd``."""
    parts = message.split(b"\x00")
    if len(parts) != 3 or not parts[1]:
        raise UnreadablePrincipalError("a PLAIN message is authzid NUL authcid NUL password")
    authzid, authcid = parts[0].decode(), parts[1].decode()
    if authzid and authzid != authcid:
        raise UnreadablePrincipalError("PLAIN's authorisation id differs from its user")
    return authcid


def _scram_name(value: str) -> str:
    return value.replace("=2C", ",").replace("=3D", "=")


def scram_user(message: bytes) -> str:
    """The user of a SCRAM client-first message ``gs2-header n=name,r=nonce[,...]``."""
    text = message.decode()
    gs2_flag, _, rest = text.partition(",")
    authzid, _, bare = rest.partition(",")
    if gs2_flag not in ("n", "y", "p") and not gs2_flag.startswith("p="):
        raise UnreadablePrincipalError("not a SCRAM client-first message")
    if authzid.startswith("a="):
        return _scram_name(authzid[2:])
    for attribute in bare.split(","):
        if attribute.startswith("n="):
            return _scram_name(attribute[2:])
    raise UnreadablePrincipalError("a SCRAM client-first message names no user")


@dataclass
class Identity:
    """A connection's user as the broker knows it, followed through its SASL exchange."""

    #: The mechanisms whose logins are let through (``proxy.sasl_mechanisms``).
    mechanisms: frozenset[str] = frozenset(INSPECTED_MECHANISMS)
    user: str = ANONYMOUS
    _mechanism: str | None = None
    _candidate: str | None = None
    _step: int = 0

    def handshake(self, mechanism: str) -> None:
        """A SaslHandshake request; raises for a mechanism whose principal is unreadable."""
        if mechanism not in self.mechanisms:
            raise UnreadablePrincipalError(
                f"SASL mechanism {mechanism} is not one the proxy lets through "
                f"({', '.join(sorted(self.mechanisms))}): it could not tell whose bytes these are"
            )
        self._mechanism = mechanism
        self._candidate = None
        self._step = 0

    def authenticate(self, auth_bytes: bytes) -> None:
        """A SaslAuthenticate request (the client's next SASL message)."""
        if self._mechanism is None:
            raise UnreadablePrincipalError("SaslAuthenticate before any SaslHandshake")
        if self._step == 0:
            try:
                reader = plain_user if self._mechanism == "PLAIN" else scram_user
                self._candidate = reader(auth_bytes)
            except UnicodeDecodeError:
                raise UnreadablePrincipalError(
                    f"a {self._mechanism} message is not UTF-8"
                ) from None
        self._step += 1

    def authenticated(self, error_code: int) -> None:
        """The broker's SaslAuthenticate response: the login's last step succeeded or not."""
        if self._mechanism is None:
            return
        if error_code != 0:
            self._mechanism, self._candidate, self._step = None, None, 0
            return
        if self._step == _STEPS[self._mechanism] and self._candidate is not None:
            if self.user != self._candidate:
                log.debug("connection authenticated as User:%s", self._candidate)
            self.user = self._candidate
            self._mechanism, self._candidate, self._step = None, None, 0
