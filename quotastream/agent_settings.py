"""What the agents' sections of the engine settings share: ``proxy:`` and ``brokers:``
(``docs/proxy.md``, ``docs/brokers.md``). The cluster's brokers and the login to them (the
proxy's ``upstream``, the brokers' ``cluster``), and an agent's Prometheus endpoint."""

from __future__ import annotations

import ssl
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from quotastream.address import Address, parse_addresses

Port = Annotated[int, Field(ge=0, le=65535)]


class ClusterLogin(BaseModel):
    """A cluster's brokers and how to reach them: the brokers behind the proxy, the cluster
    ``quotastream brokers`` watches."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bootstrap_servers: str = "127.0.0.1:9092"
    #: kafka-python settings of the proxy's own connections to these brokers (it reads the
    #: cluster's brokers with them): security_protocol, ssl_cafile, sasl_mechanism, ... A
    #: security_protocol of SSL or SASL_SSL also makes every relayed connection TLS, with the
    #: same ssl_cafile, ssl_certfile/ssl_keyfile and ssl_check_hostname.
    client: dict[str, SecretStr] = {}

    @model_validator(mode="after")
    def _valid_servers(self) -> ClusterLogin:
        parse_addresses(self.bootstrap_servers)
        return self

    @property
    def addresses(self) -> list[Address]:
        return parse_addresses(self.bootstrap_servers)

    def client_settings(self) -> dict[str, Any]:
        """kafka-python settings with their secret values (never log the result)."""
        return {name: secret.get_secret_value() for name, secret in self.client.items()}

    def tls_context(self) -> ssl.SSLContext | None:
        """The TLS context of relayed connections; None on plaintext brokers."""
        options = self.client_settings()
        if options.get("security_protocol", "PLAINTEXT") not in ("SSL", "SASL_SSL"):
            return None
        context = ssl.create_default_context(cafile=options.get("ssl_cafile"))
        if options.get("ssl_certfile"):
            context.load_cert_chain(
                options["ssl_certfile"], options.get("ssl_keyfile"), options.get("ssl_password")
            )
        context.check_hostname = str(options.get("ssl_check_hostname", True)).lower() != "false"
        return context


class MetricsEndpoint(BaseModel):
    """An agent's Prometheus endpoint (the proxy's; ``quotastream brokers``' on another port)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    host: Annotated[str, Field(min_length=1)] = "127.0.0.1"
    #: 0: a free port.
    port: Port = 9465
