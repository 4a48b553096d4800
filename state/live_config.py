"""The live quota configuration: the YAML file as version 0, then a log of changes.

An operator's change (``quotastream quota set ...``) is one record appended to a log; version
``n`` is the YAML configuration with the first ``n`` records applied in order. Versions never
change once written, so a micro-batch that pins a version decides the same way when it is
replayed. A record that is unreadable, or whose result would be an invalid configuration, is
skipped (and remembered with its reason): the log is shared, and one bad record must not stop
the engine or hide the ones after it.

Changes are partial updates in the manner of ``kafka-configs.sh --alter --add-config /
--delete-config``: they name an entity and the keys they set or remove, so two operators changing
different entities never overwrite each other's work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, Literal, Protocol

import msgspec

from state.config import QuotaConfig, parse_quota_config
from state.configfile import ConfigError
from state.quota_types import QuotaType

CLIENT_KEYS: Final = ("producer_byte_rate", "consumer_byte_rate", "exempt")
BROKER_KEYS: Final = (
    "remote.log.manager.copy.max.bytes.per.second",
    "remote.log.manager.fetch.max.bytes.per.second",
    "leader.replication.throttled.rate",
    "follower.replication.throttled.rate",
)
TOPIC_KEYS: Final = (
    "leader.replication.throttled.replicas",
    "follower.replication.throttled.replicas",
)


class Mode(StrEnum):
    """Whether a decision binds, and if not, why."""

    ENFORCED = "enforced"
    SHADOW = "shadow"  # its quota type is in shadow mode
    EXEMPT = "exempt"  # its entity is exempt
    DISABLED = "disabled"  # enforcement is off globally


def decision_mode(config: QuotaConfig, quota_type: QuotaType, exempt: bool) -> Mode:
    """The mode of a decision of ``quota_type`` for an entity (exempt or not) under ``config``."""
    if not config.enforcement.enabled:
        return Mode.DISABLED
    if quota_type in config.enforcement.shadow:
        return Mode.SHADOW
    return Mode.EXEMPT if exempt else Mode.ENFORCED


class _Change(msgspec.Struct, tag_field="op", kw_only=True, forbid_unknown_fields=True):
    #: When it was made (epoch ms) and by whom: the audit trail ``quota history`` prints.
    at_ms: int = 0
    by: str = ""


class SetClientQuota(_Change, tag="set_client", kw_only=True):
    """Sets keys of one client entity (creating it); ``user``/``client_id`` as in the YAML."""

    user: str | None = None
    client_id: str | None = None
    values: dict[str, float | bool]


class DeleteClientQuota(_Change, tag="delete_client", kw_only=True):
    """Removes keys of one client entity (all of them: the whole entity)."""

    user: str | None = None
    client_id: str | None = None
    keys: list[str] | None = None


class SetBrokerQuota(_Change, tag="set_broker", kw_only=True):
    """Sets (a number) or removes (null) broker config keys of one broker or ``<default>``."""

    broker: int | Literal["<default>"]
    values: dict[str, float | None]


class SetTopicThrottles(_Change, tag="set_topic", kw_only=True):
    """Sets a topic's throttled-replica lists; ``""`` removes one."""

    topic: str
    values: dict[str, str]


class SetEnforcement(_Change, tag="set_enforcement", kw_only=True):
    """Turns enforcement on or off globally, and/or quota types' shadow mode on or off."""

    enabled: bool | None = None
    shadow: dict[str, bool] = {}


Change = SetClientQuota | DeleteClientQuota | SetBrokerQuota | SetTopicThrottles | SetEnforcement
_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Change)


def encode_change(change: Change) -> bytes:
    return _ENCODER.encode(change)


def decode_change(data: bytes) -> Change:
    """A change record; :class:`ConfigError` says why one cannot be read."""
    try:
        change: Change = _DECODER.decode(data)
        return change
    except msgspec.DecodeError as exc:
        raise ConfigError(f"unreadable change: {exc}") from None


