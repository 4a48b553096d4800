"""``quota describe``: the quotas that apply to a client or a broker, and where they come from.

A client is a (user, client-id) pair, but Kafka's entities also name one side alone
(``kafka-configs --describe --entity-type clients --entity-name app1``), so ``describe`` takes
one side alone too: ``--client-id app1`` describes app1's clients of *any other user*, one that
no quota names at the levels a user is named at (1-3), and lists the users with a quota of their
own for it, with what applies to each of them; ``--user alice`` likewise describes alice's
clients of any client-id no quota names (levels 1, 4, 7) and the client-ids with their own. The
missing side is resolved as ``<default>``: a configured entity holds ``<default>`` only at the
levels that name no one (``state.quota_rules.LEVELS``), so a ``<default>`` name matches exactly
the levels every other name matches.
"""

from __future__ import annotations

import math
from typing import Any, Final

from state.config import DEFAULT, BrokerQuotas, QuotaConfig
from state.live_config import client_entity_name, decision_mode
from state.quota_rules import QuotaRules, Sharing, broker_limit, client_key, per_broker
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


#: How a counter's key shows a side the describe leaves open (as ``broker=N`` does a broker).
ANY_USER: Final = "U"
ANY_CLIENT_ID: Final = "C"


def describe_quotas(admin: Admin) -> int:
    args = admin.args
    if args.user is None and args.client_id is None and args.broker is None:
        raise bad("describe what: --user and/or --client-id (clients) and/or --broker N")
    broker = parse_broker_id(args.broker, "--broker") if args.broker is not None else None
    if broker == DEFAULT:
        raise bad("--broker needs a broker id: describe tells whether it has an override")
    assert broker is None or isinstance(broker, int)
    user = checked_entity_name(args.user, "--user")
    client_id = checked_entity_name(args.client_id, "--client-id")
    live = admin.live()
    result: dict[str, Any] = {"version": live.version}
    if user is not None or client_id is not None:
        result["client"] = _describe_client(live.config, user, client_id, broker)
    if broker is not None:
        result["broker"] = _describe_broker(live.config, broker)
    if args.output == "json":
        print_json(result)
        return EXIT_OK
    if "client" in result:
        print(f"{_clients_named(user, client_id)} (version {live.version})")
        for quota, found in result["client"]["quotas"].items():
            print(f"  {quota}: {_client_line(found)}")
            for own in found.get("own_quotas", []):
                print(f"    {_own_quota_line(own)}")
    if broker is not None:
        print(f"broker {broker} (version {live.version})")
        for quota, found in result["broker"]["quotas"].items():
            print(f"  {quota} ({found['key']}): {_broker_line(found, broker)}")
    return EXIT_OK


def _clients_named(user: str | None, client_id: str | None) -> str:
    if user is None:
        return f"client-id={client_id}, any user without a quota of its own"
    if client_id is None:
        return f"user={user}, any client-id without a quota of its own"
    return f"user={user}, client-id={client_id}"


def _own_quota_line(own: dict[str, Any]) -> str:
    who = f"user={own['user']}" if "user" in own else f"client-id={own['client_id']}"
    return f"but {who}: {_client_line(own)}"


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
    config: QuotaConfig, user: str | None, client_id: str | None, broker: int | None
) -> dict[str, Any]:
    """What applies to ``(user, client_id)``; with one side None, to that side's clients whose
    other side no quota names, and (``own_quotas``) to each name that has a quota of its own."""
    rules = QuotaRules(config)
    quotas: dict[str, Any] = {}
    for quota_type in CLIENT_QUOTA_TYPES:
        found = _applying(rules, quota_type, user, client_id, broker)
        if user is None:
            found["own_quotas"] = [
                {"user": name, **_applying(rules, quota_type, name, client_id, broker)}
                for name in _own_quota_names(config, quota_type, user, client_id)
            ]
        elif client_id is None:
            found["own_quotas"] = [
                {"client_id": name, **_applying(rules, quota_type, user, name, broker)}
                for name in _own_quota_names(config, quota_type, user, client_id)
            ]
        quotas[quota_type.value] = found
    return {"user": user, "client_id": client_id, "quotas": quotas}


def _applying(
    rules: QuotaRules,
    quota_type: QuotaType,
    user: str | None,
    client_id: str | None,
    broker: int | None,
) -> dict[str, Any]:
    """One client quota of ``(user, client_id)``, a side None standing for any name that no
    quota names (resolved as ``<default>``: the module's docstring says why that is exact)."""
    resolved = rules.client(
        quota_type,
        DEFAULT if user is None else user,
        DEFAULT if client_id is None else client_id,
        broker,
    )
    measured_per_broker = per_broker(rules.config, quota_type)
    counter = client_key(
        resolved.sharing,
        ANY_USER if user is None else user,
        ANY_CLIENT_ID if client_id is None else client_id,
        broker if measured_per_broker else None,
    )
    if broker is None and measured_per_broker:
        counter += ",broker=N"
    configured = resolved.configured
    return {
        "limit": None if math.isinf(resolved.limit) else resolved.limit,
        "level": resolved.level,
        "from": None if configured is None else client_entity_name(*configured),
        "exempt": resolved.exempt,
        "mode": resolved.mode.value,
        "counter": counter,
        "sharing": _SHARING_TEXT[resolved.sharing],
    }


def _own_quota_names(
    config: QuotaConfig, quota_type: QuotaType, user: str | None, client_id: str | None
) -> list[str]:
    """The names of the open side (users when ``user`` is None, else client-ids) that a
    configured entity of ``quota_type`` names next to the given side, ``<default>`` or nothing:
    the clients of the given side whose quota may differ from any other's."""
    names: set[str] = set()
    for quota in config.clients:
        if quota.rate_for(quota_type) is None:
            continue
        open_side, given_side, given = (
            (quota.user, quota.client_id, client_id)
            if user is None
            else (quota.client_id, quota.user, user)
        )
        if open_side not in (None, DEFAULT) and given_side in (None, DEFAULT, given):
            names.add(open_side)
    return sorted(names)


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
