"""Which quota applies to whom: the rules, written once, and their scalar form for one client.

Client quotas follow Kafka's ``DefaultQuotaCallback`` (``docs/semantics.md`` §3) in its two
steps. ``quotaMetricTags`` names the usage counter: the first of the eight precedence levels
(:data:`LEVELS`) with a quota of the asked type decides who shares it, (user, client-id), user or
client-id; when only one kind of quota is configured for the type, every client is grouped by
that kind, the unlimited ones too. ``quotaLimit`` then reads the limit from those tags
(:data:`LIMIT_LEVELS`): an empty client-id in the tags sends the lookup to the user's levels,
whatever level matched. Both steps depend only on which levels configure a quota for the client
and whether its client-id is empty: :meth:`ClientRates.choose` is that rule, and the only one.

This module walks the rules for one client (``QuotaRules.client``: what an enforcement agent
and ``quota describe`` ask); ``state.resolution`` walks the same tables and the same
:meth:`ClientRates.choose` for many clients at once (the core). An entity set ``exempt`` is
unlimited at its level (:func:`is_exempt`); a broker quota is the broker's override, else the
``<default>`` entry, else unlimited (:func:`broker_limit`).

It imports no numpy, pandas or pyarrow: an agent resolves a client in microseconds without them.
"""

from __future__ import annotations

import functools
from collections.abc import Container
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Final, Literal, overload

from state.config import DEFAULT, QuotaConfig
from state.live_config import Mode, decision_mode
from state.quota_types import CLIENT_QUOTA_TYPES, QuotaType

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

UNLIMITED: Final = float("inf")
#: Level reported when no level sets the quota: unlimited, one counter per client-id.
NO_LEVEL: Final = 0
#: Clients whose resolution a :class:`QuotaRules` remembers by default (about 40 MB when full).
REMEMBERED_CLIENTS: Final = 100_000


class Sharing(IntEnum):
    """Who shares one usage counter under a precedence level."""

    USER_AND_CLIENT = 1
    USER = 2
    CLIENT = 3


#: What an entity names at one of its two levels: a name, ``<default>``, or nothing.
Slot = Literal["name", "default", "none"]


@dataclass(frozen=True)
class Level:
    number: int
    user: Slot
    client: Slot
    sharing: Sharing

    def entity(self, user: str, client_id: str) -> tuple[str | None, str | None]:
        """The configured entity that would give ``(user, client_id)`` its quota here."""
        return _named(self.user, user), _named(self.client, client_id)


#: Kafka's precedence, first match wins (``DefaultQuotaCallback.quotaMetricTags``).
LEVELS: Final = (
    Level(1, "name", "name", Sharing.USER_AND_CLIENT),
    Level(2, "name", "default", Sharing.USER_AND_CLIENT),
    Level(3, "name", "none", Sharing.USER),
    Level(4, "default", "name", Sharing.USER_AND_CLIENT),
    Level(5, "default", "default", Sharing.USER_AND_CLIENT),
    Level(6, "default", "none", Sharing.USER),
    Level(7, "none", "name", Sharing.CLIENT),
    Level(8, "none", "default", Sharing.CLIENT),
)
#: ``quotaLimit``: the levels looked up, in order, for the metric tags a counter has.
LIMIT_LEVELS: Final = {
    Sharing.USER_AND_CLIENT: (1, 2, 4, 5),
    Sharing.USER: (3, 6),
    Sharing.CLIENT: (7, 8),
}
#: The parts of a client counter's key under each sharing (``state.entities.client_keys`` writes
#: the same keys for many counters at once).
KEY_PARTS: Final = {
    Sharing.USER_AND_CLIENT: ("user", "client-id"),
    Sharing.USER: ("user",),
    Sharing.CLIENT: ("client-id",),
}
#: How names are percent-escaped in keys, so that a key always splits back into its parts.
ESCAPES: Final = (("%", "%25"), (",", "%2C"), ("=", "%3D"))  # "%" first: escapes stay intact


