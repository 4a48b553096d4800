"""The admin commands' options: which parser each command gets and which handler runs it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from state.live_config import BROKER_KEYS, TOPIC_KEYS
from state.quota_types import QuotaType
from streaming.admin.enforcement import (
    enforcement_status,
    shadow_quota_types,
    switch_enforcement,
)
from streaming.admin.lookup import lookup_decision
from streaming.admin.quota_change import delete_quota, set_quota
from streaming.admin.quota_describe import describe_quotas
from streaming.admin.quota_show import get_quota, list_quotas, quota_history
from streaming.admin.replication import throttle_replication

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
    )
    set_action.add_argument("settings", nargs="+", metavar="KEY=VALUE")
    set_action.add_argument(
        "--new-broker",
        action="store_true",
        help="allow a broker id that has no quota configured yet (guards against typos)",
    )
    set_action.set_defaults(admin=set_quota)
    get_action = actions.add_parser(
        "get", parents=[common, entity, as_json], help="the keys one entity sets"
    )
    get_action.set_defaults(admin=get_quota)
    delete_action = actions.add_parser(
        "delete",
        parents=[common, writer, entity],
        help="remove keys of one entity (all of them when none is named)",
    )
    delete_action.add_argument("keys", nargs="*", metavar="KEY")
    delete_action.set_defaults(admin=delete_quota)
    list_action = actions.add_parser(
        "list", parents=[common, as_json], help="every configured entity and switch"
    )
    list_action.set_defaults(admin=list_quotas)
    describe = actions.add_parser(
        "describe",
        parents=[common, as_json],
        help="the quotas that apply to a client and/or a broker, and where they come from",
    )
    describe.add_argument("--user", help="the client's user")
    describe.add_argument("--client-id", help="the client's client-id")
    describe.add_argument("--broker", help="a broker id: its broker quotas")
    describe.set_defaults(admin=describe_quotas)
    history = actions.add_parser(
        "history", parents=[common, as_json], help="the changes in the config topic"
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
    )
    switches = enforcement.add_subparsers(dest="action", required=True, metavar="ACTION")
    switches.add_parser(
        "status", parents=[common, as_json], help="the switches and each quota type's mode"
    ).set_defaults(admin=enforcement_status)
    switches.add_parser(
        "enable", parents=[common, writer], help="decisions bind again"
    ).set_defaults(admin=switch_enforcement, enable=True)
    switches.add_parser(
        "disable", parents=[common, writer], help="no decision binds (a global kill switch)"
    ).set_defaults(admin=switch_enforcement, enable=False)
    for name, on in (("shadow", True), ("unshadow", False)):
        shadow = switches.add_parser(
            name,
            parents=[common, writer],
            help=f"{'put' if on else 'take'} quota types {'in' if on else 'out of'} shadow mode",
        )
        shadow.add_argument(
            "quota_types", nargs="+", metavar="QUOTA_TYPE", help=", ".join(QuotaType)
        )
        shadow.set_defaults(admin=shadow_quota_types, shadow_on=on)


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
    throttle.set_defaults(admin=throttle_replication)


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
    lookup.set_defaults(admin=lookup_decision)
