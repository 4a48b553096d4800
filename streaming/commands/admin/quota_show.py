"""``quota get | list | history``: the live configuration and the changes that made it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from state.configfile import ConfigError
from state.live_config import (
    CLIENT_KEYS,
    LiveConfig,
    client_entity_name,
    decode_change,
    describe_change,
)
from streaming.commands.admin.context import Admin
from streaming.commands.admin.entities import (
    Entity,
    broker_values,
    client_values,
    configured_values,
    parse_entity,
)
from streaming.commands.admin.errors import bad
from streaming.commands.admin.output import as_text, print_json
from streaming.commands.exit_codes import EXIT_OK


def get_quota(admin: Admin) -> int:
    entity = parse_entity(admin.args)
    live = admin.live()
    values = configured_values(live.config, entity)
    if admin.args.output == "json":
        print_json({"version": live.version, "entity": entity.name, "values": values})
        return EXIT_OK
    if not values:
        print(f"no quota is set for {entity.name} (version {live.version})")
        return EXIT_OK
    print(f"{entity.name} (version {live.version})")
    for key, value in values.items():
        print(f"  {key}={as_text(value)}")
    return EXIT_OK


def list_quotas(admin: Admin) -> int:
    live = admin.live()
    config = live.config
    clients: list[dict[str, Any]] = [
        {
            "user": q.user,
            "client_id": q.client_id,
            "entity": client_entity_name(q.user, q.client_id),
            **client_values(q.producer_byte_rate, q.consumer_byte_rate, q.exempt),
        }
        for q in config.clients
    ]
    brokers = {str(b): broker_values(q) for b, q in config.brokers.items()}
    topics = {
        name: configured_values(config, Entity("topic", topic=name)) for name in config.topics
    }
    shadowed = sorted(q.value for q in config.enforcement.shadow)
    enforcement = {"enabled": config.enforcement.enabled, "shadow": shadowed}
    skipped = [{"version": s.version, "reason": s.reason} for s in live.skipped]
    if admin.args.output == "json":
        print_json(
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
            settings = " ".join(f"{k}={as_text(v)}" for k, v in values.items())
            print(f"  {name:<{width}}  {settings}")
    shadow = ", ".join(shadowed) or "none"
    print(
        f"enforcement: {'enabled' if config.enforcement.enabled else 'DISABLED'}; shadow: {shadow}"
    )
    for s in live.skipped:
        print(f"skipped: version {s.version}: {s.reason}")
    return EXIT_OK


def quota_history(admin: Admin) -> int:
    log = admin.log
    if log is None:
        raise bad("kafka.config_topic is null in the engine settings: there is no change log")
    end = log.end()
    last = admin.args.last
    if last is not None and last < 1:
        raise bad(f"--last must be >= 1, got {last}")
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
    if admin.args.output == "json":
        print_json(entries)
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