class _Kind(IntEnum):
    """``ClientQuotaManager.QuotaTypes``: which kinds of client quota are configured."""

    USER_AND_CLIENT = 1
    USER = 2
    CLIENT = 3


#: ``quotaMetricTags`` without the walk: none or one kind of quota configured.
_SINGLE_KIND = {
    frozenset(): Sharing.CLIENT,
    frozenset({_Kind.CLIENT}): Sharing.CLIENT,
    frozenset({_Kind.USER}): Sharing.USER,
    frozenset({_Kind.USER_AND_CLIENT}): Sharing.USER_AND_CLIENT,
}


def _named(slot: Slot, name: str) -> str | None:
    return name if slot == "name" else DEFAULT if slot == "default" else None


def _slot(name: str | None) -> Slot:
    return "none" if name is None else "default" if name == DEFAULT else "name"


class ClientRates:
    """One client quota type's configured rates, by precedence level: what both forms walk."""

    def __init__(self, config: QuotaConfig, quota_type: QuotaType) -> None:
        #: Per level (index ``number - 1``): configured entity -> rate (``inf`` when exempt).
        self.by_level: tuple[dict[tuple[str | None, str | None], float], ...] = tuple(
            {} for _ in LEVELS
        )
        kinds: set[_Kind] = set()
        for quota in config.clients:
            rate = quota.rate_for(quota_type)
            if rate is None:
                continue
            slots = (_slot(quota.user), _slot(quota.client_id))
            number = next(level.number for level in LEVELS if (level.user, level.client) == slots)
            self.by_level[number - 1][quota.entity] = rate
            kinds.add(
                _Kind.CLIENT
                if quota.user is None
                else _Kind.USER
                if quota.client_id is None
                else _Kind.USER_AND_CLIENT
            )
        #: ``quotaMetricTags`` when at most one kind of quota is configured, else None (walk).
        self.single_kind = _SINGLE_KIND.get(frozenset(kinds))
        self._configured = tuple(
            (level, rates) for level, rates in zip(LEVELS, self.by_level, strict=True) if rates
        )

    def choose(self, present: Container[int], empty_client: bool) -> tuple[int, Sharing]:
        """The level whose rate is the limit (or :data:`NO_LEVEL`) and the counter's sharing, for
        a client whose ``present`` levels configure a rate; ``empty_client``: its client-id is
        ``""`` (users are never empty)."""
        sharing = self.single_kind
        if sharing is None:
            matched = next((level for level in LEVELS if level.number in present), None)
            sharing = Sharing.CLIENT if matched is None else matched.sharing
        if empty_client:
            # quotaLimit: tags with an empty client-id are the user's; tags of only an empty
            # client-id find no quota.
            if sharing is Sharing.CLIENT:
                return NO_LEVEL, sharing
            sharing = Sharing.USER
        return next((n for n in LIMIT_LEVELS[sharing] if n in present), NO_LEVEL), sharing

    def resolve(self, user: str, client_id: str) -> tuple[int, float, Sharing]:
        """Level, limit and sharing of one client."""
        present: dict[int, float] = {}
        for level, rates in self._configured:
            if (rate := rates.get(level.entity(user, client_id))) is not None:
                present[level.number] = rate
        number, sharing = self.choose(present, client_id == "")
        return number, present.get(number, UNLIMITED), sharing


@overload
def is_exempt(level: int, limit: float) -> bool: ...
@overload
def is_exempt(
    level: npt.NDArray[np.int64], limit: npt.NDArray[np.float64]
) -> npt.NDArray[np.bool_]: ...
def is_exempt(level: Any, limit: Any) -> Any:
    """An exempt entity's quota: a level sets it, and it is unlimited (one client or arrays)."""
    return (level != NO_LEVEL) & (limit == UNLIMITED)


BrokerSource = Literal["override", "default"] | None


