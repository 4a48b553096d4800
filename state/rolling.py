"""Columnar rolling-window byte counters: Kafka's ``Rate`` / ``SimpleRate`` for many entities.

A :class:`RollingTable` holds every entity of one quota type in a shard as a few numpy arrays:
a ring of ``samples + 1`` aligned event-time samples per entity (which sample each slot holds,
its bytes and its last event time) and the entity clock (the largest event time seen).
:meth:`RollingTable.record_and_measure` applies a batch of events to all its entities at once, in
vectorised numpy.

Semantics (``docs/semantics.md``; Kafka 3.8+ ``SampledStat``): per entity and in input order,
each event moves the entity clock to ``max(clock, ts)`` and adds its bytes to sample
``ts // window``, then the rate is measured at the clock: record-then-check, as Kafka does. At
clock ``c`` the samples ``c // window - samples + 1 ..`` count whole; the one before them is
Kafka's extra "overlapping" sample: it counts while its last event is newer than
``c - samples * window`` (then it is purged), and ``Rate`` then measures over one more window.
Older samples are gone for good, and an event that falls into one is not recorded (``late``). A
sample's bytes and last event time do not depend on the order its events arrive in, so the final
windows of a batch are those of any arrival order, and processing a stream as one batch or as any
split into smaller batches gives identical results; tests check both against scalar models.

How a batch is vectorised: events are grouped per entity (stable, so input order is kept), the
running clock is a segmented cumulative maximum, and every recorded sample (old slots and new
events) is an *item* counted whole from the position it is recorded at until the first position
whose window no longer reaches its sample. The window's byte sum at every position is then the
cumulative sum of +bytes at each item's start and -bytes at its end; the extra sample's bytes and
last event time at each position are a segmented cumulative sum and maximum over its items, looked
up by (entity, sample). The oldest counted sample (which ``SimpleRate`` needs) is found by a
search over the sorted (entity, sample) pairs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from state.quota_types import WindowRule
from state.throttle import rate_of
from state.window import WindowSpec

Int64Array = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

#: Marks a slot that holds no sample, and an entity that has no clock yet.
EMPTY = np.iinfo(np.int64).min
# Composite (group, value) keys must stay clear of int64 overflow; wider batches are split.
_COMPOSITE_LIMIT = 2**62


@dataclass(frozen=True)
class Measurement:
    """Per-event results of :meth:`RollingTable.record_and_measure`, in the caller's order."""

    clock_ms: Int64Array
    window_bytes: Int64Array
    window_size_ms: Int64Array
    recorded: BoolArray

    @property
    def rate(self) -> FloatArray:
        """Bytes per second over the measured window."""
        return rate_of(self.window_bytes, self.window_size_ms)


