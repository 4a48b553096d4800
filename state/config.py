"""The quota configuration (``conf/quotas.yaml``): typed, validated, Kafka's names and defaults.

Unset quota = unlimited, as in Kafka. Client quotas attach to (user, client-id) entities with
``<default>`` at either level; broker quotas use Kafka's broker config names with a
``<default>`` entry and per-broker overrides; topics list their throttled replicas.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)

from state.configfile import ConfigError, describe_validation_error, read_yaml_mapping
from state.quota_types import CLIENT_QUOTA_TYPES, QuotaType

DEFAULT: Final = "<default>"
#: Kafka's legal topic names.
TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")

ByteRate = Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)]
EntityName = Annotated[str, Field(min_length=1, max_length=1024, strict=True)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class QuotaTypeSettings(_Model):
    """How one quota type measures usage. Kafka's defaults: 11 samples of 1000 ms, per broker."""

    scope: Literal["broker", "cluster"] = "broker"
    samples: Annotated[int, Field(ge=1, le=3600, strict=True)] = 11
    window_ms: Annotated[int, Field(ge=1, le=3_600_000, strict=True)] = 1000


class QuotaTypes(_Model):
    produce: QuotaTypeSettings = QuotaTypeSettings()
    fetch: QuotaTypeSettings = QuotaTypeSettings()
    remote_copy: QuotaTypeSettings = QuotaTypeSettings()
    remote_fetch: QuotaTypeSettings = QuotaTypeSettings()
    leader_replication: QuotaTypeSettings = QuotaTypeSettings()
    follower_replication: QuotaTypeSettings = QuotaTypeSettings()

    def of(self, quota_type: QuotaType) -> QuotaTypeSettings:
        settings: QuotaTypeSettings = getattr(self, quota_type.value)
        return settings


class ClientQuota(_Model):
    """One client quota entity; ``user`` and/or ``client_id``, each a name or ``<default>``."""

    user: EntityName | None = None
    client_id: EntityName | None = None
    producer_byte_rate: ByteRate | None = None
    consumer_byte_rate: ByteRate | None = None
    #: Never throttled (e.g. MirrorMaker): unlimited at this entity's precedence level, so a
    #: more specific entity's quota still wins over it.
    exempt: StrictBool = False

    @model_validator(mode="after")
    def _names_an_entity_and_a_quota(self) -> ClientQuota:
        if self.user is None and self.client_id is None:
            raise ValueError("a client quota needs 'user', 'client_id' or both")
        rates = self.producer_byte_rate is not None or self.consumer_byte_rate is not None
        if self.exempt and rates:
            raise ValueError("an exempt entity takes no producer_byte_rate or consumer_byte_rate")
        if not self.exempt and not rates:
            raise ValueError("sets neither producer_byte_rate nor consumer_byte_rate (nor exempt)")
        return self

    @property
    def entity(self) -> tuple[str | None, str | None]:
        return (self.user, self.client_id)

    def rate_for(self, quota_type: QuotaType) -> float | None:
        """This entity's limit for a client quota type: None when it sets none."""
        if quota_type not in CLIENT_QUOTA_TYPES:
            raise ValueError(f"{quota_type} is not a client quota")
        if self.exempt:
            return math.inf
        if quota_type is QuotaType.PRODUCE:
            return self.producer_byte_rate
        return self.consumer_byte_rate


class BrokerQuotas(_Model):
    """Broker-level quotas, under Kafka's broker config names."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=False)

    remote_copy: ByteRate | None = Field(None, alias="remote.log.manager.copy.max.bytes.per.second")
    remote_fetch: ByteRate | None = Field(
        None, alias="remote.log.manager.fetch.max.bytes.per.second"
    )
    leader_replication: ByteRate | None = Field(None, alias="leader.replication.throttled.rate")
    follower_replication: ByteRate | None = Field(None, alias="follower.replication.throttled.rate")

    def rate_for(self, quota_type: QuotaType) -> float | None:
        rate: float | None = getattr(self, quota_type.value)
        return rate


@dataclass(frozen=True)
class ThrottledReplicas:
    """A topic's ``*.replication.throttled.replicas``: every partition, or (partition, broker)s."""

    every_partition: bool = False
    replicas: frozenset[tuple[int, int]] = frozenset()

    @staticmethod
    def parse(value: object) -> ThrottledReplicas:
        if isinstance(value, ThrottledReplicas):
            return value
        if not isinstance(value, str):
            raise ValueError("must be a string such as '0:101,1:102' or '*'")
        text = value.strip()
        if text == "*":
            return ThrottledReplicas(every_partition=True)
        replicas: set[tuple[int, int]] = set()
        for entry in filter(None, (part.strip() for part in text.split(","))):
            match = re.fullmatch(r"(\d+):(\d+)", entry)
            if match is None:
                raise ValueError(f"entry {entry!r} is not 'partition:broker' (or use '*')")
            replicas.add((int(match.group(1)), int(match.group(2))))
        return ThrottledReplicas(replicas=frozenset(replicas))

    def text(self) -> str:
        """The config value, as ``parse`` reads it (``""`` throttles nothing)."""
        if self.every_partition:
            return "*"
        return ",".join(f"{partition}:{broker}" for partition, broker in sorted(self.replicas))


