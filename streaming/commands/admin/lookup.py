"""``lookup``: the decision an enforcement agent reads from Redis for a client or an entity."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import msgspec

from state.config import DEFAULT
from state.entities import entity_key_problem
from state.quota_types import CLIENT_QUOTA_TYPES, QuotaType
from streaming.commands.admin.context import Admin
from streaming.commands.admin.entities import checked_entity_name, parse_broker_id
from streaming.commands.admin.errors import AdminError, bad
from streaming.commands.admin.output import print_json
from streaming.commands.admin.values import parse_quota_type
from streaming.commands.exit_codes import EXIT_FAILURE, EXIT_OK

if TYPE_CHECKING:
    from quotastream.redis_contract import Decision


def lookup_decision(admin: Admin) -> int:
    # Not at the top: the quotastream package loads redis, which only admin commands may pay for.
    from quotastream.redis_contract import CorruptValueError, decision_key  # noqa: PLC0415

    args = admin.args
    quota = parse_quota_type(args.quota)
    client = [args.user, args.client_id, args.broker]
    if args.entity is not None:
        if any(v is not None for v in client):
            raise bad("give either --entity or --user, --client-id and --broker, not both")
        problem = entity_key_problem(
            args.entity, quota in CLIENT_QUOTA_TYPES, partitions=quota is QuotaType.REMOTE_COPY
        )
        if problem is not None:
            raise bad(f"--entity {problem}")
        entity, version = args.entity, None
        agent = admin.redis_client(None)
    else:
        if any(v is None for v in client):
            raise bad("give --user, --client-id and --broker (a client), or --entity KEY")
        if quota not in CLIENT_QUOTA_TYPES:
            raise bad(f"{quota} is not a client quota: look it up with --entity (e.g. broker=1)")
        checked_entity_name(args.user, "--user")
        broker = parse_broker_id(args.broker, "--broker")
        if broker == DEFAULT:
            raise bad("--broker needs a broker id: the broker the client is connected to")
        live = admin.live()
        agent = admin.redis_client(live.config)
        try:
            entity = agent.entity_of_client(quota.value, args.user, args.client_id, int(broker))
        except ValueError as exc:
            raise bad(f"cannot resolve the client: {exc}") from None
        version = live.version
    try:
        decision = agent.lookup(quota.value, entity)
    except CorruptValueError as exc:
        raise AdminError(EXIT_FAILURE, str(exc)) from None
    key = decision_key(admin.settings.redis.key_prefix, quota.value, entity)
    _print_decision(key, version, decision, admin.args.output == "json")
    return EXIT_OK


def _print_decision(
    key: str, version: int | None, decision: Decision | None, as_json: bool
) -> None:
    now_ms = int(time.time() * 1000)
    values = None if decision is None else msgspec.structs.asdict(decision)
    throttle_ms_now = 0 if decision is None else decision.throttle_ms_now(now_ms)
    if as_json:
        print_json(
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