class RollingTable:
    """Rolling-window byte counts of the entities of one quota type (one shard's worth)."""

    def __init__(
        self,
        spec: WindowSpec,
        keys: pd.Index | None = None,
        *,
        clock: Int64Array | None = None,
        slot_sample: Int64Array | None = None,
        slot_bytes: Int64Array | None = None,
        slot_last: Int64Array | None = None,
    ) -> None:
        self.spec = spec
        self._keys: pd.Index = keys if keys is not None else pd.Index([], dtype=object)
        size = len(self._keys)
        shape = (size, spec.slots)
        self._clock: Int64Array = (
            clock if clock is not None else np.full(size, EMPTY, dtype=np.int64)
        )
        self._slot_sample: Int64Array = (
            slot_sample if slot_sample is not None else np.full(shape, EMPTY, dtype=np.int64)
        )
        self._slot_bytes: Int64Array = (
            slot_bytes if slot_bytes is not None else np.zeros(shape, dtype=np.int64)
        )
        self._slot_last: Int64Array = (
            slot_last if slot_last is not None else np.full(shape, EMPTY, dtype=np.int64)
        )
        if self._clock.shape != (size,) or any(
            slots.shape != shape for slots in (self._slot_sample, self._slot_bytes, self._slot_last)
        ):
            raise ValueError("rolling table arrays do not match the number of keys and slots")

    # ------------------------------------------------------------------ inspection
    def __len__(self) -> int:
        return len(self._keys)

    @property
    def keys(self) -> pd.Index:
        return self._keys

    def columns(self) -> tuple[pd.Index, Int64Array, Int64Array, Int64Array, Int64Array]:
        """The raw columns (keys, clock, slot samples, slot bytes, slot last event times);
        read-only views."""
        return self._keys, self._clock, self._slot_sample, self._slot_bytes, self._slot_last

    def retained(self, key: str) -> dict[int, tuple[int, int]]:
        """``{sample index: (bytes, last event ms)}`` of the samples ``key`` keeps: those of its
        window and the overlapping one before them (counted only while its last event is
        recent)."""
        row = self._keys.get_indexer(pd.Index([key], dtype=object))[0]
        if row < 0 or self._clock[row] == EMPTY:
            return {}
        low = self._clock[row] // self.spec.window_ms - self.spec.samples
        return {
            int(sample): (int(nbytes), int(last))
            for sample, nbytes, last in zip(
                self._slot_sample[row], self._slot_bytes[row], self._slot_last[row], strict=True
            )
            if sample != EMPTY and sample >= low
        }

    def clock_of(self, key: str) -> int | None:
        row = self._keys.get_indexer(pd.Index([key], dtype=object))[0]
        return None if row < 0 else int(self._clock[row])

    # ------------------------------------------------------------------ updates
    def record_and_measure(
        self,
        entity_keys: npt.ArrayLike,
        event_entity: Int64Array,
        ts: Int64Array,
        nbytes: Int64Array,
        admit: Callable[[npt.NDArray[np.object_]], None] | None = None,
    ) -> Measurement:
        """Record a batch of events (in input order) and measure each one after recording it.

        ``entity_keys`` are the distinct entities of the batch, ``event_entity[i]`` indexes the
        entity of event ``i``. Times are epoch milliseconds (>= 0), bytes are >= 0. ``admit`` is
        shown the keys the table does not hold yet before they are added, and may refuse them
        by raising: a batch that adds none pays nothing for the check.
        """
        event_entity = np.asarray(event_entity, dtype=np.int64)
        ts = np.asarray(ts, dtype=np.int64)
        nbytes = np.asarray(nbytes, dtype=np.int64)
        if not len(ts) == len(nbytes) == len(event_entity):
            raise ValueError("event_entity, ts and nbytes must have the same length")
        keys = np.asarray(entity_keys, dtype=object)
        referenced = np.bincount(event_entity, minlength=len(keys)) > 0
        rows_of_key = np.full(len(keys), -1, dtype=np.int64)
        rows_of_key[referenced] = self._rows_for(keys[referenced], admit)
        return self._record_rows(rows_of_key[event_entity], ts, nbytes)

    def evict_idle(self, horizon_ms: int) -> int:
        """Drop entities whose every sample is purged at ``horizon_ms``: its last event is at
        least ``samples * window`` old.

        Exact as long as no event older than ``horizon_ms`` is recorded later: the dropped
        samples would have been purged before any later measurement. Returns the number dropped.
        """
        if not len(self):
            return 0
        spec = self.spec
        keep = self._clock > horizon_ms - spec.samples * spec.window_ms
        dropped = int(len(keep) - np.count_nonzero(keep))
        if dropped:
            self._keys = self._keys[keep]
            self._clock = self._clock[keep]
            self._slot_sample = self._slot_sample[keep]
            self._slot_bytes = self._slot_bytes[keep]
            self._slot_last = self._slot_last[keep]
        return dropped

    # ------------------------------------------------------------------ internals
    def _rows_for(
        self,
        keys: npt.NDArray[np.object_],
        admit: Callable[[npt.NDArray[np.object_]], None] | None,
    ) -> Int64Array:
        rows = np.asarray(self._keys.get_indexer(pd.Index(keys, dtype=object)), dtype=np.int64)
        missing = rows < 0
        if missing.any():
            new_keys = keys[missing]
            if admit is not None:
                admit(new_keys)
            start = len(self._keys)
            rows[missing] = np.arange(start, start + len(new_keys), dtype=np.int64)
            self._keys = self._keys.append(pd.Index(new_keys, dtype=object))
            added = len(new_keys)
            self._clock = np.concatenate([self._clock, np.full(added, EMPTY, dtype=np.int64)])
            shape = (added, self.spec.slots)
            self._slot_sample = np.concatenate(
                [self._slot_sample, np.full(shape, EMPTY, dtype=np.int64)]
            )
            self._slot_bytes = np.concatenate([self._slot_bytes, np.zeros(shape, dtype=np.int64)])
            self._slot_last = np.concatenate(
                [self._slot_last, np.full(shape, EMPTY, dtype=np.int64)]
            )
        return rows

    def _record_rows(self, rows: Int64Array, ts: Int64Array, nbytes: Int64Array) -> Measurement:
        count = len(ts)
        if count == 0:
            empty = np.zeros(0, dtype=np.int64)
            return Measurement(empty, empty, empty, np.zeros(0, dtype=np.bool_))
        if len(self._keys) * count < _COMPOSITE_LIMIT:
            # Unique keys (row, position) let the faster unstable sort keep input order per row.
            order = np.argsort(rows * count + np.arange(count, dtype=np.int64))
        else:
            order = np.argsort(rows, kind="stable")
        batch = _GroupedBatch.build(rows[order], ts[order], nbytes[order], self._clock)
        if batch.too_wide(self.spec):
            # Exact by construction: the split halves are applied one after the other.
            half = count // 2
            first = self._record_rows(rows[:half], ts[:half], nbytes[:half])
            second = self._record_rows(rows[half:], ts[half:], nbytes[half:])
            return _concat(first, second)
        sorted_result = self._apply(batch)
        result = Measurement(
            clock_ms=np.empty(count, dtype=np.int64),
            window_bytes=np.empty(count, dtype=np.int64),
            window_size_ms=np.empty(count, dtype=np.int64),
            recorded=np.empty(count, dtype=np.bool_),
        )
        result.clock_ms[order] = sorted_result.clock_ms
        result.window_bytes[order] = sorted_result.window_bytes
        result.window_size_ms[order] = sorted_result.window_size_ms
        result.recorded[order] = sorted_result.recorded
        return result

    def _apply(self, batch: _GroupedBatch) -> Measurement:
        spec = self.spec
        samples, window = spec.samples, spec.window_ms
        clock = batch.clock
        low = clock // window - samples + 1  # lowest sample wholly inside the window, per position
        event_sample = batch.ts // window
        # Kept unless its sample is older than the overlapping one (which may still count).
        recorded = event_sample >= low - 1
        keys = _CompositeKeys.build(batch, low - 1, spec.slots)

        # Items: the held slots of each entity (from its group's first position) and the
        # recorded events (from their own position).
        slot_sample = self._slot_sample[batch.group_row]
        held = slot_sample != EMPTY
        held_group = np.nonzero(held)[0]
        event_positions = np.flatnonzero(recorded)
        items = _Items(
            group=np.concatenate([held_group, batch.group_id[event_positions]]),
            sample=np.concatenate([slot_sample[held], event_sample[event_positions]]),
            start=np.concatenate([batch.group_start[held_group], event_positions]),
            nbytes=np.concatenate(
                [self._slot_bytes[batch.group_row][held], batch.nbytes[event_positions]]
            ),
            last=np.concatenate(
                [self._slot_last[batch.group_row][held], batch.ts[event_positions]]
            ),
        )

        # An item counts whole until the first position of its group whose low exceeds it.
        low_key = keys.of(low, batch.group_id)
        end = np.searchsorted(low_key, keys.of(items.sample + 1, items.group), "left")
        end = np.maximum(end, items.start)
        delta = np.zeros(batch.size + 1, dtype=np.int64)
        np.add.at(delta, items.start, items.nbytes)
        np.add.at(delta, end, -items.nbytes)
        overlapping = _Overlapping.at(
            batch, keys, items, window, low - 1, horizon=clock - samples * window
        )
        window_bytes = np.cumsum(delta[:-1]) + np.where(overlapping.counts, overlapping.nbytes, 0)

        if spec.rule is WindowRule.RATE:
            # With aligned samples Kafka's padding to (samples - 1) full windows always yields
            # (samples - 1) windows plus the elapsed part of the current one; an overlapping
            # sample is one window older.
            window_size = (samples - 1 + overlapping.counts) * window + clock % window
        else:
            alive = end > items.start
            oldest = np.where(
                overlapping.counts, low - 1, _oldest_sample(batch, keys, low_key, items, alive)
            )
            window_size = np.maximum(clock - oldest * window, window)
        window_size = np.maximum(window_size, 1)

        self._store(batch, items, low[batch.group_last])
        return Measurement(clock, window_bytes, window_size, recorded)

    def _store(self, batch: _GroupedBatch, items: _Items, final_low: Int64Array) -> None:
        """Write back each touched entity's samples as they stand after its last event."""
        shape = (len(batch.group_row), self.spec.slots)
        keep = items.sample >= final_low[items.group] - 1
        group, sample = items.group[keep], items.sample[keep]
        # The kept samples of an entity are consecutive, fewer than the slots: never one slot.
        slot = (group, sample % self.spec.slots)
        slot_sample = np.full(shape, EMPTY, dtype=np.int64)
        slot_sample[slot] = sample
        slot_bytes = np.zeros(shape, dtype=np.int64)
        np.add.at(slot_bytes, slot, items.nbytes[keep])
        slot_last = np.full(shape, EMPTY, dtype=np.int64)
        np.maximum.at(slot_last, slot, items.last[keep])
        self._slot_sample[batch.group_row] = slot_sample
        self._slot_bytes[batch.group_row] = slot_bytes
        self._slot_last[batch.group_row] = slot_last
        self._clock[batch.group_row] = batch.clock[batch.group_last]