def config_document(config: QuotaConfig) -> dict[str, Any]:
    """``config`` as the JSON-ready mapping ``parse_quota_config`` reads back: the quota file's
    names, defaults left out. Changes are applied to it; the engine publishes it to agents."""
    return config.model_dump(by_alias=True, mode="json", exclude_defaults=True)


def apply_change(config: QuotaConfig, change: Change) -> QuotaConfig:
    """``config`` with ``change`` applied, validated in full (:class:`ConfigError` if invalid)."""
    data = config_document(config)
    _APPLY[type(change)](data, change)
    return parse_quota_config(data, f"after {describe_change(change)}")


def describe_change(change: Change) -> str:
    """One line for logs and errors."""
    if isinstance(change, SetClientQuota | DeleteClientQuota):
        entity = client_entity_name(change.user, change.client_id)
        if isinstance(change, SetClientQuota):
            return f"set {entity}: " + ", ".join(f"{k}={v}" for k, v in change.values.items())
        keys = "every key" if change.keys is None else ", ".join(change.keys) or "no key"
        return f"delete {entity}: {keys}"
    if isinstance(change, SetBrokerQuota):
        settings = (f"{k}={'(removed)' if v is None else v}" for k, v in change.values.items())
        return f"set broker {change.broker}: " + ", ".join(settings)
    if isinstance(change, SetTopicThrottles):
        return f"set topic {change.topic}: " + ", ".join(
            f"{k}={v!r}" for k, v in change.values.items()
        )
    switches = [] if change.enabled is None else [f"enabled={change.enabled}"]
    switches += [f"shadow.{quota}={on}" for quota, on in change.shadow.items()]
    return "set enforcement: " + ", ".join(switches)


def client_entity_name(user: str | None, client_id: str | None) -> str:
    parts = [] if user is None else [f"user={user}"]
    parts += [] if client_id is None else [f"client-id={client_id}"]
    return ",".join(parts) or "(no entity)"


def _set_client(data: dict[str, Any], change: SetClientQuota) -> None:
    _check_keys(change.values, CLIENT_KEYS, "client quota")
    clients: list[dict[str, Any]] = data.setdefault("clients", [])
    entry = _client_entry(clients, change.user, change.client_id)
    if entry is None:
        entry = {k: v for k, v in (("user", change.user), ("client_id", change.client_id)) if v}
        clients.append(entry)
    if change.values.get("exempt") is True:
        # Exempt and a rate cannot coexist: exempting an entity replaces its rates.
        entry.pop("producer_byte_rate", None)
        entry.pop("consumer_byte_rate", None)
    elif "exempt" not in change.values and any(k in change.values for k in CLIENT_KEYS[:2]):
        entry.pop("exempt", None)
    entry.update(change.values)
    if entry.get("exempt") is False:
        del entry["exempt"]


def _delete_client(data: dict[str, Any], change: DeleteClientQuota) -> None:
    if change.keys is not None:
        _check_keys(dict.fromkeys(change.keys), CLIENT_KEYS, "client quota")
    clients: list[dict[str, Any]] = data.get("clients", [])
    entry = _client_entry(clients, change.user, change.client_id)
    if entry is None:
        name = client_entity_name(change.user, change.client_id)
        raise ConfigError(f"no quota is set for {name}")
    for key in change.keys if change.keys is not None else CLIENT_KEYS:
        entry.pop(key, None)
    if not any(key in entry for key in CLIENT_KEYS):
        clients.remove(entry)


def _set_broker(data: dict[str, Any], change: SetBrokerQuota) -> None:
    _check_keys(change.values, BROKER_KEYS, "broker quota")
    brokers: dict[str, dict[str, Any]] = data.setdefault("brokers", {})
    name = str(change.broker)
    entry = brokers.setdefault(name, {})
    for key, value in change.values.items():
        if value is None:
            entry.pop(key, None)
        else:
            entry[key] = value
    if not entry:
        del brokers[name]


