"""``quota describe``: the quotas that apply to a client or a broker, and where they come from."""

from __future__ import annotations

import math
from typing import Any, Final

from state.config import DEFAULT, BrokerQuotas, QuotaConfig
from state.live_config import client_entity_name, decision_mode
from state.quota_rules import QuotaRules, Sharing, broker_limit, per_broker
from state.quota_types import CLIENT_QUOTA_TYPES, QuotaType
from streaming.commands.admin.context import Admin
from streaming.commands.admin.entities import checked_entity_name, parse_broker_id
from streaming.commands.admin.errors import bad
from streaming.commands.admin.output import as_text, print_json
from streaming.commands.exit_codes import EXIT_OK

BROKER_QUOTA_TYPES: Final = tuple(q for q in QuotaType if q not in CLIENT_QUOTA_TYPES)


_SHARING_TEXT: Final = {
    Sharing.USER_AND_CLIENT: "one counter per (user, client-id)",
    Sharing.USER: "one counter per user: all its client-ids share it",
    Sharing.CLIENT: "one counter per client-id: all users with it share it",
}


def describe_quotas(admin: Admin) -> int:
    args = admin.args
    if args.user is None and args.client_id is None and args.broker is None:
        raise bad("describe what: --user and --client-id (a client) and/or --broker N")
    if (args.user is None) != (args.client_id is None):
        raise bad("a client is a (user, client-id) pair: give both --user and --client-id")
    broker = parse_broker_id(args.broker, "--broker") if args.broker is not None else None
    if broker == DEFAULT:
        raise bad("--broker needs a broker id: describe tells whether it has an override")
    assert broker is None or isinstance(broker, int)
    if args.user is not None:
        checked_entity_name(args.user, "--user")
    live = admin.live()
    result: dict[str, Any] = {"version": live.version}
    if args.user is not None:
        result["client"] = _describe_client(live.config, args.user, args.client_id, broker)
    if broker is not None:
        result["broker"] = _describe_broker(live.config, broker)
    if args.output == "json":
        print_json(result)
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
        limit = "unlimited" if found["limit"] is None else f"{as_text(found['limit'])} B/s"
    source = f"level {found['level']} ({found['from']})" if found["level"] else "no level sets it"
    exempt = "yes" if found["exempt"] else "no"
    return (
        f"{limit}, {source}, exempt: {exempt}, mode: {found['mode']}, "
        f"counter: {found['counter']} ({found['sharing']})"
    )


def _broker_line(found: dict[str, Any], broker: int) -> str:
    limit = "unlimited" if found["limit"] is None else f"{as_text(found['limit'])} B/s"
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
    rules = QuotaRules(config)
    quotas: dict[str, Any] = {}
    for quota_type in CLIENT_QUOTA_TYPES:
        resolved = rules.client(quota_type, user, client_id, broker)
        counter = resolved.entity
        if broker is None and per_broker(config, quota_type):
            counter += ",broker=N"
        configured = resolved.configured
        quotas[quota_type.value] = {
            "limit": None if math.isinf(resolved.limit) else resolved.limit,
            "level": resolved.level,
            "from": None if configured is None else client_entity_name(*configured),
            "exempt": resolved.exempt,
            "mode": resolved.mode.value,
            "counter": counter,
            "sharing": _SHARING_TEXT[resolved.sharing],
        }
    return {"user": user, "client_id": client_id, "quotas": quotas}


def _describe_broker(config: QuotaConfig, broker: int) -> dict[str, Any]:
    quotas: dict[str, Any] = {}
    for quota_type in BROKER_QUOTA_TYPES:
        limit, source = broker_limit(config, quota_type, broker)
        quotas[quota_type.value] = {
            "key": BrokerQuotas.model_fields[quota_type.value].alias,
            "limit": None if math.isinf(limit) else limit,
            "from": source,
            "cluster": not per_broker(config, quota_type),
            "mode": decision_mode(config, quota_type, exempt=False).value,
        }
    return {"broker": broker, "has_override": broker in config.brokers, "quotas": quotas}
