"""The admin commands' options: which parser each command gets and which handler runs it."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeAlias

from state.live_config import BROKER_KEYS, TOPIC_KEYS
from state.quota_types import QuotaType
from streaming.commands.admin.enforcement import (
    enforcement_status,
    shadow_quota_types,
    switch_enforcement,
)
from streaming.commands.admin.entities import KAFKA_ENTITY_TYPES
from streaming.commands.admin.lookup import lookup
from streaming.commands.admin.quota_change import delete_quota, set_quota
from streaming.commands.admin.quota_describe import describe_quotas
from streaming.commands.admin.quota_show import get_quota, list_quotas, quota_history
from streaming.commands.admin.replication import throttle_replication
from streaming.commands.help_text import examples

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


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
    _add_kafka_entity_options(entity)
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument(
        "--output",
        choices=OUTPUTS,
        default="table",
        help="an aligned table (default) or one JSON document",
    )
    as_json.add_argument(
        "--json", dest="output", action="store_const", const="json", help="--output json"
    )
    parents = _Parents(common, writer, entity, as_json)
    _add_quota(commands, parents)
    _add_enforcement(commands, parents)
    _add_replication(commands, parents)
    _add_lookup(commands, parents)


#: What commands that print tables can print instead.
OUTPUTS: Final = ("table", "json")


class _KafkaEntityOption(argparse.Action):
    """Keeps ``kafka-configs.sh``'s entity options in the order given: a name belongs to the
    ``--entity-type`` before it (``apply_kafka_entity_options`` pairs them)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        pairs = [*(getattr(namespace, self.dest, None) or []), (option_string, values)]
        setattr(namespace, self.dest, pairs)


def _add_kafka_entity_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "kafka-configs.sh aliases",
        "e.g. --entity-type users --entity-name alice --entity-type clients --entity-default",
    )
    kafka_entity: dict[str, Any] = {"dest": "kafka_entities", "action": _KafkaEntityOption}
    group.add_argument("--entity-type", choices=KAFKA_ENTITY_TYPES, **kafka_entity)
    group.add_argument("--entity-name", metavar="NAME", **kafka_entity)
    group.add_argument(
        "--entity-default", nargs=0, help="the <default> entity of that type", **kafka_entity
    )


@dataclass(frozen=True)
class _Parents:
    """Option groups shared by the commands."""

    common: argparse.ArgumentParser  # --engine-config, --timeout
    writer: argparse.ArgumentParser  # --by, --dry-run
    entity: argparse.ArgumentParser  # --user, --client-id, --broker, --topic
    as_json: argparse.ArgumentParser  # --json


def _add_quota(commands: Commands, p: _Parents) -> None:
    common, writer, entity, as_json = p.common, p.writer, p.entity, p.as_json
    quota = commands.add_parser(
        "quota",
        help="set, show and remove quotas in the live configuration",
        description="The live configuration: the quota file plus the changes in the config "
        "topic. Changes are validated before they are written and reach the running engine "
        "within a trigger interval.",
        **examples(
            "quotastream quota set --user alice producer_byte_rate=1048576",
            "quotastream quota describe --user alice --client-id app1",
        ),
    )
    actions = quota.add_subparsers(dest="action", required=True, metavar="ACTION")
    set_action = actions.add_parser(
        "set",
        parents=[common, writer, entity],
        help="set keys of one entity",
        description="Client keys: producer_byte_rate, consumer_byte_rate (bytes/s, > 0), "
        "exempt=true|false. Broker keys: "
        + ", ".join(BROKER_KEYS)
        + ". Topic keys: "
        + ", ".join(TOPIC_KEYS)
        + " ('partition:broker,...' or '*').",
        **examples(
            "quotastream quota set --user alice --client-id app1 producer_byte_rate=1048576",
            "quotastream quota set --entity-type users --entity-default "
            "--add-config 'producer_byte_rate=1024,consumer_byte_rate=2048'",
            "quotastream quota set --broker 1 --new-broker "
            "remote.log.manager.copy.max.bytes.per.second=10485760",
        ),
    )
    set_action.add_argument(
        "settings", nargs="*", metavar="KEY=VALUE", help="or several: 'k1=v1,k2=v2'"
    )
    set_action.add_argument(
        "--add-config",
        action="append",
        default=[],
        metavar="K=V,...",
        help="the same, as kafka-configs.sh says it",
    )
    set_action.add_argument(
        "--new-broker",
        action="store_true",
        help="allow a broker id that has no quota configured yet (guards against typos)",
    )
    set_action.set_defaults(admin=set_quota)
    get_action = actions.add_parser(
        "get",
        parents=[common, entity, as_json],
        help="the keys one entity sets",
        **examples("quotastream quota get --user alice --client-id app1 --output json"),
    )
    get_action.set_defaults(admin=get_quota)
    delete_action = actions.add_parser(
        "delete",
        parents=[common, writer, entity],
        help="remove keys of one entity (all of them when none is named)",
        **examples(
            "quotastream quota delete --user alice producer_byte_rate",
            "quotastream quota delete --entity-type users --entity-name alice --delete-config "
            "producer_byte_rate,consumer_byte_rate",
        ),
    )
    delete_action.add_argument("keys", nargs="*", metavar="KEY", help="or several: 'k1,k2'")
    delete_action.add_argument(
        "--delete-config",
        action="append",
        default=[],
        metavar="K,...",
        help="the same, as kafka-configs.sh says it",
    )
    delete_action.set_defaults(admin=delete_quota)
    list_action = actions.add_parser(
        "list",
        parents=[common, as_json],
        help="every configured entity and switch",
        **examples("quotastream quota list", "quotastream quota list --output json"),
    )
    list_action.set_defaults(admin=list_quotas)
    describe = actions.add_parser(
        "describe",
        parents=[common, as_json],
        help="the quotas that apply to a client and/or a broker, and where they come from",
        **examples(
            "quotastream quota describe --user alice --client-id app1 --broker 1",
            "quotastream quota describe --entity-type users --entity-name alice "
            "--entity-type clients --entity-name app1",
        ),
    )
    describe.add_argument("--user", help="the client's user")
    describe.add_argument("--client-id", help="the client's client-id")
    describe.add_argument("--broker", help="a broker id: its broker quotas")
    _add_kafka_entity_options(describe)
    describe.set_defaults(admin=describe_quotas)
    history = actions.add_parser(
        "history",
        parents=[common, as_json],
        help="the changes in the config topic",
        **examples("quotastream quota history --last 10"),
    )
    history.add_argument("--last", type=int, metavar="N", help="only the newest N changes")
    history.set_defaults(admin=quota_history)


