"""Events in, Kafka's quota decisions out: the core that ``replay`` and every state shard run.

:meth:`QuotaCore.decide` takes a frame of accepted events (``state.events``) in input order and
returns one decision row per event, in the same order. For each quota type it resolves the limit
and the usage counter (entity) of every event, records the bytes in that type's
:class:`~state.rolling.RollingTable` and applies the quota's decision rule:

* produce / fetch (KIP-13): ``throttle_ms``, the delay Kafka would impose;
* remote_copy (KIP-956): ``throttle_ms`` is how long the broker's next segment upload waits, and
  ``partition_wait_ms`` how long the uploading partition's next one waits (``state.copy_fairness``);
* remote_fetch (KIP-956): ``skip_remote`` when the fetch quota is exceeded;
* leader / follower replication (KIP-73): no delay; bytes of throttled partitions count (in-sync
  or not) and ``leave_out`` marks a throttled, out-of-sync replica while the rate is over. The
  follower's fetches of unthrottled partitions are not recorded at all: no quota measures them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from state.config import QuotaConfig
from state.copy_fairness import (
    PARTITION_TABLE,
    Uploads,
    active_partitions,
    entity_of,
    fair_share,
    partition_keys,
    partition_wait_ms,
)
from state.encoding import KeptRows, StateDecodeError, StoredTables, encode_tables
from state.entities import broker_keys, client_keys
from state.event_contract import EventKind
from state.events import KIND_DTYPE, ROLE_DTYPE
from state.quota_rules import per_broker
from state.quota_types import CLIENT_QUOTA_TYPES, QuotaType
from state.resolution import NO_LEVEL, ClientPairs, QuotaResolver, Sharing
from state.rolling import Measurement, RollingTable
from state.throttle import throttle_ms
from state.window import WindowSpec, window_spec

Int64Array = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
ObjectArray = npt.NDArray[np.object_]

#: Decision columns every quota fills.
COMMON_COLUMNS = (
    "ts",
    "kind",
    "quota",
    "entity",
    "rate",
    "limit",  # NaN where unlimited
    "throttle_ms",
    "exceeded",
    "window_ms",
    "late",
)
#: Decision columns only some quotas fill.
QUOTA_COLUMNS: dict[QuotaType, tuple[str, ...]] = {
    QuotaType.PRODUCE: ("level",),  # 0 where no precedence level applies
    QuotaType.FETCH: ("level",),
    # The uploading partition and its fair wait; None and 0 for every other quota.
    QuotaType.REMOTE_COPY: ("partition_key", "partition_wait_ms"),
    QuotaType.REMOTE_FETCH: ("skip_remote",),
    QuotaType.LEADER_REPLICATION: ("throttled", "leave_out"),
    QuotaType.FOLLOWER_REPLICATION: ("throttled", "leave_out"),
}
#: Columns of :meth:`QuotaCore.resolve`'s frame: what :meth:`QuotaCore.record` needs.
RESOLVED_COLUMNS = (
    "position",
    "ts",
    "kind",
    "quota",
    "entity",
    "limit",  # inf where unlimited
    "level",
    "counted_bytes",
    "throttled",
    "in_sync",
    "partition_key",  # remote_copy: ``<entity>,topic=T,partition=P``; None for other quotas
)
DECISION_COLUMNS = (
    "position",
    *COMMON_COLUMNS,
    *dict.fromkeys(column for columns in QUOTA_COLUMNS.values() for column in columns),
)

_QUOTA_OF_KIND = {
    EventKind.PRODUCE: QuotaType.PRODUCE,
    EventKind.FETCH: QuotaType.FETCH,
    EventKind.REMOTE_COPY: QuotaType.REMOTE_COPY,
    EventKind.REMOTE_FETCH: QuotaType.REMOTE_FETCH,
}
_QUOTA_OF_ROLE = {
    "leader": QuotaType.LEADER_REPLICATION,
    "follower": QuotaType.FOLLOWER_REPLICATION,
}
_QUOTA_TYPES = list(QuotaType)
QUOTA_DTYPE = pd.CategoricalDtype([quota_type.value for quota_type in _QUOTA_TYPES])
_REPLICATION = (QuotaType.LEADER_REPLICATION, QuotaType.FOLLOWER_REPLICATION)
_COMPOSITE_LIMIT = 2**62
_MEASURED_COLUMNS = (
    "position",
    "ts",
    "bytes",
    "user",
    "client_id",
    "broker",
    "topic",
    "partition",
    "in_sync",
)
_QUOTA_OF_KIND_CODE = np.array(
    [
        _QUOTA_TYPES.index(_QUOTA_OF_KIND[EventKind(kind)]) if kind in _QUOTA_OF_KIND else -1
        for kind in KIND_DTYPE.categories
    ]
    + [-1],
    dtype=np.int64,
)
_QUOTA_OF_ROLE_CODE = np.array(
    [_QUOTA_TYPES.index(_QUOTA_OF_ROLE[role]) for role in ROLE_DTYPE.categories] + [-1],
    dtype=np.int64,
)


@dataclass(frozen=True)
class _Entities:
    keys: ObjectArray  # distinct entity keys
    of_event: Int64Array  # per event: index into keys
    limit: FloatArray  # per event, inf where unlimited
    level: Int64Array  # per event, client precedence level or 0


class QuotaCore:
    """Rolling windows for every quota type, and the rules that turn them into decisions."""

    def __init__(
        self,
        config: QuotaConfig,
        tables: dict[QuotaType, RollingTable] | None = None,
        copy_partitions: RollingTable | None = None,
    ):
        self.config = config
        self.resolver = QuotaResolver(config)
        self.tables = tables if tables is not None else self.empty_tables(config)
        #: Per-partition remote_copy usage (``partition_key`` entities), for the fair wait.
        self.copy_partitions = (
            copy_partitions
            if copy_partitions is not None
            else RollingTable(window_spec(config, QuotaType.REMOTE_COPY))
        )
        #: What a partial :meth:`restore` left encoded.
        self._unloaded: _Unloaded | None = None

    @staticmethod
    def empty_tables(config: QuotaConfig) -> dict[QuotaType, RollingTable]:
        return {
            quota_type: RollingTable(window_spec(config, quota_type)) for quota_type in QuotaType
        }

    @classmethod
    def restore(
        cls,
        config: QuotaConfig,
        state: bytes,
        touched: Mapping[QuotaType, npt.ArrayLike] | None = None,
    ) -> QuotaCore:
        """A core resuming from :meth:`encode_state`'s bytes.

        With ``touched`` (entities per quota type), only their windows are decoded, and every
        per-partition copy window (as many as the partitions uploading, not the clients); the
        other entities stay encoded, :meth:`encode_state` copies them through and
        :meth:`evict_idle` drops them by their clocks. Such a core records the touched entities
        only: a micro-batch then costs what it touches, not what the shard holds.
        """
        stored = StoredTables.decode(state)
        kept = np.ones(len(stored.clock), dtype=np.bool_)
        loaded: dict[QuotaType, pd.Index] = {}
        loaded_from: dict[str, Int64Array] = {}
        tables: dict[QuotaType, RollingTable] = {}
        for quota_type in QuotaType:
            name = quota_type.value
            if touched is None:
                rows = stored.rows(name)
            else:
                loaded[quota_type] = pd.Index(
                    pd.unique(np.asarray(touched.get(quota_type, []), dtype=object))
                )
                rows = stored.rows_of(name, loaded[quota_type].to_numpy())
                rows = rows[rows >= 0]
            kept[rows] = False
            loaded_from[name] = rows
            tables[quota_type] = _stored(stored, name, rows, window_spec(config, quota_type))
        # State kept before the per-partition table existed restores with an empty one.
        rows = stored.rows(PARTITION_TABLE)
        kept[rows] = False
        loaded_from[PARTITION_TABLE] = rows
        copy_partitions = _stored(
            stored, PARTITION_TABLE, rows, window_spec(config, QuotaType.REMOTE_COPY)
        )
        core = cls(config, tables, copy_partitions)
        if touched is not None:
            core._unloaded = _Unloaded(stored, kept, loaded, loaded_from)
        return core

    def encode_state(self) -> bytes:
        """Every table of this core as one compact blob (for one state store value), with the
        entities a partial :meth:`restore` left encoded."""
        named = {quota_type.value: table for quota_type, table in self.tables.items()}
        unloaded = self._unloaded
        kept = (
            None
            if unloaded is None
            else KeptRows(unloaded.stored, np.flatnonzero(unloaded.kept), unloaded.loaded_from)
        )
        return encode_tables({**named, PARTITION_TABLE: self.copy_partitions}, kept=kept)

    def decide(self, events: pd.DataFrame) -> pd.DataFrame:
        """Record ``events`` (input order) and return one decision per event, same order."""
        return self.record(self.resolve(events))

    def resolve(self, events: pd.DataFrame) -> pd.DataFrame:
        """Each event's quota, usage counter (entity), limit and counted bytes; no state.

        The streaming job runs this before the shuffle and groups by its ``entity``.
        """
        size = len(events)
        columns = {name: events[name].to_numpy() for name in _MEASURED_COLUMNS}
        quota_codes = _quota_codes(events["kind"], events["role"])
        limit = np.full(size, np.inf)
        level = np.zeros(size, dtype=np.int64)
        counted = columns["bytes"].astype(np.int64, copy=True)
        throttled = np.zeros(size, dtype=np.bool_)
        # Entities are collected as codes into each quota's distinct keys, and become one
        # categorical column at the end: no per-event string handling.
        entity_code = np.full(size, -1, dtype=np.int64)
        distinct_keys: list[ObjectArray] = []
        partition_code = np.full(size, -1, dtype=np.int64)
        partition_names = np.zeros(0, dtype=object)
        for code, quota_type in enumerate(_QUOTA_TYPES):
            rows = np.flatnonzero(quota_codes == code)
            if not len(rows):
                continue
            entities = self._entities(quota_type, rows, columns)
            entity_code[rows] = entities.of_event + sum(len(keys) for keys in distinct_keys)
            distinct_keys.append(entities.keys)
            limit[rows] = entities.limit
            level[rows] = entities.level
            if quota_type is QuotaType.REMOTE_COPY:
                partition_code[rows], partition_names = _copy_partitions(entities, rows, columns)
            if quota_type in _REPLICATION:
                in_list = self.resolver.replica_throttled(
                    leader=np.full(len(rows), quota_type is QuotaType.LEADER_REPLICATION),
                    topics=columns["topic"][rows].astype(object, copy=False),
                    partitions=columns["partition"][rows].astype(np.int64, copy=False),
                    brokers=columns["broker"][rows].astype(np.int64, copy=False),
                )
                throttled[rows] = in_list
                # Only throttled partitions' bytes count toward a replication quota (KIP-73).
                # The leader records every fetch's throttled share, possibly 0 B; the follower
                # (ReplicaFetcherThread) records only throttled partitions: its other fetches
                # are no quota's, and cannot open its window.
                counted[rows] = np.where(in_list, counted[rows], 0)
                if quota_type is QuotaType.FOLLOWER_REPLICATION:
                    unrecorded = rows[~in_list]
                    quota_codes[unrecorded] = -1
                    entity_code[unrecorded] = -1
                    limit[unrecorded] = np.inf
        return pd.DataFrame(
            {
                "position": columns["position"].astype(np.int64, copy=False),
                "ts": columns["ts"].astype(np.int64, copy=False),
                "kind": events["kind"].astype(KIND_DTYPE).array,
                "quota": _from_codes(quota_codes, QUOTA_DTYPE.categories),
                "entity": _categorical(entity_code, distinct_keys),
                "limit": limit,
                "level": level,
                "counted_bytes": counted,
                "throttled": throttled,
                "in_sync": columns["in_sync"].astype(np.bool_, copy=False),
                "partition_key": _from_codes(
                    partition_code, pd.Index(partition_names, dtype=object)
                ),
            },
            columns=list(RESOLVED_COLUMNS),
            # Not consolidated into 2-D blocks, which copies every column (0.1-0.25 s per 1M
            # events). The frame shares position, ts and in_sync with ``events``; neither is
            # written to in place.
            copy=False,
        )

    def record(self, resolved: pd.DataFrame) -> pd.DataFrame:
        """Record resolved events (input order) in the rolling windows and decide each one.

        ``resolved`` is :meth:`resolve`'s frame, or usage sums (``state.shard.USAGE_COLUMNS``):
        ``position``, ``kind``, ``throttled`` and ``in_sync`` are optional (row number, none,
        false, false).
        """
        return pd.DataFrame(self.record_columns(resolved), columns=list(DECISION_COLUMNS))

    def record_columns(self, resolved: pd.DataFrame) -> dict[str, Any]:
        """:meth:`record`'s decisions as columns (numpy arrays, and pandas arrays for
        ``kind``, ``quota``, ``entity`` and ``partition_key``): for a caller that picks a few
        rows, without the cost of a frame of them all."""
        size = len(resolved)
        quota = resolved["quota"].astype(QUOTA_DTYPE)
        quota_codes = quota.cat.codes.to_numpy()
        # Unsorted: the names are only looked up by code (sorting them costs more than hashing).
        entity_codes, entity_names = pd.factorize(resolved["entity"].to_numpy(dtype=object))
        ts = resolved["ts"].to_numpy().astype(np.int64, copy=False)
        counted = resolved["counted_bytes"].to_numpy().astype(np.int64, copy=False)
        limit = resolved["limit"].to_numpy().astype(np.float64, copy=False)
        exceeded = np.zeros(size, dtype=np.bool_)
        partition_key = resolved["partition_key"].array
        out: dict[str, Any] = {
            "position": _optional(resolved, "position"),
            "ts": ts,
            "kind": _optional(resolved, "kind"),
            "quota": quota.array,
            "entity": resolved["entity"].array,
            "rate": np.full(size, np.nan),
            "limit": np.where(np.isinf(limit), np.nan, limit),
            "throttle_ms": np.zeros(size, dtype=np.int64),
            "exceeded": exceeded,
            "window_ms": np.zeros(size, dtype=np.int64),
            "late": np.zeros(size, dtype=np.bool_),
            "level": resolved["level"].to_numpy(),
            "throttled": _optional(resolved, "throttled"),
            "leave_out": np.zeros(size, dtype=np.bool_),
            "skip_remote": np.zeros(size, dtype=np.bool_),
            "partition_key": partition_key,
            "partition_wait_ms": np.zeros(size, dtype=np.int64),
        }
        for code, quota_type in enumerate(_QUOTA_TYPES):
            rows = np.flatnonzero(quota_codes == code)
            if not len(rows):
                continue
            of_event, distinct = pd.factorize(entity_codes[rows])
            measured = self.tables[quota_type].record_and_measure(
                entity_names[distinct],
                of_event.astype(np.int64),
                ts[rows],
                counted[rows],
                # A partly restored table holds only restored entities: those it does not hold
                # yet must be restored ones it has never seen.
                admit=None
                if self._unloaded is None
                else functools.partial(self._unloaded.check_loaded, quota_type),
            )
            rate = measured.rate
            exceeded[rows] = rate > limit[rows]
            out["rate"][rows] = rate
            out["throttle_ms"][rows] = throttle_ms(rate, limit[rows], measured.window_size_ms)
            out["window_ms"][rows] = measured.window_size_ms
            out["late"][rows] = ~measured.recorded
            if quota_type is QuotaType.REMOTE_COPY:
                out["partition_wait_ms"][rows] = self._partition_wait(
                    resolved.iloc[rows], measured, out["throttle_ms"][rows]
                )
        replication = np.isin(quota_codes, [_QUOTA_TYPES.index(q) for q in _REPLICATION])
        in_sync = _optional(resolved, "in_sync").astype(np.bool_, copy=False)
        out["leave_out"] = replication & out["throttled"] & ~in_sync & exceeded
        out["skip_remote"] = (quota_codes == _QUOTA_TYPES.index(QuotaType.REMOTE_FETCH)) & exceeded
        return out

    def evict_idle(self, horizon_ms: int) -> int:
        """Forget entities whose windows are empty at ``horizon_ms``; returns how many."""
        named = {quota_type.value: table for quota_type, table in self.tables.items()}
        dropped = 0
        for name, table in {**named, PARTITION_TABLE: self.copy_partitions}.items():
            evicted = table.evict_idle(horizon_ms)
            if evicted and self._unloaded is not None:
                # Its rows moved up: the encoding finds where each was loaded from by its key.
                self._unloaded.loaded_from.pop(name, None)
            dropped += evicted
        if self._unloaded is not None:
            dropped += self._unloaded.evict_idle(horizon_ms)
        return dropped

    # ------------------------------------------------------------------ internals
    def _partition_wait(
        self, copies: pd.DataFrame, broker: Measurement, broker_throttle: Int64Array
    ) -> Int64Array:
        """``partition_wait_ms`` of resolved remote_copy rows whose broker was just measured.

        Records the keyed rows in the per-partition table; rows without a partition key wait
        for the broker only.
        """
        wait = broker_throttle.copy()
        key = copies["partition_key"].astype("category").cat
        key_codes = key.codes.to_numpy()
        keyed = np.flatnonzero(key_codes >= 0)
        if not len(keyed):
            return wait
        entity = copies["entity"].astype("category").cat
        group, group_names = _codes_of(entity.codes.to_numpy()[keyed], entity.categories)
        partition, partition_names = _codes_of(key_codes[keyed], key.categories)
        table = self.copy_partitions
        window, samples = table.spec.window_ms, table.spec.samples
        # The partitions of this batch's broker entities as they stood before it (copied: the
        # table updates clocks in place). Numbered after this batch's partitions if not in it.
        stored_keys, stored_clock, *_ = table.columns()
        stored_entity = pd.Index(entity_of(stored_keys.to_numpy(object)), dtype=object)
        stored_group = pd.Index(group_names).get_indexer(stored_entity)
        known = np.flatnonzero(stored_group >= 0)
        known_partition = pd.Index(partition_names).get_indexer(stored_keys[known])
        unseen = known_partition < 0
        known_partition[unseen] = len(partition_names) + np.arange(np.count_nonzero(unseen))
        known_sample = stored_clock[known] // window
        measured = table.record_and_measure(
            partition_names,
            partition,
            copies["ts"].to_numpy(dtype=np.int64)[keyed],
            copies["counted_bytes"].to_numpy(dtype=np.int64)[keyed],
        )
        active = active_partitions(
            Uploads(
                group=group,
                partition=partition,
                low=broker.clock_ms[keyed] // window - samples + 1,
                sample=measured.clock_ms // window,
                known_group=stored_group[known].astype(np.int64),
                known_partition=known_partition.astype(np.int64),
                known_sample=known_sample,
            )
        )
        limit = copies["limit"].to_numpy(dtype=np.float64)[keyed]
        wait[keyed] = partition_wait_ms(
            broker_throttle[keyed],
            measured.rate,
            fair_share(limit, active),
            measured.window_size_ms,
        )
        return wait

    def _entities(
        self, quota_type: QuotaType, rows: Int64Array, columns: dict[str, npt.NDArray[np.generic]]
    ) -> _Entities:
        brokers = columns["broker"][rows].astype(np.int64, copy=False)
        scoped = per_broker(self.config, quota_type)
        if quota_type in CLIENT_QUOTA_TYPES:
            return self._client_entities(
                quota_type,
                columns["user"][rows].astype(object, copy=False),
                columns["client_id"][rows].astype(object, copy=False),
                brokers if scoped else None,
            )
        return self._broker_entities(quota_type, brokers, scoped)

    def _client_entities(
        self,
        quota_type: QuotaType,
        users: ObjectArray,
        clients: ObjectArray,
        brokers: Int64Array | None,
    ) -> _Entities:
        user_code, user_names = _codes(users)
        client_code, client_names = _codes(clients)
        pair_of_event, pair_first = _combine(
            [(user_code, len(user_names)), (client_code, len(client_names))]
        )
        pair_user, pair_client = user_code[pair_first], client_code[pair_first]
        resolution = self.resolver.client(
            quota_type, ClientPairs(user_names, client_names, pair_user, pair_client)
        )
        # The sharing rule says which parts identify the counter: (user, client), user or client.
        sharing = resolution.sharing
        parts = [
            (np.where(sharing != Sharing.CLIENT, pair_user, -1)[pair_of_event], len(user_names)),
            (np.where(sharing != Sharing.USER, pair_client, -1)[pair_of_event], len(client_names)),
        ]
        if brokers is not None:
            broker_code, broker_ids = _codes(brokers)
            parts.append((broker_code, len(broker_ids)))
        counter_of_event, counter_first = _combine(parts)
        keys = client_keys(
            sharing[pair_of_event[counter_first]],
            users[counter_first],
            clients[counter_first],
            None if brokers is None else brokers[counter_first],
        )
        return _Entities(
            keys=keys,
            of_event=counter_of_event,
            limit=resolution.limit[pair_of_event],
            level=resolution.level[pair_of_event],
        )

    def _broker_entities(
        self, quota_type: QuotaType, brokers: Int64Array, per_broker: bool
    ) -> _Entities:
        limit = self.resolver.broker_limit(quota_type, brokers)
        level = np.full(len(brokers), NO_LEVEL, dtype=np.int64)
        if per_broker:
            of_event, distinct = pd.factorize(brokers)
            keys = broker_keys(np.asarray(distinct, dtype=np.int64))
            return _Entities(keys, of_event.astype(np.int64), limit, level)
        of_event = np.zeros(len(brokers), dtype=np.int64)
        return _Entities(broker_keys(None, size=1), of_event, limit, level)


#: The optional columns of :meth:`QuotaCore.record`'s input: their defaults, for a size.
_OPTIONAL: dict[str, Callable[[int], Any]] = {
    "position": lambda size: np.arange(size, dtype=np.int64),
    "kind": lambda size: _from_codes(np.full(size, -1, dtype=np.int64), KIND_DTYPE.categories),
    "throttled": lambda size: np.zeros(size, dtype=np.bool_),
    "in_sync": lambda size: np.zeros(size, dtype=np.bool_),
}


def _optional(resolved: pd.DataFrame, name: str) -> Any:
    """Optional column ``name`` of :meth:`QuotaCore.record`'s input, or its default (no new
    frame: assigning the defaults cost more than recording a tiny batch)."""
    if name not in resolved:
        return _OPTIONAL[name](len(resolved))
    column = resolved[name]
    return column.array if name == "kind" else column.to_numpy()


def _copy_partitions(
    entities: _Entities, rows: Int64Array, columns: dict[str, npt.NDArray[np.generic]]
) -> tuple[Int64Array, ObjectArray]:
    """Per remote_copy event: index into the distinct partition keys, and those keys."""
    topics = columns["topic"][rows].astype(object, copy=False)
    partitions = columns["partition"][rows].astype(np.int64, copy=False)
    topic_code, topic_names = _codes(topics)
    number_code, numbers = _codes(partitions)
    of_event, first = _combine(
        [
            (entities.of_event, len(entities.keys)),
            (topic_code, len(topic_names)),
            (number_code, len(numbers)),
        ]
    )
    keys = partition_keys(entities.keys[entities.of_event[first]], topics[first], partitions[first])
    return of_event, keys


def _stored(stored: StoredTables, name: str, rows: Int64Array, spec: WindowSpec) -> RollingTable:
    """The ``rows`` of stored table ``name``, or an empty table if the state has none; refuses
    other windows."""
    kept_spec = stored.specs.get(name)
    if kept_spec is None:
        return RollingTable(spec)
    if kept_spec != spec:
        raise StateDecodeError(
            f"{name} state was kept with {kept_spec.samples} samples of "
            f"{kept_spec.window_ms} ms, the configuration says {spec.samples} of "
            f"{spec.window_ms} ms"
        )
    return stored.table(name, rows)


@dataclass
class _Unloaded:
    """The stored entities a partial :meth:`QuotaCore.restore` did not decode."""

    stored: StoredTables
    kept: BoolArray  # per stored row: still held (not loaded, not evicted)
    loaded: dict[QuotaType, pd.Index]  # the entities decoded: the only ones recording may touch
    #: Per table: the stored row of each of its first rows (recording only appends rows); a
    #: table whose rows eviction moved is not named.
    loaded_from: dict[str, Int64Array]

    def check_loaded(self, quota_type: QuotaType, entities: ObjectArray) -> None:
        unknown = self.loaded[quota_type].get_indexer(pd.Index(entities, dtype=object)) < 0
        if unknown.any():
            raise ValueError(
                f"{quota_type.value} entities not restored for recording: "
                f"{entities[unknown][:3].tolist()}"
            )

    def evict_idle(self, horizon_ms: int) -> int:
        """As :meth:`RollingTable.evict_idle`, by the stored clocks."""
        dropped = 0
        for name, spec in self.stored.specs.items():
            rows = self.stored.rows(name)
            idle = self.kept[rows] & (
                self.stored.clock[rows] <= horizon_ms - spec.samples * spec.window_ms
            )
            self.kept[rows[idle]] = False
            dropped += int(np.count_nonzero(idle))
        return dropped


def _quota_codes(kinds: pd.Series, roles: pd.Series) -> Int64Array:
    """Index into ``_QUOTA_TYPES`` per event, -1 for events no quota measures."""
    kind_codes = kinds.astype(KIND_DTYPE).cat.codes.to_numpy()
    role_codes = roles.astype(ROLE_DTYPE).cat.codes.to_numpy()
    # Category code -1 (unknown or absent) lands on the last entry of each lookup: -1.
    quota: Int64Array = _QUOTA_OF_KIND_CODE[kind_codes]
    replication = kind_codes == KIND_DTYPE.categories.get_loc(EventKind.REPLICATION)
    quota[replication] = _QUOTA_OF_ROLE_CODE[role_codes[replication]]
    return quota


def _categorical(codes: Int64Array, distinct_keys: list[ObjectArray]) -> pd.Categorical:
    """One categorical over several quotas' keys (a key may recur across quotas)."""
    keys = np.concatenate(distinct_keys) if distinct_keys else np.zeros(0, dtype=object)
    unique_of_key, unique = pd.factorize(keys)
    # Code -1 (no entity) indexes the appended -1.
    lookup = np.append(unique_of_key, -1)
    return _from_codes(lookup[codes], pd.Index(unique, dtype=object))


