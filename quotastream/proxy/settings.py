"""The ``proxy:`` section of the engine settings (``conf/engine.yaml``, ``docs/proxy.md``).

The proxy reads the rest of the file too: ``kafka`` (where usage events go), ``redis`` (where
decisions are read), ``quotas`` (how a client resolves to its counter) and ``events``
(the largest message the engine accepts).
"""

from __future__ import annotations

import socket
import ssl
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from quotastream.agent_settings import ClusterLogin, MetricsEndpoint
from quotastream.cache import CacheSettings, FailurePolicy
from quotastream.proxy.identity import INSPECTED_MECHANISMS

Millis = Annotated[int, Field(ge=1)]


class ClientTlsSettings(BaseModel):
    """TLS towards clients: the proxy terminates it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cert_file: str
    key_file: str
    key_password: SecretStr | None = None
    #: The CA that signs client certificates; set, clients must present one (mutual TLS).
    client_ca_file: str | None = None

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        password = self.key_password.get_secret_value() if self.key_password else None
        context.load_cert_chain(self.cert_file, self.key_file, password)
        if self.client_ca_file is not None:
            context.load_verify_locations(self.client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        return context


class DecisionSettings(BaseModel):
    """How the proxy reads decisions (the agents' cached client, ``docs/agents.md``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: How often each active client's decision is read again (the most a decision can lag).
    refresh_ms: Millis = 100
    #: A client unseen this long is forgotten (no more lookups).
    idle_ms: Millis = 60_000
    failure_policy: FailurePolicy = FailurePolicy.OPEN
    fail_closed_delay_ms: Annotated[int, Field(ge=0)] = 1_000
    fail_open_staleness_ms: Millis = 30_000
    timeout_ms: Millis = 200

    def cache(self) -> CacheSettings:
        return CacheSettings(
            # Below refresh_ms: every refresh pass reads Redis, none answers from the cache.
            max_staleness_ms=max(self.refresh_ms // 2, 1),
            fail_open_staleness_ms=max(self.fail_open_staleness_ms, self.refresh_ms),
            timeout_ms=self.timeout_ms,
            failure_policy=self.failure_policy,
            fail_closed_delay_ms=self.fail_closed_delay_ms,
        )


class ProxySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    listen_host: Annotated[str, Field(min_length=1)] = "127.0.0.1"
    #: The host clients are told to connect to (Metadata, FindCoordinator, ...); None: the
    #: listen host.
    advertised_host: Annotated[str, Field(min_length=1)] | None = None
    bootstrap_port: Annotated[int, Field(ge=1, le=65535)] = 9192
    #: Broker node id N is reached through port node_port_base + N.
    node_port_base: Annotated[int, Field(ge=1, le=65535)] = 9200
    upstream: ClusterLogin = ClusterLogin()
    #: TLS towards clients; None: plaintext.
    tls: ClientTlsSettings | None = None
    #: The SASL mechanisms whose logins the proxy reads (the principal a client's bytes count
    #: against); a client logging in with another one is disconnected.
    sasl_mechanisms: Annotated[
        list[Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]], Field(min_length=1)
    ] = list(INSPECTED_MECHANISMS)  # type: ignore[arg-type]
    #: How often counted bytes are published to the events topic.
    flush_interval_ms: Annotated[int, Field(ge=10, le=60_000)] = 250
    #: Sums kept between flushes (per quota, user, client-id, broker and sample).
    max_pending_sums: Annotated[int, Field(ge=1)] = 100_000
    #: Flushes waiting for the publisher while Kafka is slow or down (240: a minute at 250 ms).
    max_queued_flushes: Annotated[int, Field(ge=1)] = 240
    #: This proxy's name in the message header of what it publishes; None: the host name.
    instance: Annotated[str, Field(min_length=1)] | None = None
    #: The largest frame accepted from a client or a broker (Kafka's socket.request.max.bytes).
    max_frame_bytes: Annotated[int, Field(ge=1024)] = 104_857_600
    #: How long a stop waits for forwarded requests' responses before closing connections.
    drain_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    decisions: DecisionSettings = DecisionSettings()
    metrics: MetricsEndpoint = MetricsEndpoint()

    @property
    def instance_name(self) -> str:
        return self.instance or socket.gethostname()

    @property
    def client_host(self) -> str:
        return self.advertised_host or self.listen_host

    @model_validator(mode="after")
    def _ports_do_not_collide(self) -> ProxySettings:
        if self.bootstrap_port >= self.node_port_base:
            raise ValueError(
                f"bootstrap_port {self.bootstrap_port} must be below node_port_base "
                f"{self.node_port_base} (node id N listens on node_port_base + N)"
            )
        return self

    @model_validator(mode="after")
    def _tls_files_exist(self) -> ProxySettings:
        if self.tls is not None:
            for name in ("cert_file", "key_file", "client_ca_file"):
                value = getattr(self.tls, name)
                if value is not None and not Path(value).is_file():
                    raise ValueError(f"tls.{name} {value!r} is not a file")
        return self
