"""Engine settings (``conf/engine.yaml``), overridable by ``QUOTASTREAM_*`` environment variables.

Nested keys use ``__`` in variable names: ``QUOTASTREAM_EVENTS__MAX_PAST_MS=600000``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from quotastream.brokers.settings import BrokersSettings
from quotastream.proxy.settings import ProxySettings
from state.configfile import ConfigError, describe_validation_error, read_yaml_mapping
from state.events import EventBounds
from state.timing_wheel import KAFKA_TICK_MS, KAFKA_WHEEL_SIZE
from state.written_decisions import WritePolicy
from streaming.engine.client_settings import ClientSettingError, typed_setting

Millis = Annotated[int, Field(ge=0)]


class EventSettings(BaseModel):
    """What the validator accepts. Relative bounds apply around the engine's clock."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_ts_ms: Millis = EventBounds.min_ts_ms
    max_ts_ms: Millis = EventBounds.max_ts_ms
    max_past_ms: Millis | None = 3_600_000
    max_future_ms: Millis | None = 300_000
    max_payload_bytes: Annotated[int, Field(ge=64, le=16 * 1024 * 1024)] = 65_536

    def bounds(self, now_ms: int | None) -> EventBounds:
        """Absolute bounds, narrowed around ``now_ms`` when there is a clock."""
        absolute = EventBounds(min_ts_ms=self.min_ts_ms, max_ts_ms=self.max_ts_ms)
        if now_ms is None:
            return absolute
        return absolute.around(now_ms, self.max_past_ms, self.max_future_ms)


def _as_text(value: Any) -> Any:
    """A flag or a number given in YAML, as the text an environment variable gives."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


#: A ``kafka.client`` value: kept as a secret (any of them may be one), typed when used.
ClientValue = Annotated[SecretStr, BeforeValidator(_as_text)]


class KafkaSettings(BaseModel):
    """Where events come from, and where rejected events go."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def client_settings(self) -> dict[str, Any]:
        """kafka-python settings with their secret values, typed as kafka-python takes them
        (``streaming.engine.client_settings``); never log the result."""
        return {
            name: typed_setting(name, secret.get_secret_value())
            for name, secret in self.client.items()
        }

    bootstrap_servers: str = "127.0.0.1:9092"
    topics: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] = [
        "quotastream.events"
    ]
    starting_offsets: Literal["earliest", "latest"] = "latest"
    max_offsets_per_trigger: Annotated[int, Field(ge=1)] | None = None
    fail_on_data_loss: bool = True
    #: How long the engine waits out a broker that does not answer (down, restarting, a
    #: partition without a leader) before the query fails: triggers plan nothing new, reads
    #: and dead-letter writes wait (docs/reliability.md#kafka-outage).
    max_outage_s: Annotated[float, Field(gt=0)] = 300.0
    dead_letter_topic: str = "quotastream.dead-letter"
    #: The live configuration's log (``quotastream quota ...`` appends to it); null: the quota
    #: file is the only configuration and nothing changes while the engine runs.
    config_topic: Annotated[str, Field(min_length=1)] | None = "quotastream.config"
    #: kafka-python settings for the engine's clients (e.g. security_protocol,
    #: sasl_plain_password, request_timeout_ms: 60000, ssl_check_hostname: false).
    client: dict[str, ClientValue] = {}

    @model_validator(mode="after")
    def _client_settings_are_kafka_pythons(self) -> KafkaSettings:
        for name, secret in self.client.items():
            try:
                typed_setting(name, secret.get_secret_value())
            except ClientSettingError as error:
                raise ValueError(f"client.{name} {error}") from None
        return self

    @model_validator(mode="after")
    def _encrypted_client_key_has_its_password(self) -> KafkaSettings:
        # Without ssl_password, OpenSSL asks for an encrypted key's pass phrase on the terminal
        # at every connection: a run would hang at its first client, or fail on no terminal.
        if "ssl_password" in self.client:
            return self
        key = self.client.get("ssl_keyfile") or self.client.get("ssl_certfile")
        if key is not None and _is_encrypted_key(Path(key.get_secret_value())):
            name = "ssl_keyfile" if "ssl_keyfile" in self.client else "ssl_certfile"
            raise ValueError(
                f"client.{name} holds an encrypted private key, and client.ssl_password is not"
                " set (QUOTASTREAM_KAFKA__CLIENT__SSL_PASSWORD)"
            )
        return self