def _from_codes(codes: Int64Array, categories: pd.Index) -> pd.Categorical:
    # pandas-stubs 2.3 types `codes` as Sequence[int]; pandas takes integer arrays.
    return pd.Categorical.from_codes(codes, categories=categories)  # type: ignore[arg-type]


def _codes(values: npt.NDArray[np.generic]) -> tuple[Int64Array, ObjectArray]:
    codes, distinct = pd.factorize(values)
    return codes.astype(np.int64), np.asarray(distinct)


def _codes_of(
    codes: npt.NDArray[np.integer], categories: pd.Index
) -> tuple[Int64Array, ObjectArray]:
    """Like :func:`_codes` for the values of categorical codes (none of them -1)."""
    of_value, distinct = pd.factorize(codes)
    return of_value.astype(np.int64), categories.to_numpy(dtype=object)[distinct]


def _combine(columns: list[tuple[Int64Array, int]]) -> tuple[Int64Array, Int64Array]:
    """Codes of the distinct tuples of code columns, and the first row of each tuple.

    Each column is ``(codes, cardinality)`` with codes in ``[-1, cardinality)``.
    """
    combined = np.zeros(len(columns[0][0]), dtype=np.int64)
    bound = 1
    for codes, cardinality in columns:
        if bound * (cardinality + 1) >= _COMPOSITE_LIMIT:
            combined = pd.factorize(combined)[0].astype(np.int64, copy=False)
            bound = int(combined.max(initial=0)) + 1
        combined = combined * (cardinality + 1) + (codes + 1)
        bound *= cardinality + 1
    combined = pd.factorize(combined)[0].astype(np.int64, copy=False)
    # Factorize numbers codes by first appearance, so writing positions backwards leaves each
    # code's first row.
    first = np.zeros(int(combined.max(initial=-1)) + 1, dtype=np.int64)
    first[combined[::-1]] = np.arange(len(combined) - 1, -1, -1, dtype=np.int64)
    return combined, first
