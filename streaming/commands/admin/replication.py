"""``replication throttle``: a topic's throttled replicas and the brokers' throttled rates."""

from __future__ import annotations

from typing import Final

from state.config import DEFAULT, TOPIC_NAME, BrokerKey, ThrottledReplicas
from state.live_config import Change, SetBrokerQuota, SetTopicThrottles
from streaming.commands.admin.context import Admin
from streaming.commands.admin.entities import (
    FOLLOWER_REPLICAS,
    LEADER_REPLICAS,
    Entity,
    check_known_brokers,
    configured_values,
    parse_broker_id,
)
from streaming.commands.admin.errors import bad
from streaming.commands.admin.move_plan import print_move_plan, read_move_plan
from streaming.commands.admin.values import optional_number
from streaming.commands.exit_codes import EXIT_OK

LEADER_RATE: Final = "leader.replication.throttled.rate"
FOLLOWER_RATE: Final = "follower.replication.throttled.rate"


def _replicas(text: str | None, option: str) -> ThrottledReplicas | None:
    if text is None:
        return None
    if not text.strip():
        raise bad(f"{option} is empty: --remove clears the throttle")
    try:
        return ThrottledReplicas.parse(text)
    except ValueError as exc:
        raise bad(f"{option} {text!r}: {exc}") from None


def throttle_replication(admin: Admin) -> int:
    args = admin.args
    if not TOPIC_NAME.match(args.topic):
        raise bad(f"--topic {args.topic!r} is not a legal Kafka topic name")
    brokers: list[BrokerKey] = (
        list(dict.fromkeys(parse_broker_id(b, "--brokers") for b in args.brokers.split(",")))
        if args.brokers is not None
        else [DEFAULT]
    )
    if args.remove:
        return _remove_throttle(admin, brokers)
    if args.rate is None:
        raise bad("--rate is required (or --remove)")
    rate = optional_number(args.rate, "--rate")
    assert rate is not None
    if rate <= 0:
        raise bad(f"--rate must be > 0, got {args.rate}")
    leader = _replicas(args.leader_replicas, "--leader-replicas")
    follower = _replicas(args.follower_replicas, "--follower-replicas")
    if leader is None and follower is None:
        raise bad("give --leader-replicas and/or --follower-replicas (or --remove)")
    plan = read_move_plan(args, rate, brokers)
    live = admin.live()
    named = {b for replicas in (leader, follower) if replicas for _, b in replicas.replicas}
    check_known_brokers(live.config, brokers, named, args.new_broker)
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
    print_move_plan(plan, rate)
    return EXIT_OK


def _remove_throttle(admin: Admin, brokers: list[BrokerKey]) -> int:
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
        raise bad(f"--remove takes only --topic and --brokers, not {options}")
    live = admin.live()
    changes: list[Change] = []
    topic = configured_values(live.config, Entity("topic", topic=args.topic))
    if topic:
        changes.append(
            SetTopicThrottles(topic=args.topic, values=dict.fromkeys(topic, ""), **admin.stamp())
        )
    for broker in brokers:
        rates = configured_values(live.config, Entity("broker", broker=broker))
        removed: dict[str, float | None] = {
            k: None for k in (LEADER_RATE, FOLLOWER_RATE) if k in rates
        }
        if removed:
            changes.append(SetBrokerQuota(broker=broker, values=removed, **admin.stamp()))
    if not changes:
        names = ", ".join(str(b) for b in brokers)
        raise bad(
            f"nothing to remove: topic {args.topic} has no throttled replicas and broker(s) "
            f"{names} have no replication throttled rate"
        )
    admin.write(live, changes)
    return EXIT_OK
