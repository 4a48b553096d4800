"""``quotastream quota | enforcement | replication | lookup``: the operator's commands.

In the spirit of ``kafka-configs.sh``: each change names one entity and the keys it sets or
removes, is validated against the current live configuration, and only then is appended to the
configuration log (``streaming.config_log``), where the running engine picks it up. Reading
commands show the live configuration at its newest version. ``docs/operations.md`` is the guide.

Exit codes: 0 done; 1 Kafka or Redis unreachable; 2 bad input or configuration (nothing written).
"""

from __future__ import annotations

import argparse
import getpass
import json
import math
import socket
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias

import numpy as np

from quotastream.keys import decision_key
from state.config import (
    DEFAULT,
    TOPIC_NAME,
    BrokerKey,
    BrokerQuotas,
    QuotaConfig,
    ThrottledReplicas,
    load_quota_config,
)
from state.configfile import ConfigError
from state.live_config import (
    BROKER_KEYS,
    CLIENT_KEYS,
    TOPIC_KEYS,
    Change,
    DeleteClientQuota,
    LiveConfig,
    SetBrokerQuota,
    SetClientQuota,
    SetEnforcement,
    SetTopicThrottles,
    apply_change,
    client_entity_name,
    decision_mode,
    decode_change,
    describe_change,
)
from state.quota_types import CLIENT_QUOTA_TYPES, QuotaType
from state.replication_plan import MoveEstimate, ThrottleBound, estimate_move, throttle_bound
from state.resolution import LEVELS, NO_LEVEL, SHARING_BY_LEVEL, ClientPairs, QuotaResolver
from streaming.settings import EngineSettings, load_engine_settings

if TYPE_CHECKING:
    from quotastream.client import Decision, QuotaClient
    from streaming.config_log import ConfigLog

ADMIN_COMMANDS: Final = frozenset({"quota", "enforcement", "replication", "lookup"})

EXIT_OK: Final = 0
EXIT_UNREACHABLE: Final = 1
EXIT_BAD_INPUT: Final = 2

#: Kafka's limit on quota entity names.
MAX_ENTITY_NAME: Final = 1024
#: Broker ids are Kafka int32s.
MAX_BROKER_ID: Final = 2**31 - 1
BROKER_QUOTA_TYPES: Final = tuple(q for q in QuotaType if q not in CLIENT_QUOTA_TYPES)
LEADER_RATE: Final = "leader.replication.throttled.rate"
FOLLOWER_RATE: Final = "follower.replication.throttled.rate"
LEADER_REPLICAS, FOLLOWER_REPLICAS = TOPIC_KEYS


class AdminError(Exception):
    """A refused command: its exit code and the message for ``quotastream: error: ...``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _bad(message: str) -> AdminError:
    return AdminError(EXIT_BAD_INPUT, message)


# ----------------------------------------------------------------------------------------- parser
Handler = Callable[["_Admin"], int]


def add_admin_commands(commands: Commands) -> None:
    """Registers ``quota``, ``enforcement``, ``replication`` and ``lookup`` under ``commands``."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--engine-config",
        type=Path,
        help="engine settings YAML: Kafka, the config topic, Redis and the quota file "
        "(QUOTASTREAM_* variables override it)",
    )
    common.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long to wait for Kafka and Redis (default 10)",
    )
    writer = argparse.ArgumentParser(add_help=False)
    writer.add_argument(
        "--by", metavar="WHO", help="recorded with the change (default: $USER@hostname)"
    )
    writer.add_argument(
        "--dry-run", action="store_true", help="validate and show the change; write nothing"
    )
    entity = argparse.ArgumentParser(add_help=False)
    entity.add_argument("--user", help="a user name or '<default>'")
    entity.add_argument("--client-id", help="a client-id or '<default>'")
    entity.add_argument("--broker", help="a broker id or '<default>' (broker quotas)")
    entity.add_argument("--topic", help="a topic (its throttled-replica lists)")
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON")
    parents = _Parents(common, writer, entity, as_json)
    _add_quota(commands, parents)
    _add_enforcement(commands, parents)
    _add_replication(commands, parents)
    _add_lookup(commands, parents)


@dataclass(frozen=True)
class _Parents:
    """Option groups shared by the commands."""

    common: argparse.ArgumentParser  # --engine-config, --timeout
    writer: argparse.ArgumentParser  # --by, --dry-run
    entity: argparse.ArgumentParser  # --user, --client-id, --broker, --topic
    as_json: argparse.ArgumentParser  # --json


Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _add_quota(commands: Commands, p: _Parents) -> None:
    common, writer, entity, as_json = p.common, p.writer, p.entity, p.as_json
    quota = commands.add_parser(
        "quota",
        help="set, show and remove quotas in the live configuration",
        description="The live configuration: the quota file plus the changes in the config "
        "topic. Changes are validated before they are written and reach the running engine "
        "within a trigger interval.",
    )
    actions = quota.add_subparsers(dest="action", required=True, metavar="ACTION")
    set_quota = actions.add_parser(
        "set",
        parents=[common, writer, entity],
        help="set keys of one entity",
        description="Client keys: producer_byte_rate, consumer_byte_rate (bytes/s, > 0), "
        "exempt=true|false. Broker keys: "
        + ", ".join(BROKER_KEYS)
        + ". Topic keys: "
        + ", ".join(TOPIC_KEYS)
        + " ('partition:broker,...' or '*').",
    )
    set_quota.add_argument("settings", nargs="+", metavar="KEY=VALUE")
    set_quota.add_argument(
        "--new-broker",
        action="store_true",
        help="allow a broker id that has no quota configured yet (guards against typos)",
    )
    set_quota.set_defaults(admin=_quota_set)
    get_quota = actions.add_parser(
        "get", parents=[common, entity, as_json], help="the keys one entity sets"
    )
    get_quota.set_defaults(admin=_quota_get)
    delete_quota = actions.add_parser(
        "delete",
        parents=[common, writer, entity],
        help="remove keys of one entity (all of them when none is named)",
    )
    delete_quota.add_argument("keys", nargs="*", metavar="KEY")
    delete_quota.set_defaults(admin=_quota_delete)
    list_quotas = actions.add_parser(
        "list", parents=[common, as_json], help="every configured entity and switch"
    )
    list_quotas.set_defaults(admin=_quota_list)
    describe = actions.add_parser(
        "describe",
        parents=[common, as_json],
        help="the quotas that apply to a client and/or a broker, and where they come from",
    )
    describe.add_argument("--user", help="the client's user")
    describe.add_argument("--client-id", help="the client's client-id")
    describe.add_argument("--broker", help="a broker id: its broker quotas")
    describe.set_defaults(admin=_quota_describe)
    history = actions.add_parser(
        "history", parents=[common, as_json], help="the changes in the config topic"
    )
    history.add_argument("--last", type=int, metavar="N", help="only the newest N changes")
    history.set_defaults(admin=_quota_history)


