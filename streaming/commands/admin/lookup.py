"""``lookup``: what an enforcement agent reads from Redis: a client's or an entity's decision,
or a partition's remote log sizes (KIP-852).

Each is read by the agent's own client (``quotastream.client.QuotaClient``: ``for_client``'s
resolution, ``lookup``, ``remote_log``), so the command shows exactly what an agent sees.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

import msgspec

from state.config import DEFAULT, TOPIC_NAME
from state.entities import entity_key_problem
from state.quota_rules import per_broker
from state.quota_types import CLIENT_QUOTA_TYPES, QuotaType
from streaming.commands.admin.context import Admin
from streaming.commands.admin.entities import (
    checked_entity_name,
    parse_broker_id,
    parse_partition,
)
from streaming.commands.admin.errors import AdminError, bad
from streaming.commands.admin.output import print_json
from streaming.commands.admin.values import parse_quota_type
from streaming.commands.exit_codes import EXIT_FAILURE, EXIT_OK

if TYPE_CHECKING:
    from quotastream.redis_contract import Decision


def lookup(admin: Admin) -> int:
    args = admin.args
    partition = [args.topic, args.partition]
    if any(v is not None for v in partition):
        if args.quota is not None:
            raise bad(
                "--topic and --partition read a partition's remote log size, which has no "
                "--quota (a partition's remote_copy wait is --quota remote_copy --entity "
                "broker=B,topic=T,partition=P)"
            )
        if any(v is None for v in partition):
            raise bad("a partition's remote log size needs both --topic and --partition")
        return _lookup_remote_log(admin)
    if args.quota is None:
        raise bad("give --quota (a decision) or --topic and --partition (a remote log size)")
    return _lookup_decision(admin)


def _lookup_decision(admin: Admin) -> int:
    # Not at the top: the quotastream package loads redis, which only admin commands may pay for.
    from quotastream.redis_contract import CorruptValueError, decision_key  # noqa: PLC0415

    args = admin.args
    quota = parse_quota_type(args.quota)
    if args.entity is not None:
        if any(v is not None for v in (args.user, args.client_id, args.broker)):
            raise bad("give either --entity or --user, --client-id and --broker, not both")
        problem = entity_key_problem(
            args.entity, quota in CLIENT_QUOTA_TYPES, partitions=quota is QuotaType.REMOTE_COPY
        )
        if problem is not None:
            raise bad(f"--entity {problem}")
        entity, version = args.entity, None
        agent = admin.redis_client(None)
    else:
        if args.user is None or args.client_id is None:
            raise bad("give --user, --client-id and --broker (a client), or --entity KEY")
        if quota not in CLIENT_QUOTA_TYPES:
            raise bad(f"{quota} is not a client quota: look it up with --entity (e.g. broker=1)")
        checked_entity_name(args.user, "--user")
        broker = None if args.broker is None else parse_broker_id(args.broker, "--broker")
        if broker == DEFAULT:
            raise bad("--broker needs a broker id: the broker the client is connected to")
        assert broker is None or isinstance(broker, int)
        live = admin.live()
        if broker is None and per_broker(live.config, quota):
            raise bad(
                f"give --broker: {quota} is measured per broker (quota_types.{quota}.scope: "
                "broker), so the client's counter names the broker it is connected to"
            )
        agent = admin.redis_client(live.config)
        try:
            entity = agent.entity_of_client(quota.value, args.user, args.client_id, broker)
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


def _lookup_remote_log(admin: Admin) -> int:
    from quotastream.redis_contract import CorruptValueError, remote_log_key  # noqa: PLC0415

    args = admin.args
    if not TOPIC_NAME.match(args.topic):
        raise bad(f"--topic {args.topic!r} is not a legal Kafka topic name")
    partition = parse_partition(args.partition, "--partition")
    try:
        remote_log = admin.redis_client(None).remote_log(args.topic, partition)
    except CorruptValueError as exc:
        raise AdminError(EXIT_FAILURE, str(exc)) from None
    key = remote_log_key(admin.settings.redis.key_prefix, args.topic, partition)
    values = dataclasses.asdict(remote_log)
    if args.output == "json":
        print_json({"key": key, "remote_log": values})
        return EXIT_OK
    print(f"key: {key}")
    if not remote_log.segments:
        # The engine deletes the key with a partition's last remote segment.
        print("no remote segments: the partition's remote log size is 0")
        return EXIT_OK
    _print_fields(values)
    return EXIT_OK


def _print_decision(
    key: str, version: int | None, decision: Decision | None, as_json: bool
) -> None:
    values = None if decision is None else msgspec.structs.asdict(decision)
    throttle_ms_now = 0 if decision is None else decision.throttle_ms_now()
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
    _print_fields(values)
    print(f"throttle_ms_now: {throttle_ms_now}")


def _print_fields(values: dict[str, Any]) -> None:
    for name, value in values.items():
        print(f"{name}: {json.dumps(value)}")
