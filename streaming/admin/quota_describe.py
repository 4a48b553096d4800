"""``quota describe``: the quotas that apply to a client or a broker, and where they come from."""

from __future__ import annotations

import math
from typing import Any, Final

import numpy as np

from state.config import DEFAULT, BrokerQuotas, QuotaConfig
from state.live_config import client_entity_name, decision_mode
from state.quota_types import CLIENT_QUOTA_TYPES, QuotaType
from state.resolution import LEVELS, NO_LEVEL, ClientPairs, QuotaResolver
from streaming.admin.context import Admin
from streaming.admin.entities import checked_entity_name, parse_broker_id
from streaming.admin.errors import bad
from streaming.admin.output import as_text, print_json
from streaming.exit_codes import EXIT_OK

BROKER_QUOTA_TYPES: Final = tuple(q for q in QuotaType if q not in CLIENT_QUOTA_TYPES)


def _level_entity(number: int, user: str, client_id: str) -> str:
    level = LEVELS[number - 1]
    names = {"name": (user, client_id), "default": (DEFAULT, DEFAULT), "none": (None, None)}
    return client_entity_name(names[level.user][0], names[level.client][1])


_SHARING_TEXT: Final = {
    1: "one counter per (user, client-id)",
    2: "one counter per user: all its client-ids share it",
    3: "one counter per client-id: all users with it share it",
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
            resolution.sharing,
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
            "sharing": _SHARING_TEXT[int(resolution.sharing[0])],
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