def _add_enforcement(commands: Commands, p: _Parents) -> None:
    common, writer, as_json = p.common, p.writer, p.as_json
    enforcement = commands.add_parser(
        "enforcement",
        help="the global enforcement switch and per-quota shadow mode",
        description="Decisions are always computed. Disabled: none binds. Shadow: the quota "
        "type's decisions are reported but never bind.",
    )
    switches = enforcement.add_subparsers(dest="action", required=True, metavar="ACTION")
    switches.add_parser(
        "status", parents=[common, as_json], help="the switches and each quota type's mode"
    ).set_defaults(admin=_enforcement_status)
    switches.add_parser(
        "enable", parents=[common, writer], help="decisions bind again"
    ).set_defaults(admin=_enforcement_switch, enable=True)
    switches.add_parser(
        "disable", parents=[common, writer], help="no decision binds (a global kill switch)"
    ).set_defaults(admin=_enforcement_switch, enable=False)
    for name, on in (("shadow", True), ("unshadow", False)):
        shadow = switches.add_parser(
            name,
            parents=[common, writer],
            help=f"{'put' if on else 'take'} quota types {'in' if on else 'out of'} shadow mode",
        )
        shadow.add_argument(
            "quota_types", nargs="+", metavar="QUOTA_TYPE", help=", ".join(QuotaType)
        )
        shadow.set_defaults(admin=_enforcement_shadow, shadow_on=on)


def _add_replication(commands: Commands, p: _Parents) -> None:
    replication = commands.add_parser(
        "replication", help="replication throttles for a reassignment (KIP-73)"
    )
    replication_actions = replication.add_subparsers(dest="action", required=True, metavar="ACTION")
    throttle = replication_actions.add_parser(
        "throttle",
        parents=[p.common, p.writer],
        help="throttle a topic's moving replicas, with KIP-73's MoveTime estimate",
        description="Sets the topic's throttled-replica lists (one change) and the leader and "
        "follower throttled rate on each broker (one change per broker), or removes them with "
        "--remove. Prints KIP-73's MoveRatio and MoveTime and checks IN < T < N - IN/R.",
    )
    throttle.add_argument("--topic", required=True)
    throttle.add_argument("--leader-replicas", metavar="P:B,...", help="or '*'")
    throttle.add_argument("--follower-replicas", metavar="P:B,...", help="or '*'")
    throttle.add_argument("--rate", metavar="B/s", help="leader and follower throttled rate")
    throttle.add_argument(
        "--brokers", metavar="ID,...", help="brokers to set the rate on (default: <default>)"
    )
    throttle.add_argument(
        "--new-broker",
        action="store_true",
        help="allow --brokers ids that neither have a quota nor appear in the replica lists",
    )
    throttle.add_argument("--partitions-moved", metavar="N")
    throttle.add_argument("--total-partitions", metavar="M")
    throttle.add_argument("--log-size-per-broker", metavar="BYTES")
    throttle.add_argument(
        "--broker-count",
        metavar="N",
        help="#Brokers in the MoveTime formula (default: how many --brokers)",
    )
    throttle.add_argument("--max-bytes-in", metavar="B/s", help="max(BytesInPerSec) per broker")
    throttle.add_argument("--network", metavar="B/s", help="network throughput per broker")
    throttle.add_argument("--replication-factor", metavar="R")
    throttle.add_argument(
        "--remove", action="store_true", help="clear the topic's lists and the brokers' rates"
    )
    throttle.set_defaults(admin=_replication_throttle)


def _add_lookup(commands: Commands, p: _Parents) -> None:
    lookup = commands.add_parser(
        "lookup",
        parents=[p.common, p.as_json],
        help="the decision an enforcement agent reads from Redis",
        description="Either --user, --client-id and --broker (a produce or fetch client, "
        "resolved to its usage counter with the live configuration), or --entity KEY.",
    )
    lookup.add_argument("--quota", required=True, help=", ".join(QuotaType))
    lookup.add_argument("--user")
    lookup.add_argument("--client-id")
    lookup.add_argument("--broker")
    lookup.add_argument("--entity", metavar="KEY", help="e.g. user=alice,broker=1 or broker=3")
    lookup.set_defaults(admin=_lookup)


