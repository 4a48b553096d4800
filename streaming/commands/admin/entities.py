"""The entity a command names (a client, a broker or a topic), its keys and what it sets."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from state.config import DEFAULT, TOPIC_NAME, BrokerKey, BrokerQuotas, QuotaConfig
from state.live_config import BROKER_KEYS, CLIENT_KEYS, TOPIC_KEYS, client_entity_name
from streaming.commands.admin.errors import bad

#: Kafka's limit on quota entity names.
MAX_ENTITY_NAME: Final = 1024
#: Broker ids and partitions are Kafka int32s.
MAX_INT32: Final = 2**31 - 1
LEADER_REPLICAS, FOLLOWER_REPLICAS = TOPIC_KEYS


@dataclass(frozen=True)
class Entity:
    kind: Literal["client", "broker", "topic"]
    user: str | None = None
    client_id: str | None = None
    broker: BrokerKey | None = None
    topic: str | None = None

    @property
    def name(self) -> str:
        if self.kind == "client":
            return client_entity_name(self.user, self.client_id)
        if self.kind == "broker":
            return f"broker {self.broker}"
        return f"topic {self.topic}"

    @property
    def keys(self) -> tuple[str, ...]:
        return {"client": CLIENT_KEYS, "broker": BROKER_KEYS, "topic": TOPIC_KEYS}[self.kind]


def parse_entity(args: argparse.Namespace) -> Entity:
    client = args.user is not None or args.client_id is not None
    chosen = [
        option
        for option, given in (
            ("--user/--client-id", client),
            ("--broker", args.broker is not None),
            ("--topic", args.topic is not None),
        )
        if given
    ]
    if not chosen:
        raise bad("name an entity: --user and/or --client-id, --broker, or --topic")
    if len(chosen) > 1:
        raise bad(f"{' and '.join(chosen)} name different entities: give one of them")
    if client:
        return Entity(
            "client",
            user=checked_entity_name(args.user, "--user"),
            client_id=checked_entity_name(args.client_id, "--client-id"),
        )
    if args.broker is not None:
        return Entity("broker", broker=parse_broker_id(args.broker, "--broker"))
    if not TOPIC_NAME.match(args.topic):
        raise bad(f"--topic {args.topic!r} is not a legal Kafka topic name")
    return Entity("topic", topic=args.topic)


#: ``kafka-configs.sh``'s entity types, and the option each stands for here.
KAFKA_ENTITY_TYPES: Final = {
    "users": "--user",
    "clients": "--client-id",
    "brokers": "--broker",
    "topics": "--topic",
}


def apply_kafka_entity_options(args: argparse.Namespace, pairs: Sequence[tuple[str, str]]) -> None:
    """Sets ``--user``, ``--client-id``, ``--broker`` or ``--topic`` in ``args`` from
    ``kafka-configs.sh``-style options, given in order as (option, value) pairs: each
    ``--entity-type`` is followed by its ``--entity-name NAME`` or ``--entity-default``."""
    entity_type: str | None = None
    for option, value in pairs:
        if option == "--entity-type":
            if entity_type is not None:
                raise bad(f"--entity-type {entity_type} needs --entity-name or --entity-default")
            entity_type = value
            continue
        if entity_type is None:
            raise bad(f"{option} goes after the --entity-type it names")
        ours = KAFKA_ENTITY_TYPES[entity_type]
        attribute = ours.removeprefix("--").replace("-", "_")
        if not hasattr(args, attribute):
            raise bad(f"--entity-type {entity_type}: this command takes no {ours}")
        if getattr(args, attribute) is not None:
            raise bad(f"--entity-type {entity_type} and {ours} name the same thing: give one")
        setattr(args, attribute, DEFAULT if option == "--entity-default" else value)
        entity_type = None
    if entity_type is not None:
        raise bad(f"--entity-type {entity_type} needs --entity-name or --entity-default")


def checked_entity_name(name: str | None, option: str) -> str | None:
    if name is None:
        return None
    if not name:
        raise bad(f"{option} must not be empty (use '{DEFAULT}' for the default entity)")
    if len(name) > MAX_ENTITY_NAME:
        raise bad(
            f"{option} is {len(name)} characters long; entity names are at most {MAX_ENTITY_NAME}"
        )
    return name


def parse_broker_id(text: str, option: str) -> BrokerKey:
    if text.strip() == DEFAULT:
        return DEFAULT
    broker = _non_negative_int32(text)
    if broker is None:
        raise bad(f"{option} {text!r} is not a broker id (an integer >= 0) or '{DEFAULT}'")
    return broker


def parse_partition(text: str, option: str) -> int:
    partition = _non_negative_int32(text)
    if partition is None:
        raise bad(f"{option} {text!r} is not a partition number (an integer >= 0)")
    return partition


def _non_negative_int32(text: str) -> int | None:
    digits = text.strip()
    if digits.isascii() and digits.isdigit() and int(digits) <= MAX_INT32:
        return int(digits)
    return None


def check_known_brokers(
    config: QuotaConfig, brokers: Iterable[BrokerKey], also_known: set[int], allow_new: bool
) -> None:
    """A broker id is known when the configuration has quotas for it (or ``also_known``)."""
    unknown = [
        b for b in brokers if b != DEFAULT and b not in config.brokers and b not in also_known
    ]
    if unknown and not allow_new:
        configured = ", ".join(str(b) for b in config.brokers) or "none"
        listed = ", ".join(str(b) for b in unknown)
        raise bad(
            f"unknown broker {listed}: no quota is configured for it (configured: {configured}); "
            "check the id, or add --new-broker to create its first override"
        )


def configured_values(config: QuotaConfig, entity: Entity) -> dict[str, float | bool | str]:
    """The keys ``entity`` sets in ``config`` (empty: nothing)."""
    if entity.kind == "client":
        for quota in config.clients:
            if quota.entity == (entity.user, entity.client_id):
                return client_values(
                    quota.producer_byte_rate, quota.consumer_byte_rate, quota.exempt
                )
        return {}
    if entity.kind == "broker":
        assert entity.broker is not None
        quotas = config.brokers.get(entity.broker)
        return {} if quotas is None else broker_values(quotas)
    assert entity.topic is not None
    throttles = config.topics.get(entity.topic)
    if throttles is None:
        return {}
    values = {
        LEADER_REPLICAS: throttles.leader.text(),
        FOLLOWER_REPLICAS: throttles.follower.text(),
    }
    return {k: v for k, v in values.items() if v}


def client_values(
    producer: float | None, consumer: float | None, exempt: bool
) -> dict[str, float | bool | str]:
    values: dict[str, float | bool | str] = {}
    if producer is not None:
        values["producer_byte_rate"] = producer
    if consumer is not None:
        values["consumer_byte_rate"] = consumer
    if exempt:
        values["exempt"] = True
    return values


def broker_values(quotas: BrokerQuotas) -> dict[str, float | bool | str]:
    dumped: dict[str, float] = quotas.model_dump(by_alias=True, exclude_none=True)
    return dict(dumped)


def split_settings(argument: str) -> list[str]:
    """The ``KEY=VALUE`` settings in one argument, in ``kafka-configs.sh --add-config``'s
    dialect: ``k1=v1,k2=v2``, a list value in brackets (``k=[0:1,1:2]``) or, as
    ``kafka-configs.sh`` also reads it, bare (``k=0:1,1:2``: a part without ``=`` continues the
    value before it)."""
    settings: list[str] = []
    depth = 0
    part = ""
    for char in argument:
        depth += (char == "[") - (char == "]")
        if char == "," and depth == 0:
            settings.append(part)
            part = ""
        else:
            part += char
    settings.append(part)
    joined: list[str] = []
    for setting in settings:
        if joined and "=" not in setting:
            joined[-1] += "," + setting
        else:
            joined.append(setting)
    return [_unbracketed(setting) for setting in joined]


def _unbracketed(setting: str) -> str:
    key, equals, value = setting.partition("=")
    value = value.strip()
    if equals and value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    return f"{key}{equals}{value}"


def parse_settings(entity: Entity, arguments: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` settings (several to an argument in Kafka's dialect: :func:`split_settings`),
    each key one that ``entity`` has; the values unchecked."""
    parsed: dict[str, str] = {}
    for setting in (setting for argument in arguments for setting in split_settings(argument)):
        key, equals, value = setting.partition("=")
        key = key.strip()
        if not equals or not key:
            raise bad(f"{setting!r} is not KEY=VALUE")
        if key in parsed:
            raise bad(f"{key} is given twice")
        if key not in entity.keys:
            raise bad(wrong_key_message(key, entity))
        parsed[key] = value.strip()
    return parsed


def wrong_key_message(key: str, entity: Entity) -> str:
    """Why ``key`` is not one of ``entity``'s: the entity it belongs to, or the keys there are."""
    for kind, keys, option in (
        ("client", CLIENT_KEYS, "--user/--client-id"),
        ("broker", BROKER_KEYS, "--broker"),
        ("topic", TOPIC_KEYS, "--topic"),
    ):
        if key in keys and kind != entity.kind:
            return f"{key} is a {kind} key: it needs {option}, not {entity.name}"
    return f"unknown key {key!r} for {entity.name} (one of {', '.join(entity.keys)})"
