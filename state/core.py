"""Events in, Kafka's quota decisions out: the core that ``replay`` and every state shard run.

:meth:`QuotaCore.decide` takes a frame of accepted events (``state.events``) in input order and
returns one decision row per event, in the same order. For each quota type it resolves the limit
and the usage counter (entity) of every event, records the bytes in that type's
:class:`~state.rolling.RollingTable` and applies the quota's decision rule:

* produce / fetch (KIP-13): ``throttle_ms``, the delay Kafka would impose;
* remote_copy (KIP-956): ``throttle_ms`` is how long the next segment upload waits;
* remote_fetch (KIP-956): ``skip_remote`` when the fetch quota is exceeded;
* leader / follower replication (KIP-73): no delay; bytes of throttled partitions count (in-sync
  or not) and ``leave_out`` marks a throttled, out-of-sync replica while the rate is over.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from state.config import QuotaConfig
from state.entities import broker_keys, client_keys
from state.events import EventKind
from state.quota_types import CLIENT_QUOTA_TYPES, WINDOW_RULE, QuotaType
from state.resolution import NO_LEVEL, QuotaResolver
from state.rolling import RollingTable, WindowSpec
from state.throttle import throttle_ms

Int64Array = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
ObjectArray = npt.NDArray[np.object_]

#: Columns of a decision frame; ``limit`` is NaN where unlimited, ``level`` 0 where not a client
#: quota or no level applies.
DECISION_COLUMNS = (
    "position",
    "ts",
    "kind",
    "quota",
    "entity",
    "rate",
    "limit",
    "throttle_ms",
    "exceeded",
    "window_ms",
    "late",
    "level",
    "throttled",
    "leave_out",
    "skip_remote",
)

_QUOTA_OF_KIND = {
    EventKind.PRODUCE: QuotaType.PRODUCE,
    EventKind.FETCH: QuotaType.FETCH,
    EventKind.REMOTE_COPY: QuotaType.REMOTE_COPY,
    EventKind.REMOTE_FETCH: QuotaType.REMOTE_FETCH,
}


@dataclass(frozen=True)
class _Entities:
    keys: ObjectArray  # distinct entity keys
    of_event: Int64Array  # per event: index into keys
    limit: FloatArray  # per event, inf where unlimited
    level: Int64Array  # per event, client precedence level or 0


class QuotaCore:
    """Rolling windows for every quota type, and the rules that turn them into decisions."""

    def __init__(self, config: QuotaConfig, tables: dict[QuotaType, RollingTable] | None = None):
        self.config = config
        self.resolver = QuotaResolver(config)
        self.tables = tables if tables is not None else self.empty_tables(config)

    @staticmethod
    def empty_tables(config: QuotaConfig) -> dict[QuotaType, RollingTable]:
        return {
            quota_type: RollingTable(
                WindowSpec(
                    samples=config.quota_types.of(quota_type).samples,
                    window_ms=config.quota_types.of(quota_type).window_ms,
                    rule=WINDOW_RULE[quota_type],
                )
            )
            for quota_type in QuotaType
        }

    def decide(self, events: pd.DataFrame) -> pd.DataFrame:
        """Record ``events`` (input order) and return one decision per event, same order."""
        size = len(events)
        columns = {name: events[name].to_numpy() for name in events.columns}
        out = _empty_decisions(columns, size)
        for quota_type, rows in _rows_by_quota(columns["kind"], columns["role"]):
            self._decide_quota(quota_type, rows, columns, out)
        return pd.DataFrame(out, columns=list(DECISION_COLUMNS))

    def evict_idle(self, horizon_ms: int) -> int:
        """Forget entities whose windows are empty at ``horizon_ms``; returns how many."""
        return sum(table.evict_idle(horizon_ms) for table in self.tables.values())

    # ------------------------------------------------------------------ internals
    def _decide_quota(
        self,
        quota_type: QuotaType,
        rows: Int64Array,
        columns: dict[str, npt.NDArray[np.generic]],
        out: dict[str, npt.NDArray[np.generic]],
    ) -> None:
        ts = columns["ts"][rows].astype(np.int64)
        nbytes = columns["bytes"][rows].astype(np.int64)
        brokers = columns["broker"][rows].astype(np.int64)
        per_broker = self.config.quota_types.of(quota_type).scope == "broker"
        if quota_type in CLIENT_QUOTA_TYPES:
            entities = self._client_entities(
                quota_type,
                columns["user"][rows].astype(object),
                columns["client_id"][rows].astype(object),
                brokers if per_broker else None,
            )
        else:
            entities = self._broker_entities(quota_type, brokers, per_broker)

        throttled = np.zeros(len(rows), dtype=np.bool_)
        replication = quota_type in (QuotaType.LEADER_REPLICATION, QuotaType.FOLLOWER_REPLICATION)
        if replication:
            throttled = self.resolver.replica_throttled(
                leader=np.full(len(rows), quota_type is QuotaType.LEADER_REPLICATION),
                topics=columns["topic"][rows].astype(object),
                partitions=columns["partition"][rows].astype(np.int64),
                brokers=brokers,
            )
            # Only throttled partitions' bytes count toward a replication quota (KIP-73).
            nbytes = np.where(throttled, nbytes, 0)

        measured = self.tables[quota_type].record_and_measure(
            entities.keys, entities.of_event, ts, nbytes
        )
        rate = measured.rate
        delay = throttle_ms(rate, entities.limit, measured.window_size_ms)
        exceeded = rate > entities.limit

        out["quota"][rows] = quota_type.value
        out["entity"][rows] = entities.keys[entities.of_event]
        out["rate"][rows] = rate
        out["limit"][rows] = np.where(np.isinf(entities.limit), np.nan, entities.limit)
        out["throttle_ms"][rows] = delay
        out["exceeded"][rows] = exceeded
        out["window_ms"][rows] = measured.window_size_ms
        out["late"][rows] = ~measured.recorded
        out["level"][rows] = entities.level
        if replication:
            in_sync = columns["in_sync"][rows].astype(np.bool_)
            out["throttled"][rows] = throttled
            out["leave_out"][rows] = throttled & ~in_sync & exceeded
        if quota_type is QuotaType.REMOTE_FETCH:
            out["skip_remote"][rows] = exceeded

    def _client_entities(
        self,
        quota_type: QuotaType,
        users: ObjectArray,
        clients: ObjectArray,
        brokers: Int64Array | None,
    ) -> _Entities:
        parts: list[npt.NDArray[np.generic]] = [users, clients]
        if brokers is not None:
            parts.append(brokers)
        combo_of_event, combo_first = _factorize_rows(parts)
        resolution = self.resolver.client(quota_type, users[combo_first], clients[combo_first])
        combo_keys = client_keys(
            resolution.sharing,
            users[combo_first],
            clients[combo_first],
            None if brokers is None else brokers[combo_first],
        )
        # Different (user, client) pairs can share one counter (e.g. all clients of a user).
        key_of_combo, keys = pd.factorize(combo_keys)
        return _Entities(
            keys=np.asarray(keys, dtype=object),
            of_event=key_of_combo[combo_of_event].astype(np.int64),
            limit=resolution.limit[combo_of_event],
            level=resolution.level[combo_of_event],
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


def _rows_by_quota(kind: ObjectArray, role: ObjectArray) -> Iterator[tuple[QuotaType, Int64Array]]:
    for event_kind, quota_type in _QUOTA_OF_KIND.items():
        rows = np.flatnonzero(kind == event_kind)
        if len(rows):
            yield quota_type, rows
    replication = kind == EventKind.REPLICATION
    for role_name, quota_type in (
        ("leader", QuotaType.LEADER_REPLICATION),
        ("follower", QuotaType.FOLLOWER_REPLICATION),
    ):
        rows = np.flatnonzero(replication & (role == role_name))
        if len(rows):
            yield quota_type, rows


def _factorize_rows(parts: list[npt.NDArray[np.generic]]) -> tuple[Int64Array, Int64Array]:
    """Codes of the distinct value tuples, and the first row where each occurs."""
    combined = np.zeros(len(parts[0]), dtype=np.int64)
    for column in parts:
        codes, distinct = pd.factorize(column)
        combined = combined * len(distinct) + codes
        # Re-factorize so the running product stays small however many columns are combined.
        combined, _ = pd.factorize(combined)
        combined = combined.astype(np.int64)
    # Factorize numbers codes by first appearance, so writing positions backwards leaves each
    # code's first row.
    first = np.zeros(int(combined.max(initial=-1)) + 1, dtype=np.int64)
    first[combined[::-1]] = np.arange(len(combined) - 1, -1, -1, dtype=np.int64)
    return combined, first


def _empty_decisions(
    columns: dict[str, npt.NDArray[np.generic]], size: int
) -> dict[str, npt.NDArray[np.generic]]:
    return {
        "position": columns["position"].astype(np.int64),
        "ts": columns["ts"].astype(np.int64),
        "kind": columns["kind"].astype(object),
        "quota": np.full(size, None, dtype=object),
        "entity": np.full(size, None, dtype=object),
        "rate": np.full(size, np.nan),
        "limit": np.full(size, np.nan),
        "throttle_ms": np.zeros(size, dtype=np.int64),
        "exceeded": np.zeros(size, dtype=np.bool_),
        "window_ms": np.zeros(size, dtype=np.int64),
        "late": np.zeros(size, dtype=np.bool_),
        "level": np.zeros(size, dtype=np.int64),
        "throttled": np.zeros(size, dtype=np.bool_),
        "leave_out": np.zeros(size, dtype=np.bool_),
        "skip_remote": np.zeros(size, dtype=np.bool_),
    }