def _add_enforcement(commands: Commands, p: _Parents) -> None:
    common, writer, as_json = p.common, p.writer, p.as_json
    enforcement = commands.add_parser(
        "enforcement",
        help="the global enforcement switch and per-quota shadow mode",
        description="Decisions are always computed. Disabled: none binds. Shadow: the quota "
        "type's decisions are reported but never bind.",
        **examples("quotastream enforcement status", "quotastream enforcement shadow remote_copy"),
    )
    switches = enforcement.add_subparsers(dest="action", required=True, metavar="ACTION")
    switches.add_parser(
        "status",
        parents=[common, as_json],
        help="the switches and each quota type's mode",
        **examples("quotastream enforcement status --output json"),
    ).set_defaults(admin=enforcement_status)
    switches.add_parser(
        "enable",
        parents=[common, writer],
        help="decisions bind again",
        **examples("quotastream enforcement enable --by oncall"),
    ).set_defaults(admin=switch_enforcement, enable=True)
    switches.add_parser(
        "disable",
        parents=[common, writer],
        help="no decision binds (a global kill switch)",
        **examples("quotastream enforcement disable --by oncall"),
    ).set_defaults(admin=switch_enforcement, enable=False)
    for name, on in (("shadow", True), ("unshadow", False)):
        shadow = switches.add_parser(
            name,
            parents=[common, writer],
            help=f"{'put' if on else 'take'} quota types {'in' if on else 'out of'} shadow mode",
            **examples(f"quotastream enforcement {name} produce fetch"),
        )
        shadow.add_argument(
            "quota_types", nargs="+", metavar="QUOTA_TYPE", help=", ".join(QuotaType)
        )
        shadow.set_defaults(admin=shadow_quota_types, shadow_on=on)


def _add_replication(commands: Commands, p: _Parents) -> None:
    replication = commands.add_parser(
        "replication",
        help="replication throttles for a reassignment (KIP-73)",
        **examples(
            "quotastream replication throttle --topic orders --leader-replicas '*' --rate 1048576"
        ),
    )
    replication_actions = replication.add_subparsers(dest="action", required=True, metavar="ACTION")
    throttle = replication_actions.add_parser(
        "throttle",
        parents=[p.common, p.writer],
        help="throttle a topic's moving replicas, with KIP-73's MoveTime estimate",
        description="Sets the topic's throttled-replica lists (one change) and the leader and "
        "follower throttled rate on each broker (one change per broker), or removes them with "
        "--remove. Prints KIP-73's MoveRatio and MoveTime and checks IN < T < N - IN/R.",
        **examples(
            "quotastream replication throttle --topic orders --leader-replicas 0:1,1:2 "
            "--follower-replicas 0:3,1:3 --rate 10485760 --brokers 1,2,3",
            "quotastream replication throttle --topic orders --brokers 1,2,3 --remove",
        ),
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
    throttle.set_defaults(admin=throttle_replication)


def _add_lookup(commands: Commands, p: _Parents) -> None:
    lookup_parser = commands.add_parser(
        "lookup",
        parents=[p.common, p.as_json],
        help="a decision or a remote log size, as an enforcement agent reads it from Redis",
        description="A decision: --quota with --user, --client-id and --broker (a produce or "
        "fetch client, resolved to its usage counter with the live configuration; --broker may "
        "be left out for a quota whose scope is cluster), or with --entity KEY. A partition's "
        "remote log size (KIP-852): --topic and --partition.",
        **examples(
            "quotastream lookup --quota produce --user alice --client-id app1 --broker 1",
            "quotastream lookup --quota remote_copy --entity broker=3 --output json",
            "quotastream lookup --topic orders --partition 3",
        ),
    )
    lookup_parser.add_argument("--quota", help=", ".join(QuotaType))
    lookup_parser.add_argument("--user")
    lookup_parser.add_argument("--client-id")
    lookup_parser.add_argument(
        "--broker", help="the broker the client is connected to (not for scope: cluster)"
    )
    lookup_parser.add_argument(
        "--entity", metavar="KEY", help="e.g. user=alice,broker=1 or broker=3"
    )
    lookup_parser.add_argument("--topic", help="a tiered topic: its partition's remote log size")
    lookup_parser.add_argument("--partition", metavar="N")
    lookup_parser.set_defaults(admin=lookup)