def _set_topic(data: dict[str, Any], change: SetTopicThrottles) -> None:
    _check_keys(change.values, TOPIC_KEYS, "topic throttle")
    topics: dict[str, dict[str, Any]] = data.setdefault("topics", {})
    entry = topics.setdefault(change.topic, {})
    entry.update(change.values)
    if not any(entry.values()):
        del topics[change.topic]


def _set_enforcement(data: dict[str, Any], change: SetEnforcement) -> None:
    enforcement: dict[str, Any] = data.setdefault("enforcement", {})
    if change.enabled is not None:
        enforcement["enabled"] = change.enabled
    shadow = set(enforcement.get("shadow", []))
    for quota, on in change.shadow.items():
        if quota not in {q.value for q in QuotaType}:
            known = ", ".join(q.value for q in QuotaType)
            raise ConfigError(f"shadow: unknown quota type {quota!r} (one of {known})")
        shadow = shadow | {quota} if on else shadow - {quota}
    enforcement["shadow"] = sorted(shadow)


_APPLY: Final[dict[type[Any], Callable[[dict[str, Any], Any], None]]] = {
    SetClientQuota: _set_client,
    DeleteClientQuota: _delete_client,
    SetBrokerQuota: _set_broker,
    SetTopicThrottles: _set_topic,
    SetEnforcement: _set_enforcement,
}


def _client_entry(
    clients: list[dict[str, Any]], user: str | None, client_id: str | None
) -> dict[str, Any] | None:
    return next(
        (c for c in clients if (c.get("user"), c.get("client_id")) == (user, client_id)), None
    )


def _check_keys(values: Mapping[str, object], allowed: Sequence[str], what: str) -> None:
    for key in values:
        if key not in allowed:
            raise ConfigError(f"{key!r} is not a {what} key (one of {', '.join(allowed)})")


@dataclass(frozen=True)
class SkippedChange:
    version: int  # the version whose record it was
    reason: str


@dataclass(frozen=True)
class LiveConfig:
    """One version of the live configuration."""

    version: int
    config: QuotaConfig
    skipped: tuple[SkippedChange, ...] = ()

    def advanced(self, records: Iterable[bytes]) -> LiveConfig:
        """The versions after this one: ``records`` are the log's next records, in order."""
        version, config, skipped = self.version, self.config, list(self.skipped)
        for record in records:
            version += 1
            try:
                config = apply_change(config, decode_change(record))
            except ConfigError as exc:
                skipped.append(SkippedChange(version, str(exc)))
        return LiveConfig(version, config, tuple(skipped))


class ConfigVersions(Protocol):
    """Anything that gives the live configuration at a version."""

    def at(self, version: int) -> LiveConfig: ...


#: Reads the log's records at positions ``[start, end)``.
RecordReader = Callable[[int, int], Sequence[bytes]]


class LiveConfigs:
    """Versions of the live configuration, read from the log on demand and cached.

    Batches ask for the newest version almost always, so the newest is kept and moved forward
    by the records added since; an older version (a replayed batch) is rebuilt from the base.
    """

    def __init__(self, base: QuotaConfig, read: RecordReader, keep: int = 4) -> None:
        self.base = LiveConfig(0, base)
        self._read = read
        self._keep = keep
        self._versions: dict[int, LiveConfig] = {0: self.base}

    def at(self, version: int) -> LiveConfig:
        if version < 0:
            raise ValueError(f"config versions start at 0, got {version}")
        found = self._versions.get(version)
        if found is not None:
            return found
        start = max((v for v in self._versions if v < version), default=0)
        records = self._read(start, version)
        if len(records) != version - start:
            raise LookupError(
                f"config version {version} needs log records {start}..{version - 1}, "
                f"the log gave {len(records)}"
            )
        live = self._versions[start].advanced(records)
        self._versions[version] = live
        for old in sorted(v for v in self._versions if v != 0)[: -self._keep]:
            del self._versions[old]
        return live