@dataclass(frozen=True)
class _Items:
    """Recorded samples that a batch measures: held slots first, then the batch's events."""

    group: Int64Array
    sample: Int64Array
    start: Int64Array
    nbytes: Int64Array
    last: Int64Array  # the held slot's last event time, or the event's time


@dataclass(frozen=True)
class _Overlapping:
    """Per position: the sample just before the window (Kafka's extra one), as recorded by then."""

    nbytes: Int64Array
    counts: BoolArray  # recorded, with a last event newer than the purge horizon

    @staticmethod
    def at(
        batch: _GroupedBatch,
        keys: _CompositeKeys,
        items: _Items,
        window_ms: int,
        sample: Int64Array,
        *,
        horizon: Int64Array,
    ) -> _Overlapping:
        """Bytes and whether it counts of ``sample`` (per position) after the items recorded up
        to that position; a sample counts while its last event is later than ``horizon``."""
        size = batch.size
        # Items of samples below every window of their group can never be that sample.
        reachable = np.flatnonzero(items.sample >= keys.base[items.group])
        if not len(reachable):
            return _Overlapping(np.zeros(size, dtype=np.int64), np.zeros(size, dtype=np.bool_))
        by_pair = keys.of(items.sample[reachable], items.group[reachable])
        order = reachable[np.lexsort((items.start[reachable], by_pair))]
        pair = keys.of(items.sample[order], items.group[order])
        first = np.empty(len(order), dtype=np.bool_)
        first[:1] = True
        np.not_equal(pair[1:], pair[:-1], out=first[1:])
        rank = np.cumsum(first) - 1
        # Running sums and maxima per (entity, sample): a sample's last event times lie within
        # one window, so lifting each pair by a window keeps one accumulate for all.
        nbytes = items.nbytes[order]
        before = np.cumsum(nbytes) - nbytes
        running_bytes = np.cumsum(nbytes) - before[np.flatnonzero(first)][rank]
        sample_start = items.sample[order] * window_ms
        lift = rank * window_ms
        running_last = (
            np.maximum.accumulate(items.last[order] - sample_start + lift) - lift + sample_start
        )
        # The last item of the asked pair recorded at or before each position.
        wanted = keys.of(sample, batch.group_id)
        block = np.searchsorted(pair, wanted, "left")
        found = block < len(pair)
        found[found] = pair[block[found]] == wanted[found]
        found_rank = np.where(found, rank[np.minimum(block, len(pair) - 1)], 0)
        positions = np.arange(size, dtype=np.int64)
        at = (
            np.searchsorted(
                rank * (size + 1) + items.start[order], found_rank * (size + 1) + positions, "right"
            )
            - 1
        )
        found &= at >= block
        at = np.where(found, at, 0)
        return _Overlapping(
            nbytes=np.where(found, running_bytes[at], 0),
            counts=found & (running_last[at] > horizon),
        )