def run_admin(args: argparse.Namespace) -> int:
    """Runs the admin command ``args`` names; prints errors and returns the exit code."""
    # Loaded here, not with the module: ``replay`` and ``run`` need neither client.
    import redis  # noqa: PLC0415
    from kafka.errors import KafkaError  # noqa: PLC0415

    from streaming.config_log import ConfigLogError  # noqa: PLC0415

    handler: Handler = args.admin
    admin: _Admin | None = None
    try:
        if args.timeout <= 0:
            raise _bad(f"--timeout must be > 0, got {args.timeout:g}")
        admin = _Admin.load(args)
        return handler(admin)
    except AdminError as exc:
        return _fail(exc.code, exc.message, admin)
    except ConfigError as exc:
        return _fail(EXIT_BAD_INPUT, str(exc), admin)
    except (KafkaError, ConfigLogError) as exc:
        assert admin is not None
        where = admin.settings.kafka.bootstrap_servers
        return _fail(EXIT_UNREACHABLE, f"Kafka at {where}: {exc}", admin)
    except redis.RedisError as exc:
        assert admin is not None
        where = f"{admin.settings.redis.host}:{admin.settings.redis.port}"
        return _fail(EXIT_UNREACHABLE, f"Redis at {where}: {exc}", admin)
    finally:
        if admin is not None:
            admin.close()


def _fail(code: int, message: str, admin: _Admin | None) -> int:
    if admin is not None:
        message = admin.scrub(message)
    print(f"quotastream: error: {message}", file=sys.stderr)
    return code


def _warn(message: str) -> None:
    print(f"quotastream: WARNING: {message}", file=sys.stderr)


# ---------------------------------------------------------------------------------------- context
@dataclass
class _Admin:
    """One command's settings, base configuration and connection to the configuration log."""

    args: argparse.Namespace
    settings: EngineSettings
    base: QuotaConfig
    timeout_ms: int
    _log: ConfigLog | None = field(default=None, repr=False)

    @staticmethod
    def load(args: argparse.Namespace) -> _Admin:
        settings = load_engine_settings(args.engine_config)
        base = load_quota_config(Path(settings.quotas))
        return _Admin(args, settings, base, max(int(args.timeout * 1000), 1))

    @property
    def log(self) -> ConfigLog | None:
        """The configuration log; None when ``kafka.config_topic`` is null (no live changes)."""
        kafka = self.settings.kafka
        if kafka.config_topic is None:
            return None
        if self._log is None:
            from streaming.config_log import ConfigLog  # noqa: PLC0415

            client = {**kafka.client_settings(), "bootstrap_timeout_ms": self.timeout_ms}
            self._log = ConfigLog(
                kafka.bootstrap_servers, kafka.config_topic, client, timeout_ms=self.timeout_ms
            )
        return self._log

    def live(self) -> LiveConfig:
        """The newest version of the live configuration."""
        return self.log.current(self.base) if self.log is not None else LiveConfig(0, self.base)

    def write(self, live: LiveConfig, changes: Sequence[Change]) -> list[int]:
        """Validates ``changes`` in order over ``live``, then appends them; their versions.

        Nothing is written when one of them is invalid. Prints one line per change.
        """
        config = live.config
        for change in changes:
            try:
                config = apply_change(config, change)
            except ConfigError as exc:
                raise _bad(f"refused, nothing written: {exc}") from None
        if self.args.dry_run:
            for change in changes:
                print(f"dry run, not written: {describe_change(change)}")
            return []
        log = self.log
        if log is None:
            raise _bad(
                "kafka.config_topic is null in the engine settings: there is no live "
                f"configuration to change; edit the quota file ({self.settings.quotas}) instead"
            )
        log.ensure_topic()
        versions = []
        for change in changes:
            # Printed as each is written: if Kafka fails halfway, the output says what was.
            versions.append(log.append(change))
            print(f"version {versions[-1]}: {describe_change(change)}", flush=True)
        # Another operator may have appended in between: check that ours still applied.
        after = live.advanced(log.read(live.version, versions[-1]))
        skipped = {s.version: s.reason for s in after.skipped}
        refused = [f"version {v} is skipped: {skipped[v]}" for v in versions if v in skipped]
        if refused:
            raise _bad(
                "written, but a change made concurrently makes it invalid: " + "; ".join(refused)
            )
        return versions

    def stamp(self) -> dict[str, Any]:
        """``at_ms`` and ``by`` for a change."""
        by = self.args.by if self.args.by else _default_author()
        return {"at_ms": int(time.time() * 1000), "by": by}

    def scrub(self, message: str) -> str:
        """``message`` without any secret of the settings in it."""
        secrets = [str(v) for v in self.settings.kafka.client_settings().values()]
        if self.settings.redis.password is not None:
            secrets.append(self.settings.redis.password.get_secret_value())
        for secret in sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True):
            message = message.replace(secret, "***")
        return message

    def redis_client(self, config: QuotaConfig | None) -> QuotaClient:
        import redis  # noqa: PLC0415
        from redis.backoff import NoBackoff  # noqa: PLC0415
        from redis.retry import Retry  # noqa: PLC0415

        from quotastream.client import QuotaClient  # noqa: PLC0415

        settings = self.settings.redis
        password = settings.password.get_secret_value() if settings.password else None
        timeout = self.timeout_ms / 1000
        client = redis.Redis(
            host=settings.host,
            port=settings.port,
            password=password,
            ssl=settings.ssl,
            socket_connect_timeout=timeout,
            socket_timeout=timeout,
            # One attempt: --timeout bounds the wait, not redis-py's backoff (up to 10 s).
            retry=Retry(NoBackoff(), 0),
        )
        return QuotaClient(client, settings.key_prefix, config)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()