def _is_encrypted_key(path: Path) -> bool:
    """A PEM file whose private key needs a pass phrase (PKCS#8 or traditional OpenSSL); a file
    that cannot be read is left to the client to report."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return False
    return "-----BEGIN ENCRYPTED PRIVATE KEY-----" in text or "Proc-Type: 4,ENCRYPTED" in text


class RedisSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 6379
    #: An ACL user (docs/agents.md: the engine may write only under its prefix); None: default.
    username: str | None = None
    password: SecretStr | None = None
    ssl: bool = False
    #: The CA that signed the server's certificate (TLS); None: the system's CAs.
    ssl_ca_file: str | None = None
    #: A client certificate and key, for servers that require one (``tls-auth-clients yes``).
    ssl_cert_file: str | None = None
    ssl_key_file: str | None = None
    key_prefix: Annotated[str, Field(min_length=1)] = "quotastream"
    keep_ms: Annotated[int, Field(ge=1)] = 30_000
    #: Decisions at or above this share of their limit are written every micro-batch; below
    #: it, only a throttle, its end, or a change of what the key holds is (docs/redis.md).
    write_near_limit: Annotated[float, Field(ge=0, le=1)] = 0.8
    #: Connect and read timeout of one Redis round trip.
    timeout_ms: Annotated[int, Field(ge=1)] = 5_000
    #: How long a micro-batch's write keeps retrying while Redis is unreachable before the
    #: query fails (the checkpoint then replays the batch on restart).
    max_outage_s: Annotated[float, Field(gt=0)] = 300.0
    #: The longest pause between two attempts (exponential backoff from 50 ms): also the
    #: longest delay between Redis coming back and the stalled write going through.
    max_backoff_ms: Annotated[int, Field(ge=1)] = 500

    @model_validator(mode="after")
    def _client_certificate_pair(self) -> RedisSettings:
        if (self.ssl_cert_file is None) != (self.ssl_key_file is None):
            raise ValueError("ssl_cert_file and ssl_key_file must be set together")
        return self

    def write_policy(self) -> WritePolicy:
        return WritePolicy(keep_ms=self.keep_ms, near_limit=self.write_near_limit)

    def connection(self) -> dict[str, Any]:
        """redis-py connection options, with the secret password (never log the result)."""
        options: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "username": self.username,
            "password": self.password.get_secret_value() if self.password else None,
            "socket_timeout": self.timeout_ms / 1000,
            "socket_connect_timeout": self.timeout_ms / 1000,
            "ssl": self.ssl,
        }
        if self.ssl:
            options.update(
                ssl_ca_certs=self.ssl_ca_file,
                ssl_certfile=self.ssl_cert_file,
                ssl_keyfile=self.ssl_key_file,
            )
        return options

    @property
    def endpoint(self) -> str:
        return f"{'rediss' if self.ssl else 'redis'}://{self.host}:{self.port}"


class SparkSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    master: str = "local[2]"
    checkpoint: str = "checkpoint"
    #: State groups per micro-batch: the unit of parallelism of the stateful stage.
    shards: Annotated[int, Field(ge=1, le=4096)] = 8
    trigger_ms: Annotated[int, Field(ge=0)] = 1000
    #: Tasks of the stateful stage; None: one per core, at most one per shard (each task costs
    #: a Python round trip per micro-batch: docs/streaming.md#what-a-micro-batch-costs).
    shuffle_partitions: Annotated[int, Field(ge=1)] | None = None
    #: More Spark settings for the session, e.g. ``spark.executor.memory`` on a cluster.
    conf: dict[str, str] = {}

    def state_tasks(self, cores: int) -> int:
        """``spark.sql.shuffle.partitions`` for a new checkpoint, given Spark's parallelism."""
        return self.shuffle_partitions or max(1, min(self.shards, cores))


class TimerSettings(BaseModel):
    """Each shard's timing wheel for throttle releases (Kafka's purgatory defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tick_ms: Annotated[int, Field(ge=1, le=60_000)] = KAFKA_TICK_MS
    wheel_size: Annotated[int, Field(ge=2, le=4096)] = KAFKA_WHEEL_SIZE


class MetricsSettings(BaseModel):
    """The Prometheus exporter in the engine's driver process (``docs/metrics.md``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    #: Loopback by default: expose it deliberately (e.g. 0.0.0.0) behind a firewall.
    host: Annotated[str, Field(min_length=1)] = "127.0.0.1"
    #: 0: a free port, chosen when the exporter starts (tests).
    port: Annotated[int, Field(ge=0, le=65535)] = 9464
    #: Per-entity series for the top_k entities by utilisation per quota type, plus every
    #: entity throttled now; 0: no per-entity series.
    top_k: Annotated[int, Field(ge=0)] = 100


class EngineSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="QUOTASTREAM_",
        env_nested_delimiter="__",
        # As in the YAML file, ``null`` turns a setting off: QUOTASTREAM_KAFKA__CONFIG_TOPIC=null.
        env_parse_none_str="null",
        extra="forbid",
        frozen=True,
    )

    quotas: str = "conf/quotas.yaml"
    events: EventSettings = EventSettings()
    kafka: KafkaSettings = KafkaSettings()
    redis: RedisSettings = RedisSettings()
    spark: SparkSettings = SparkSettings()
    timers: TimerSettings = TimerSettings()
    metrics: MetricsSettings = MetricsSettings()
    #: ``quotastream proxy`` (docs/proxy.md); the engine itself does not read it.
    proxy: ProxySettings = ProxySettings()
    #: ``quotastream brokers`` (docs/brokers.md); the engine itself does not read it.
    brokers: BrokersSettings = BrokersSettings()

    def pointed_at(
        self,
        bootstrap_servers: str,
        redis_host: str,
        redis_port: int,
        checkpoint: str,
        **kafka_overrides: Any,
    ) -> EngineSettings:
        """These settings, reading and writing the given local servers (no credentials)."""
        data = self.model_dump()
        data["kafka"].update(bootstrap_servers=bootstrap_servers, client={}, **kafka_overrides)
        data["redis"].update(
            host=redis_host, port=redis_port, username=None, password=None, ssl=False
        )
        data["spark"].update(checkpoint=checkpoint)
        return EngineSettings.model_validate(data)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The environment overrides the file, which arrives as init arguments.
        return (env_settings, init_settings)


def load_engine_settings(path: Path | None) -> EngineSettings:
    """The settings of ``path`` (None: defaults), under their environment overrides.

    A relative ``quotas`` path in the file is relative to the file, so the engine reads the same
    quotas from any working directory; in ``QUOTASTREAM_QUOTAS`` it is relative to the working
    directory, as any path given on the command line.
    """
    data = read_yaml_mapping(path) if path is not None else {}
    if path is not None and isinstance(data.get("quotas"), str):
        data["quotas"] = str(path.parent / data["quotas"])
    source = f"{path} (or its QUOTASTREAM_* override)" if path else "QUOTASTREAM_* environment"
    try:
        return EngineSettings(**data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(source, exc)) from None