@dataclass(frozen=True)
class _GroupedBatch:
    """A batch sorted by entity row (input order kept within each entity)."""

    ts: Int64Array
    nbytes: Int64Array
    clock: Int64Array  # running entity clock after each event
    group_id: Int64Array  # per position: index of its entity group
    group_start: Int64Array  # per group: first position
    group_last: Int64Array  # per group: last position
    group_row: Int64Array  # per group: table row
    clock_span: int  # widest range of clock values inside one group, in ms

    @property
    def size(self) -> int:
        return len(self.ts)

    @staticmethod
    def build(
        rows: Int64Array, ts: Int64Array, nbytes: Int64Array, table_clock: Int64Array
    ) -> _GroupedBatch:
        size = len(rows)
        first = np.empty(size, dtype=np.bool_)
        first[0] = True
        np.not_equal(rows[1:], rows[:-1], out=first[1:])
        group_start = np.flatnonzero(first)
        group_id = np.cumsum(first) - 1
        group_last = np.append(group_start[1:] - 1, size - 1)
        group_row = rows[group_start]

        # Running clock: a cumulative maximum per group, seeded with the entity's clock. Offsetting
        # each group above the previous one lets one accumulate serve all groups.
        seeded = ts.copy()
        seeded[group_start] = np.maximum(ts[group_start], table_clock[group_row])
        base = np.minimum.reduceat(seeded, group_start)
        span = int((np.maximum.reduceat(seeded, group_start) - base).max()) + 1
        clock = np.zeros(size, dtype=np.int64)
        if len(group_start) * span < _COMPOSITE_LIMIT:
            lift = group_id * span - base[group_id]
            clock = np.maximum.accumulate(seeded + lift) - lift
        return _GroupedBatch(
            ts=ts,
            nbytes=nbytes,
            clock=clock,
            group_id=group_id,
            group_start=group_start,
            group_last=group_last,
            group_row=group_row,
            clock_span=span,
        )

    def too_wide(self, spec: WindowSpec) -> bool:
        """Whether composite keys for this batch could overflow int64 (then it is split)."""
        return len(self.group_start) * (self.clock_span + spec.slots + 2) >= _COMPOSITE_LIMIT