ReplicaList = Annotated[
    ThrottledReplicas,
    BeforeValidator(ThrottledReplicas.parse),
    PlainSerializer(ThrottledReplicas.text, return_type=str),
]


class TopicThrottles(_Model):
    leader: ReplicaList = Field(ThrottledReplicas(), alias="leader.replication.throttled.replicas")
    follower: ReplicaList = Field(
        ThrottledReplicas(), alias="follower.replication.throttled.replicas"
    )


BrokerKey = int | Literal["<default>"]


class Enforcement(_Model):
    """Switches over all decisions: they are always computed; these say whether they bind."""

    #: Off: every decision is reported as not enforced (KIP-13's global disable).
    enabled: StrictBool = True
    #: Quota types whose decisions are computed and reported but marked not enforced. Written
    #: sorted: equal configurations publish equal documents (a set's order follows the hash seed).
    shadow: Annotated[
        frozenset[QuotaType],
        PlainSerializer(
            lambda types: sorted(quota.value for quota in types), return_type=list[str]
        ),
    ] = frozenset()


class QuotaConfig(_Model):
    """The whole quota configuration."""

    quota_types: QuotaTypes = QuotaTypes()
    enforcement: Enforcement = Enforcement()
    clients: list[ClientQuota] = []
    brokers: dict[BrokerKey, BrokerQuotas] = {}
    topics: dict[str, TopicThrottles] = {}

    @field_validator("brokers", mode="before")
    @classmethod
    def _broker_ids(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        keyed: dict[Any, Any] = {}
        for key, quotas in value.items():
            if key == DEFAULT or (isinstance(key, int) and not isinstance(key, bool) and key >= 0):
                keyed[key] = quotas
            elif isinstance(key, str) and key.isdigit():
                keyed[int(key)] = quotas
            else:
                raise ValueError(f"broker key {key!r} is not a broker id (>= 0) or '<default>'")
        return keyed

    @field_validator("topics")
    @classmethod
    def _topic_names(cls, value: dict[str, TopicThrottles]) -> dict[str, TopicThrottles]:
        for name in value:
            if not TOPIC_NAME.match(name):
                raise ValueError(f"{name!r} is not a legal Kafka topic name")
        return value

    @model_validator(mode="after")
    def _no_conflicts(self) -> QuotaConfig:
        first_index: dict[tuple[str | None, str | None], int] = {}
        for index, quota in enumerate(self.clients):
            if quota.entity in first_index:
                raise ValueError(
                    f"clients[{index}] repeats the entity of clients[{first_index[quota.entity]}] "
                    f"(user={quota.user!r}, client_id={quota.client_id!r})"
                )
            first_index[quota.entity] = index
        for quota_type in QuotaType:
            if quota_type in CLIENT_QUOTA_TYPES:
                continue
            if self.quota_types.of(quota_type).scope != "cluster":
                continue
            overridden = [
                broker
                for broker, quotas in self.brokers.items()
                if broker != DEFAULT and quotas.rate_for(quota_type) is not None
            ]
            if overridden:
                raise ValueError(
                    f"quota_types.{quota_type.value}.scope is 'cluster' (one limit for the whole "
                    f"cluster), so brokers {overridden} cannot override it; set it under "
                    f"brokers.<default>"
                )
        return self


def parse_quota_config(data: dict[str, Any], source: str) -> QuotaConfig:
    try:
        return QuotaConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(source, exc)) from None


def load_quota_config(path: Path) -> QuotaConfig:
    """Read and validate a quota file; :class:`ConfigError` names the file, key and value."""
    return parse_quota_config(read_yaml_mapping(path), str(path))