def _default_author() -> str:
    try:
        user = getpass.getuser()
    except (OSError, KeyError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


# ----------------------------------------------------------------------------------------- entity
@dataclass(frozen=True)
class _Entity:
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


def _entity(args: argparse.Namespace) -> _Entity:
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
        raise _bad("name an entity: --user and/or --client-id, --broker, or --topic")
    if len(chosen) > 1:
        raise _bad(f"{' and '.join(chosen)} name different entities: give one of them")
    if client:
        return _Entity(
            "client",
            user=_entity_name(args.user, "--user"),
            client_id=_entity_name(args.client_id, "--client-id"),
        )
    if args.broker is not None:
        return _Entity("broker", broker=_broker_id(args.broker, "--broker"))
    if not TOPIC_NAME.match(args.topic):
        raise _bad(f"--topic {args.topic!r} is not a legal Kafka topic name")
    return _Entity("topic", topic=args.topic)


def _entity_name(name: str | None, option: str) -> str | None:
    if name is None:
        return None
    if not name:
        raise _bad(f"{option} must not be empty (use '{DEFAULT}' for the default entity)")
    if len(name) > MAX_ENTITY_NAME:
        raise _bad(
            f"{option} is {len(name)} characters long; entity names are at most {MAX_ENTITY_NAME}"
        )
    return name


def _broker_id(text: str, option: str) -> BrokerKey:
    if text.strip() == DEFAULT:
        return DEFAULT
    if text.strip().isascii() and text.strip().isdigit() and int(text) <= MAX_BROKER_ID:
        return int(text.strip())
    raise _bad(f"{option} {text!r} is not a broker id (an integer >= 0) or '{DEFAULT}'")


def _check_known_brokers(
    config: QuotaConfig, brokers: Iterable[BrokerKey], also_known: set[int], allow_new: bool
) -> None:
    """A broker id is known when the configuration has quotas for it (or ``also_known``)."""
    unknown = [
        b for b in brokers if b != DEFAULT and b not in config.brokers and b not in also_known
    ]
    if unknown and not allow_new:
        configured = ", ".join(str(b) for b in config.brokers) or "none"
        listed = ", ".join(str(b) for b in unknown)
        raise _bad(
            f"unknown broker {listed}: no quota is configured for it (configured: {configured}); "
            "check the id, or add --new-broker to create its first override"
        )


def _configured(config: QuotaConfig, entity: _Entity) -> dict[str, float | bool | str]:
    """The keys ``entity`` sets in ``config`` (empty: nothing)."""
    if entity.kind == "client":
        for quota in config.clients:
            if quota.entity == (entity.user, entity.client_id):
                return _client_values(
                    quota.producer_byte_rate, quota.consumer_byte_rate, quota.exempt
                )
        return {}
    if entity.kind == "broker":
        assert entity.broker is not None
        quotas = config.brokers.get(entity.broker)
        return {} if quotas is None else _broker_values(quotas)
    assert entity.topic is not None
    throttles = config.topics.get(entity.topic)
    if throttles is None:
        return {}
    values = {
        LEADER_REPLICAS: throttles.leader.text(),
        FOLLOWER_REPLICAS: throttles.follower.text(),
    }
    return {k: v for k, v in values.items() if v}


def _client_values(
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


def _broker_values(quotas: BrokerQuotas) -> dict[str, float | bool | str]:
    dumped: dict[str, float] = quotas.model_dump(by_alias=True, exclude_none=True)
    return dict(dumped)


# ------------------------------------------------------------------------------------- set/delete
def _parse_settings(entity: _Entity, settings: Sequence[str]) -> dict[str, str]:
    parsed: dict[str, str] = {}
    for setting in settings:
        key, equals, value = setting.partition("=")
        key = key.strip()
        if not equals or not key:
            raise _bad(f"{setting!r} is not KEY=VALUE")
        if key in parsed:
            raise _bad(f"{key} is given twice")
        if key not in entity.keys:
            raise _bad(_wrong_key(key, entity))
        parsed[key] = value.strip()
    return parsed


def _wrong_key(key: str, entity: _Entity) -> str:
    for kind, keys, option in (
        ("client", CLIENT_KEYS, "--user/--client-id"),
        ("broker", BROKER_KEYS, "--broker"),
        ("topic", TOPIC_KEYS, "--topic"),
    ):
        if key in keys and kind != entity.kind:
            return f"{key} is a {kind} key: it needs {option}, not {entity.name}"
    return f"unknown key {key!r} for {entity.name} (one of {', '.join(entity.keys)})"


def _rate(key: str, text: str) -> float:
    value = _finite(text, key, " (bytes per second)")
    if value <= 0:
        raise _bad(
            f"{key}={text}: must be > 0 (an unset quota is unlimited: 'quota delete' removes one)"
        )
    return value


def _flag(key: str, text: str) -> bool:
    if text.lower() in {"true", "false"}:
        return text.lower() == "true"
    raise _bad(f"{key}={text!r}: must be true or false")


def _quota_set(admin: _Admin) -> int:
    args = admin.args
    entity = _entity(args)
    values = _parse_settings(entity, args.settings)
    if args.new_broker and entity.kind != "broker":
        raise _bad("--new-broker goes with --broker")
    # Every value is checked before Kafka is asked anything.
    change: Change
    if entity.kind == "client":
        change = SetClientQuota(
            user=entity.user,
            client_id=entity.client_id,
            values={k: _flag(k, v) if k == "exempt" else _rate(k, v) for k, v in values.items()},
            **admin.stamp(),
        )
    elif entity.kind == "broker":
        assert entity.broker is not None
        change = SetBrokerQuota(
            broker=entity.broker,
            values={k: _rate(k, v) for k, v in values.items()},
            **admin.stamp(),
        )
    else:
        assert entity.topic is not None
        for key, value in values.items():
            if not value:
                raise _bad(
                    f"{key} is empty: 'quota delete --topic {entity.topic} {key}' removes it"
                )
        change = SetTopicThrottles(topic=entity.topic, values=values, **admin.stamp())
    live = admin.live()
    if entity.broker is not None:
        _check_known_brokers(live.config, [entity.broker], set(), args.new_broker)
    admin.write(live, [change])
    return EXIT_OK


def _quota_delete(admin: _Admin) -> int:
    args = admin.args
    entity = _entity(args)
    for key in args.keys:
        if key not in entity.keys:
            raise _bad(_wrong_key(key, entity))
    keys = list(dict.fromkeys(args.keys))
    live = admin.live()
    current = _configured(live.config, entity)
    if not current:
        raise _bad(f"nothing to delete: no quota is set for {entity.name} (version {live.version})")
    missing = [k for k in keys if k not in current]
    if missing:
        raise _bad(
            f"nothing to delete: {entity.name} does not set {', '.join(missing)} "
            f"(it sets {', '.join(current)})"
        )
    change: Change
    if entity.kind == "client":
        change = DeleteClientQuota(
            user=entity.user, client_id=entity.client_id, keys=keys or None, **admin.stamp()
        )
    elif entity.kind == "broker":
        assert entity.broker is not None
        removed: dict[str, float | None] = dict.fromkeys(keys or current)
        change = SetBrokerQuota(broker=entity.broker, values=removed, **admin.stamp())
    else:
        assert entity.topic is not None
        cleared = dict.fromkeys(keys or current, "")
        change = SetTopicThrottles(topic=entity.topic, values=cleared, **admin.stamp())
    admin.write(live, [change])
    return EXIT_OK


# --------------------------------------------------------------------------------------- reading
def _quota_get(admin: _Admin) -> int:
    entity = _entity(admin.args)
    live = admin.live()
    values = _configured(live.config, entity)
    if admin.args.json:
        _print_json({"version": live.version, "entity": entity.name, "values": values})
        return EXIT_OK
    if not values:
        print(f"no quota is set for {entity.name} (version {live.version})")
        return EXIT_OK
    print(f"{entity.name} (version {live.version})")
    for key, value in values.items():
        print(f"  {key}={_text(value)}")
    return EXIT_OK


def _quota_list(admin: _Admin) -> int:
    live = admin.live()
    config = live.config
    clients: list[dict[str, Any]] = [
        {
            "user": q.user,
            "client_id": q.client_id,
            "entity": client_entity_name(q.user, q.client_id),
            **_client_values(q.producer_byte_rate, q.consumer_byte_rate, q.exempt),
        }
        for q in config.clients
    ]
    brokers = {str(b): _broker_values(q) for b, q in config.brokers.items()}
    topics = {name: _configured(config, _Entity("topic", topic=name)) for name in config.topics}
    shadowed = sorted(q.value for q in config.enforcement.shadow)
    enforcement = {"enabled": config.enforcement.enabled, "shadow": shadowed}
    skipped = [{"version": s.version, "reason": s.reason} for s in live.skipped]
    if admin.args.json:
        _print_json(
            {
                "version": live.version,
                "clients": clients,
                "brokers": brokers,
                "topics": topics,
                "enforcement": enforcement,
                "skipped": skipped,
            }
        )
        return EXIT_OK
    source = admin.settings.kafka.config_topic or "no config topic"
    print(f"version {live.version} ({admin.settings.quotas} + {live.version} changes, {source})")
    sections: list[tuple[str, list[tuple[str, dict[str, Any]]]]] = [
        (
            "clients",
            [(c["entity"], {k: v for k, v in c.items() if k in CLIENT_KEYS}) for c in clients],
        ),
        ("brokers", [(f"broker {b}", values) for b, values in brokers.items()]),
        ("topics", [(f"topic {t}", values) for t, values in topics.items()]),
    ]
    for title, entries in sections:
        print(f"{title}:" + ("" if entries else " (none)"))
        width = max((len(name) for name, _ in entries), default=0)
        for name, values in entries:
            settings = " ".join(f"{k}={_text(v)}" for k, v in values.items())
            print(f"  {name:<{width}}  {settings}")
    shadow = ", ".join(shadowed) or "none"
    print(
        f"enforcement: {'enabled' if config.enforcement.enabled else 'DISABLED'}; shadow: {shadow}"
    )
    for s in live.skipped:
        print(f"skipped: version {s.version}: {s.reason}")
    return EXIT_OK


def _quota_history(admin: _Admin) -> int:
    log = admin.log
    if log is None:
        raise _bad("kafka.config_topic is null in the engine settings: there is no change log")
    end = log.end()
    last = admin.args.last
    if last is not None and last < 1:
        raise _bad(f"--last must be >= 1, got {last}")
    records = log.read(0, end)
    skipped = {s.version: s.reason for s in LiveConfig(0, admin.base).advanced(records).skipped}
    entries: list[dict[str, Any]] = []
    for version, record in enumerate(records, start=1):
        try:
            change = decode_change(record)
            at_ms, by, text = change.at_ms, change.by, describe_change(change)
        except ConfigError as exc:
            at_ms, by, text = 0, "", str(exc)
        entries.append(
            {
                "version": version,
                "at_ms": at_ms,
                "by": by,
                "change": text,
                "skipped": skipped.get(version),
            }
        )
    if last is not None:
        entries = entries[-last:]
    if admin.args.json:
        _print_json(entries)
        return EXIT_OK
    if not entries:
        print(f"no changes in {log.topic}: the quota file is the live configuration (version 0)")
    for entry in entries:
        at = (
            datetime.fromtimestamp(entry["at_ms"] / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            if entry["at_ms"]
            else "-"
        )
        note = f"  (SKIPPED: {entry['skipped']})" if entry["skipped"] else ""
        print(f"{entry['version']:>6}  {at}  {entry['by'] or '-'}  {entry['change']}{note}")
    return EXIT_OK


def _level_entity(number: int, user: str, client_id: str) -> str:
    level = LEVELS[number - 1]
    names = {"name": (user, client_id), "default": (DEFAULT, DEFAULT), "none": (None, None)}
    return client_entity_name(names[level.user][0], names[level.client][1])


_SHARING_TEXT: Final = {
    1: "one counter per (user, client-id)",
    2: "one counter per user: all its client-ids share it",
    3: "one counter per client-id: all users with it share it",
}


def _quota_describe(admin: _Admin) -> int:
    args = admin.args
    if args.user is None and args.client_id is None and args.broker is None:
        raise _bad("describe what: --user and --client-id (a client) and/or --broker N")
    if (args.user is None) != (args.client_id is None):
        raise _bad("a client is a (user, client-id) pair: give both --user and --client-id")
    broker = _broker_id(args.broker, "--broker") if args.broker is not None else None
    if broker == DEFAULT:
        raise _bad("--broker needs a broker id: describe tells whether it has an override")
    assert broker is None or isinstance(broker, int)
    if args.user is not None:
        _entity_name(args.user, "--user")
    live = admin.live()
    result: dict[str, Any] = {"version": live.version}
    if args.user is not None:
        result["client"] = _describe_client(live.config, args.user, args.client_id, broker)
    if broker is not None:
        result["broker"] = _describe_broker(live.config, broker)
    if args.json:
        _print_json(result)
        return EXIT_OK
    if "client" in result:
        print(f"user={args.user}, client-id={args.client_id} (version {live.version})")
        for quota, found in result["client"]["quotas"].items():
            print(f"  {quota}: {_client_line(found)}")
    if broker is not None:
        print(f"broker {broker} (version {live.version})")
        for quota, found in result["broker"]["quotas"].items():
            print(f"  {quota} ({found['key']}): {_broker_line(found, broker)}")
    return EXIT_OK


def _client_line(found: dict[str, Any]) -> str:
    if found["exempt"]:
        limit = "unlimited (exempt)"
    else:
        limit = "unlimited" if found["limit"] is None else f"{_text(found['limit'])} B/s"
    source = f"level {found['level']} ({found['from']})" if found["level"] else "no level sets it"
    exempt = "yes" if found["exempt"] else "no"
    return (
        f"{limit}, {source}, exempt: {exempt}, mode: {found['mode']}, "
        f"counter: {found['counter']} ({found['sharing']})"
    )


def _broker_line(found: dict[str, Any], broker: int) -> str:
    limit = "unlimited" if found["limit"] is None else f"{_text(found['limit'])} B/s"
    sources = {
        "override": f" from broker {broker}'s override",
        "default": f" from {DEFAULT}",
        None: " (not set)",
    }
    scope = " (scope cluster: one limit for all brokers)" if found["cluster"] else ""
    return f"{limit}{sources[found['from']]}{scope}, mode: {found['mode']}"


def _describe_client(
    config: QuotaConfig, user: str, client_id: str, broker: int | None
) -> dict[str, Any]:
    from state.entities import client_keys  # noqa: PLC0415 - pyarrow.compute, for this only

    pairs = ClientPairs(
        users=np.array([user], dtype=object),
        clients=np.array([client_id], dtype=object),
        user_of_pair=np.zeros(1, dtype=np.int64),
        client_of_pair=np.zeros(1, dtype=np.int64),
    )
    resolver = QuotaResolver(config)
    quotas: dict[str, Any] = {}
    for quota_type in CLIENT_QUOTA_TYPES:
        resolution = resolver.client(quota_type, pairs)
        level, limit = int(resolution.level[0]), float(resolution.limit[0])
        exempt = level != NO_LEVEL and math.isinf(limit)
        cluster = config.quota_types.of(quota_type).scope == "cluster"
        counter = client_keys(
            SHARING_BY_LEVEL[resolution.level],
            pairs.users,
            pairs.clients,
            None if cluster or broker is None else np.array([broker], dtype=np.int64),
        )[0]
        if broker is None and not cluster:
            counter += ",broker=N"
        quotas[quota_type.value] = {
            "limit": None if math.isinf(limit) else limit,
            "level": level,
            "from": _level_entity(level, user, client_id) if level != NO_LEVEL else None,
            "exempt": exempt,
            "mode": decision_mode(config, quota_type, exempt).value,
            "counter": str(counter),
            "sharing": _SHARING_TEXT[int(SHARING_BY_LEVEL[level])],
        }
    return {"user": user, "client_id": client_id, "quotas": quotas}


def _describe_broker(config: QuotaConfig, broker: int) -> dict[str, Any]:
    override, default = config.brokers.get(broker), config.brokers.get(DEFAULT)
    quotas: dict[str, Any] = {}
    for quota_type in BROKER_QUOTA_TYPES:
        own = override.rate_for(quota_type) if override is not None else None
        fallback = default.rate_for(quota_type) if default is not None else None
        source = "override" if own is not None else "default" if fallback is not None else None
        quotas[quota_type.value] = {
            "key": BrokerQuotas.model_fields[quota_type.value].alias,
            "limit": own if own is not None else fallback,
            "from": source,
            "cluster": config.quota_types.of(quota_type).scope == "cluster",
            "mode": decision_mode(config, quota_type, exempt=False).value,
        }
    return {"broker": broker, "has_override": override is not None, "quotas": quotas}


# ------------------------------------------------------------------------------------ enforcement
def _parse_quota_type(text: str) -> QuotaType:
    try:
        return QuotaType(text)
    except ValueError:
        raise _bad(
            f"unknown quota type {text!r} (one of {', '.join(q.value for q in QuotaType)})"
        ) from None


def _enforcement_status(admin: _Admin) -> int:
    live = admin.live()
    enforcement = live.config.enforcement
    modes = {q.value: decision_mode(live.config, q, exempt=False).value for q in QuotaType}
    if admin.args.json:
        _print_json(
            {
                "version": live.version,
                "enabled": enforcement.enabled,
                "shadow": sorted(q.value for q in enforcement.shadow),
                "modes": modes,
            }
        )
        return EXIT_OK
    state = "enabled" if enforcement.enabled else "DISABLED (no decision binds)"
    print(f"enforcement: {state} (version {live.version})")
    for quota, mode in modes.items():
        note = (
            " (shadow once enabled)"
            if not enforcement.enabled and QuotaType(quota) in enforcement.shadow
            else ""
        )
        print(f"  {quota}: {mode}{note}")
    return EXIT_OK


def _enforcement_switch(admin: _Admin) -> int:
    enable: bool = admin.args.enable
    live = admin.live()
    if live.config.enforcement.enabled == enable:
        state = "enabled" if enable else "disabled"
        print(f"enforcement is already {state} (version {live.version}); nothing written")
        return EXIT_OK
    admin.write(live, [SetEnforcement(enabled=enable, **admin.stamp())])
    return EXIT_OK


def _enforcement_shadow(admin: _Admin) -> int:
    on: bool = admin.args.shadow_on
    quota_types = list(dict.fromkeys(_parse_quota_type(t) for t in admin.args.quota_types))
    live = admin.live()
    shadowed = live.config.enforcement.shadow
    to_change = [q for q in quota_types if (q in shadowed) != on]
    if not to_change:
        names = ", ".join(quota_types)
        state = "in" if on else "out of"
        print(f"{names} already {state} shadow mode (version {live.version}); nothing written")
        return EXIT_OK
    change = SetEnforcement(shadow={q.value: on for q in to_change}, **admin.stamp())
    admin.write(live, [change])
    return EXIT_OK


# ------------------------------------------------------------------------------------ replication
def _number(text: str | None, option: str) -> float | None:
    return None if text is None else _finite(text, option, "")


def _finite(text: str, what: str, unit: str) -> float:
    """A finite float from the command line; the error names the option (or key) and value."""
    try:
        value = float(text)
    except ValueError:
        raise _bad(f"{what} {text!r} is not a number{unit}") from None
    if not math.isfinite(value):
        raise _bad(f"{what} must be a finite number{unit}, got {text}")
    return value


def _count(text: str | None, option: str) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise _bad(f"{option} {text!r} is not a whole number") from None


def _replicas(text: str | None, option: str) -> ThrottledReplicas | None:
    if text is None:
        return None
    if not text.strip():
        raise _bad(f"{option} is empty: --remove clears the throttle")
    try:
        return ThrottledReplicas.parse(text)
    except ValueError as exc:
        raise _bad(f"{option} {text!r}: {exc}") from None


@dataclass(frozen=True)
class _Plan:
    estimate: MoveEstimate | None
    bound: ThrottleBound | None


def _plan(args: argparse.Namespace, rate: float, brokers: list[BrokerKey]) -> _Plan:
    moved = _count(args.partitions_moved, "--partitions-moved")
    total = _count(args.total_partitions, "--total-partitions")
    size = _number(args.log_size_per_broker, "--log-size-per-broker")
    bytes_in = _number(args.max_bytes_in, "--max-bytes-in")
    network = _number(args.network, "--network")
    factor = _count(args.replication_factor, "--replication-factor")
    count = _count(args.broker_count, "--broker-count")
    estimate_args = {
        "--partitions-moved": moved,
        "--total-partitions": total,
        "--log-size-per-broker": size,
    }
    estimate = bound = None
    try:
        if any(v is not None for v in estimate_args.values()):
            missing = [option for option, v in estimate_args.items() if v is None]
            if bytes_in is None:
                missing.append("--max-bytes-in")
            if count is None and brokers != [DEFAULT]:
                count = len(brokers)
            if count is None:
                missing.append("--broker-count (the rate is set on <default>)")
            if missing:
                raise _bad(f"the MoveTime estimate also needs {', '.join(missing)}")
            assert moved is not None
            assert total is not None
            assert size is not None
            assert bytes_in is not None
            assert count is not None
            estimate = estimate_move(
                partitions_moved=moved,
                total_partitions=total,
                log_size_per_broker=size,
                brokers=count,
                rate=rate,
                max_bytes_in=bytes_in,
            )
        if network is not None or factor is not None:
            missing = [
                option
                for option, v in (
                    ("--network", network),
                    ("--replication-factor", factor),
                    ("--max-bytes-in", bytes_in),
                )
                if v is None
            ]
            if missing:
                raise _bad(f"the IN < T < N - IN/R check also needs {', '.join(missing)}")
            assert network is not None
            assert factor is not None
            assert bytes_in is not None
            bound = throttle_bound(rate, bytes_in, network, factor)
    except ValueError as exc:
        raise _bad(str(exc)) from None
    return _Plan(estimate, bound)


def _replication_throttle(admin: _Admin) -> int:
    args = admin.args
    if not TOPIC_NAME.match(args.topic):
        raise _bad(f"--topic {args.topic!r} is not a legal Kafka topic name")
    brokers: list[BrokerKey] = (
        list(dict.fromkeys(_broker_id(b, "--brokers") for b in args.brokers.split(",")))
        if args.brokers is not None
        else [DEFAULT]
    )
    if args.remove:
        return _replication_remove(admin, brokers)
    if args.rate is None:
        raise _bad("--rate is required (or --remove)")
    rate = _number(args.rate, "--rate")
    assert rate is not None
    if rate <= 0:
        raise _bad(f"--rate must be > 0, got {args.rate}")
    leader = _replicas(args.leader_replicas, "--leader-replicas")
    follower = _replicas(args.follower_replicas, "--follower-replicas")
    if leader is None and follower is None:
        raise _bad("give --leader-replicas and/or --follower-replicas (or --remove)")
    plan = _plan(args, rate, brokers)
    live = admin.live()
    named = {b for replicas in (leader, follower) if replicas for _, b in replicas.replicas}
    _check_known_brokers(live.config, brokers, named, args.new_broker)
    lists = {
        key: replicas.text()
        for key, replicas in ((LEADER_REPLICAS, leader), (FOLLOWER_REPLICAS, follower))
        if replicas is not None
    }
    changes: list[Change] = [SetTopicThrottles(topic=args.topic, values=lists, **admin.stamp())]
    changes += [
        SetBrokerQuota(broker=b, values={LEADER_RATE: rate, FOLLOWER_RATE: rate}, **admin.stamp())
        for b in brokers
    ]
    admin.write(live, changes)
    _print_plan(plan, rate)
    return EXIT_OK


def _replication_remove(admin: _Admin, brokers: list[BrokerKey]) -> int:
    args = admin.args
    given = [
        option
        for option, value in vars(args).items()
        if value is not None
        and option
        in {
            "rate",
            "leader_replicas",
            "follower_replicas",
            "partitions_moved",
            "total_partitions",
            "log_size_per_broker",
            "broker_count",
            "max_bytes_in",
            "network",
            "replication_factor",
        }
    ]
    if given:
        options = ", ".join("--" + g.replace("_", "-") for g in given)
        raise _bad(f"--remove takes only --topic and --brokers, not {options}")
    live = admin.live()
    changes: list[Change] = []
    topic = _configured(live.config, _Entity("topic", topic=args.topic))
    if topic:
        changes.append(
            SetTopicThrottles(topic=args.topic, values=dict.fromkeys(topic, ""), **admin.stamp())
        )
    for broker in brokers:
        rates = _configured(live.config, _Entity("broker", broker=broker))
        removed: dict[str, float | None] = {
            k: None for k in (LEADER_RATE, FOLLOWER_RATE) if k in rates
        }
        if removed:
            changes.append(SetBrokerQuota(broker=broker, values=removed, **admin.stamp()))
    if not changes:
        names = ", ".join(str(b) for b in brokers)
        raise _bad(
            f"nothing to remove: topic {args.topic} has no throttled replicas and broker(s) "
            f"{names} have no replication throttled rate"
        )
    admin.write(live, changes)
    return EXIT_OK


def _print_plan(plan: _Plan, rate: float) -> None:
    if plan.estimate is not None:
        estimate = plan.estimate
        print(f"MoveRatio: {estimate.move_ratio:.4g}")
        print(f"bytes to move: {_text(estimate.bytes_to_move)}")
        if estimate.completes:
            print(
                f"MoveTime: {estimate.seconds:.0f} s ({_duration(estimate.seconds)}) at "
                f"{_text(estimate.spare_rate)} B/s spare (rate - max BytesIn)"
            )
        else:
            message = (
                f"the move never completes: the rate ({_text(rate)} B/s) is not above max(BytesIn) "
                f"({_text(rate - estimate.spare_rate)} B/s), so keep-up traffic takes the whole "
                "throttle"
            )
            print(f"MoveTime: never ({message})")
            _warn(message)
    if plan.bound is not None:
        bound = plan.bound
        verdict = "holds" if bound.holds else "BROKEN"
        print(
            f"bound IN < T < N - IN/R: {_text(bound.lower)} < {_text(rate)} < "
            f"{_text(bound.upper)}: {verdict}"
        )
        if bound.too_low:
            _warn(
                f"throttle {_text(rate)} B/s is not above the inbound rate IN = "
                f"{_text(bound.lower)} B/s (lower side of IN < T < N - IN/R): replicas "
                "cannot catch up"
            )
        if bound.too_high:
            _warn(
                f"throttle {_text(rate)} B/s is not below N - IN/R = {_text(bound.upper)} B/s "
                "(upper side of IN < T < N - IN/R): throttled replication can crowd out client "
                "traffic"
            )
        if not bound.satisfiable:
            _warn("no throttle satisfies IN < T < N - IN/R on this network: IN >= N - IN/R")


def _duration(seconds: float) -> str:
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


# ----------------------------------------------------------------------------------------- lookup
def _lookup(admin: _Admin) -> int:
    args = admin.args
    quota = _parse_quota_type(args.quota)
    client = [args.user, args.client_id, args.broker]
    if args.entity is not None:
        if any(v is not None for v in client):
            raise _bad("give either --entity or --user, --client-id and --broker, not both")
        if not args.entity:
            raise _bad("--entity must not be empty")
        entity, version = args.entity, None
        agent = admin.redis_client(None)
    else:
        if any(v is None for v in client):
            raise _bad("give --user, --client-id and --broker (a client), or --entity KEY")
        if quota not in CLIENT_QUOTA_TYPES:
            raise _bad(f"{quota} is not a client quota: look it up with --entity (e.g. broker=1)")
        _entity_name(args.user, "--user")
        broker = _broker_id(args.broker, "--broker")
        if broker == DEFAULT:
            raise _bad("--broker needs a broker id: the broker the client is connected to")
        live = admin.live()
        agent = admin.redis_client(live.config)
        try:
            entity = agent.entity_of_client(quota.value, args.user, args.client_id, int(broker))
        except ValueError as exc:
            raise _bad(f"cannot resolve the client: {exc}") from None
        version = live.version
    decision = agent.lookup(quota.value, entity)
    key = decision_key(admin.settings.redis.key_prefix, quota.value, entity)
    _print_decision(key, version, decision, admin.args.json)
    return EXIT_OK


def _print_decision(
    key: str, version: int | None, decision: Decision | None, as_json: bool
) -> None:
    now_ms = int(time.time() * 1000)
    values = None if decision is None else dict(vars(decision))
    throttle_ms_now = 0 if decision is None else decision.throttle_ms_now(now_ms)
    if as_json:
        _print_json(
            {
                "key": key,
                "resolved_at_version": version,
                "decision": values,
                "throttle_ms_now": throttle_ms_now,
            }
        )
        return
    print(f"key: {key}")
    if version is not None:
        print(f"resolved with config version: {version}")
    if values is None:
        print("no decision: the agent applies no throttle (throttle_ms_now: 0)")
        return
    for name, value in values.items():
        print(f"{name}: {json.dumps(value)}")
    print(f"throttle_ms_now: {throttle_ms_now}")


# ---------------------------------------------------------------------------------------- output
def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e18:
        return str(int(value))
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.3f}".rstrip("0").rstrip(".")
    return str(value)


def _print_json(value: object) -> None:
    print(json.dumps(value, sort_keys=False))