@dataclass(frozen=True)
class _CompositeKeys:
    """Order-preserving int64 keys for (group, sample) pairs of one batch.

    Within a group, samples are taken relative to the group's lowest window start and clamped to
    ``[0, span)``: anything below is already out of every window of the group, anything above is
    never reached by its windows, and clamping keeps both inside the group's key range.
    """

    base: Int64Array  # per group: lowest window start sample
    span: int

    @staticmethod
    def build(batch: _GroupedBatch, low: Int64Array, samples: int) -> _CompositeKeys:
        base = low[batch.group_start]
        span = int((low[batch.group_last] - base).max()) + samples + 1
        return _CompositeKeys(base=base, span=span)

    def of(self, sample: Int64Array, group: Int64Array) -> Int64Array:
        relative: Int64Array = np.clip(sample - self.base[group], 0, self.span - 1)
        return group * self.span + relative

    def sample_of(self, key: Int64Array, group: Int64Array) -> Int64Array:
        return key - group * self.span + self.base[group]


def _oldest_sample(
    batch: _GroupedBatch,
    keys: _CompositeKeys,
    low_key: Int64Array,
    items: _Items,
    alive: BoolArray,
) -> Int64Array:
    """The oldest sample inside each position's window that has been recorded by then."""
    pair_keys = keys.of(items.sample[alive], items.group[alive])
    pairs, pair_of_item = np.unique(pair_keys, return_inverse=True)
    first_seen = np.full(len(pairs), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_seen, pair_of_item, items.start[alive])

    positions = np.arange(batch.size, dtype=np.int64)
    candidate = np.searchsorted(pairs, low_key, "left")
    # The clock's own sample is always recorded by then, so at most `samples` pairs are skipped:
    # only samples that a late event recorded after this position are stepped over.
    pending = np.flatnonzero(first_seen[candidate] > positions)
    while len(pending):
        candidate[pending] += 1
        pending = pending[first_seen[candidate[pending]] > pending]
    return keys.sample_of(pairs[candidate], batch.group_id)


def _concat(first: Measurement, second: Measurement) -> Measurement:
    return Measurement(
        clock_ms=np.concatenate([first.clock_ms, second.clock_ms]),
        window_bytes=np.concatenate([first.window_bytes, second.window_bytes]),
        window_size_ms=np.concatenate([first.window_size_ms, second.window_size_ms]),
        recorded=np.concatenate([first.recorded, second.recorded]),
    )
