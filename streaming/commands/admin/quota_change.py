"""``quota set | delete``: one change to the keys of one entity, validated before it is written."""

from __future__ import annotations

from state.live_config import (
    Change,
    DeleteClientQuota,
    SetBrokerQuota,
    SetClientQuota,
    SetTopicThrottles,
)
from streaming.commands.admin.context import Admin
from streaming.commands.admin.entities import (
    check_known_brokers,
    configured_values,
    parse_entity,
    parse_settings,
    wrong_key_message,
)
from streaming.commands.admin.errors import bad
from streaming.commands.admin.values import parse_finite
from streaming.commands.exit_codes import EXIT_OK


def _rate(key: str, text: str) -> float:
    value = parse_finite(text, key, " (bytes per second)")
    if value <= 0:
        raise bad(
            f"{key}={text}: must be > 0 (an unset quota is unlimited: 'quota delete' removes one)"
        )
    return value


def _flag(key: str, text: str) -> bool:
    if text.lower() in {"true", "false"}:
        return text.lower() == "true"
    raise bad(f"{key}={text!r}: must be true or false")


def set_quota(admin: Admin) -> int:
    args = admin.args
    entity = parse_entity(args)
    if not args.settings and not args.add_config:
        raise bad("name what to set: KEY=VALUE ... or --add-config 'KEY=VALUE,...'")
    values = parse_settings(entity, [*args.settings, *args.add_config])
    if args.new_broker and entity.kind != "broker":
        raise bad("--new-broker goes with --broker")
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
                raise bad(f"{key} is empty: 'quota delete --topic {entity.topic} {key}' removes it")
        change = SetTopicThrottles(topic=entity.topic, values=values, **admin.stamp())
    live = admin.live()
    if entity.broker is not None:
        check_known_brokers(live.config, [entity.broker], set(), args.new_broker)
    admin.write(live, [change])
    return EXIT_OK


def delete_quota(admin: Admin) -> int:
    args = admin.args
    entity = parse_entity(args)
    named = [key.strip() for text in [*args.keys, *args.delete_config] for key in text.split(",")]
    for key in named:
        if key not in entity.keys:
            raise bad(wrong_key_message(key, entity))
    keys = list(dict.fromkeys(named))
    live = admin.live()
    current = configured_values(live.config, entity)
    if not current:
        raise bad(f"nothing to delete: no quota is set for {entity.name} (version {live.version})")
    missing = [k for k in keys if k not in current]
    if missing:
        raise bad(
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