def broker_limit(
    config: QuotaConfig, quota_type: QuotaType, broker: int
) -> tuple[float, BrokerSource]:
    """A broker quota's limit on ``broker``, and where it comes from: the broker's override,
    else the ``<default>`` entry, else unlimited (None)."""
    override, default = config.brokers.get(broker), config.brokers.get(DEFAULT)
    if override is not None and (rate := override.rate_for(quota_type)) is not None:
        return rate, "override"
    if default is not None and (rate := default.rate_for(quota_type)) is not None:
        return rate, "default"
    return UNLIMITED, None


def per_broker(config: QuotaConfig, quota_type: QuotaType) -> bool:
    """Whether each broker measures the quota on its own (its counters end in ``broker=N``)."""
    return config.quota_types.of(quota_type).scope == "broker"


def escape(name: str) -> str:
    """A name as an entity key holds it (percent-escaped, so the key splits back)."""
    for raw, code in ESCAPES:
        if raw in name:
            name = name.replace(raw, code)
    return name


def client_key(sharing: Sharing, user: str, client_id: str, broker: int | None) -> str:
    """A client counter's key (``user=alice,client-id=app1,broker=1``); ``broker`` None: the key
    without its broker part."""
    names = {"user": user, "client-id": client_id}
    parts = [f"{part}={escape(names[part])}" for part in KEY_PARTS[sharing]]
    if broker is not None:
        parts.append(f"broker={broker}")
    return ",".join(parts)


@dataclass(frozen=True, slots=True)
class Resolved:
    """One client's quota of one type."""

    entity: str  # its usage counter's key
    limit: float  # bytes/s, inf where unlimited
    level: int  # 1..8: the level whose quota is the limit; NO_LEVEL
    exempt: bool
    mode: Mode  # whether its decisions bind
    sharing: Sharing  # who shares the counter
    #: The configured entity whose quota is the limit: (user, client_id), None where no level.
    configured: tuple[str | None, str | None] | None


class QuotaRules:
    """The rules of one :class:`QuotaConfig`, ready to resolve clients one at a time.

    The rules never change (a new configuration is a new ``QuotaRules``), so each client's
    resolution is remembered: an agent asks about the same clients request after request, and a
    remembered one costs a dict lookup instead of the walk. The least recently asked are
    forgotten beyond ``remembered`` clients.
    """

    def __init__(self, config: QuotaConfig, remembered: int = REMEMBERED_CLIENTS) -> None:
        self.config = config
        self.client_rates = {q: ClientRates(config, q) for q in CLIENT_QUOTA_TYPES}
        self._per_broker = {q: per_broker(config, q) for q in CLIENT_QUOTA_TYPES}
        #: ``decision_mode`` of each client quota type, for an entity not exempt and an exempt one.
        self.modes = {
            q: (decision_mode(config, q, exempt=False), decision_mode(config, q, exempt=True))
            for q in CLIENT_QUOTA_TYPES
        }
        self._remembered = functools.lru_cache(maxsize=remembered)(self.resolve)

    def client(
        self, quota_type: QuotaType, user: str, client_id: str, broker: int | None
    ) -> Resolved:
        """A client's quota of ``quota_type`` (a client quota) on ``broker``; with ``broker``
        None, its counter's key has no broker part. Remembered: :meth:`resolve`'s answer."""
        return self._remembered(quota_type, user, client_id, broker)

    def resolve(
        self, quota_type: QuotaType, user: str, client_id: str, broker: int | None
    ) -> Resolved:
        """:meth:`client`, walked through the rules every time."""
        level, limit, sharing = self.client_rates[quota_type].resolve(user, client_id)
        exempt = is_exempt(level, limit)
        scoped = broker if self._per_broker[quota_type] else None
        return Resolved(
            entity=client_key(sharing, user, client_id, scoped),
            limit=limit,
            level=level,
            exempt=exempt,
            mode=self.modes[quota_type][exempt],
            sharing=sharing,
            configured=None if level == NO_LEVEL else LEVELS[level - 1].entity(user, client_id),
        )
