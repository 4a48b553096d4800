"""Columnar rolling-window byte counters: Kafka's ``Rate`` / ``SimpleRate`` for many entities.

A :class:`RollingTable` holds every entity of one quota type in a shard as a few numpy arrays:
a ring of ``samples`` aligned event-time samples per entity (which sample each slot holds and its
bytes) and the entity clock (the largest event time seen). :meth:`RollingTable.record_and_measure`
applies a batch of events to all its entities at once, in vectorised numpy.

Semantics (``docs/semantics.md``): per entity and in input order, each event moves the entity
clock to ``max(clock, ts)``, records its bytes in sample ``ts // window`` unless that sample has
already left the window (``samples`` samples ending at the clock's sample), then measures the rate
at the clock: record-then-check, as Kafka does. Processing a stream as one batch or as any split
into smaller batches gives identical results; tests check this against a scalar model.

How a batch is vectorised: events are grouped per entity (stable, so input order is kept), the
running clock is a segmented cumulative maximum, and every recorded sample (old slots and new
events) is an *item* alive from the position it is recorded at until the first position whose
window no longer reaches its sample. The window's byte sum at every position is then the cumulative
sum of +bytes at each item's start and -bytes at its end, and the oldest retained sample (which
``SimpleRate`` needs) is found by a search over the sorted (entity, sample) pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from state.quota_types import WindowRule

Int64Array = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

#: Marks a slot that holds no sample, and an entity that has no clock yet.
EMPTY = np.iinfo(np.int64).min
# Composite (group, value) keys must stay clear of int64 overflow; wider batches are split.
_COMPOSITE_LIMIT = 2**62


@dataclass(frozen=True)
class WindowSpec:
    samples: int
    window_ms: int
    rule: WindowRule

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise ValueError(f"samples must be >= 1, got {self.samples}")
        if self.window_ms < 1:
            raise ValueError(f"window_ms must be >= 1, got {self.window_ms}")


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
        return self.window_bytes * 1000.0 / self.window_size_ms


class RollingTable:
    """Rolling-window byte counts of the entities of one quota type (one shard's worth)."""

    def __init__(
        self,
        spec: WindowSpec,
        keys: pd.Index | None = None,
        clock: Int64Array | None = None,
        slot_sample: Int64Array | None = None,
        slot_bytes: Int64Array | None = None,
    ) -> None:
        self.spec = spec
        self._keys: pd.Index = keys if keys is not None else pd.Index([], dtype=object)
        size = len(self._keys)
        shape = (size, spec.samples)
        self._clock: Int64Array = (
            clock if clock is not None else np.full(size, EMPTY, dtype=np.int64)
        )
        self._slot_sample: Int64Array = (
            slot_sample if slot_sample is not None else np.full(shape, EMPTY, dtype=np.int64)
        )
        self._slot_bytes: Int64Array = (
            slot_bytes if slot_bytes is not None else np.zeros(shape, dtype=np.int64)
        )
        if self._clock.shape != (size,) or self._slot_sample.shape != shape:
            raise ValueError("rolling table arrays do not match the number of keys and samples")
        if self._slot_bytes.shape != shape:
            raise ValueError("rolling table arrays do not match the number of keys and samples")

    # ------------------------------------------------------------------ inspection
    def __len__(self) -> int:
        return len(self._keys)

    @property
    def keys(self) -> pd.Index:
        return self._keys

    def columns(self) -> tuple[pd.Index, Int64Array, Int64Array, Int64Array]:
        """The raw columns (keys, clock, slot samples, slot bytes); read-only views."""
        return self._keys, self._clock, self._slot_sample, self._slot_bytes

    def retained(self, key: str) -> dict[int, int]:
        """``{sample index: bytes}`` of the samples still inside ``key``'s window."""
        row = self._keys.get_indexer(pd.Index([key], dtype=object))[0]
        if row < 0 or self._clock[row] == EMPTY:
            return {}
        low = self._clock[row] // self.spec.window_ms - self.spec.samples + 1
        return {
            int(sample): int(nbytes)
            for sample, nbytes in zip(self._slot_sample[row], self._slot_bytes[row], strict=True)
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
    ) -> Measurement:
        """Record a batch of events (in input order) and measure each one after recording it.

        ``entity_keys`` are the distinct entities of the batch, ``event_entity[i]`` indexes the
        entity of event ``i``. Times are epoch milliseconds (>= 0), bytes are >= 0.
        """
        event_entity = np.asarray(event_entity, dtype=np.int64)
        ts = np.asarray(ts, dtype=np.int64)
        nbytes = np.asarray(nbytes, dtype=np.int64)
        if not len(ts) == len(nbytes) == len(event_entity):
            raise ValueError("event_entity, ts and nbytes must have the same length")
        keys = np.asarray(entity_keys, dtype=object)
        referenced = np.bincount(event_entity, minlength=len(keys)) > 0
        rows_of_key = np.full(len(keys), -1, dtype=np.int64)
        rows_of_key[referenced] = self._rows_for(keys[referenced])
        return self._record_rows(rows_of_key[event_entity], ts, nbytes)

    def evict_idle(self, horizon_ms: int) -> int:
        """Drop entities whose every sample is out of the window at ``horizon_ms``.

        Exact as long as no event older than ``horizon_ms`` is recorded later: the dropped
        samples would have been purged before any later measurement. Returns the number dropped.
        """
        if not len(self):
            return 0
        spec = self.spec
        keep = self._clock // spec.window_ms >= horizon_ms // spec.window_ms - spec.samples + 1
        dropped = int(len(keep) - np.count_nonzero(keep))
        if dropped:
            self._keys = self._keys[keep]
            self._clock = self._clock[keep]
            self._slot_sample = self._slot_sample[keep]
            self._slot_bytes = self._slot_bytes[keep]
        return dropped

    # ------------------------------------------------------------------ internals
    def _rows_for(self, keys: npt.NDArray[np.object_]) -> Int64Array:
        rows = np.asarray(self._keys.get_indexer(pd.Index(keys, dtype=object)), dtype=np.int64)
        missing = rows < 0
        if missing.any():
            new_keys = keys[missing]
            start = len(self._keys)
            rows[missing] = np.arange(start, start + len(new_keys), dtype=np.int64)
            self._keys = self._keys.append(pd.Index(new_keys, dtype=object))
            added = len(new_keys)
            self._clock = np.concatenate([self._clock, np.full(added, EMPTY, dtype=np.int64)])
            self._slot_sample = np.concatenate(
                [self._slot_sample, np.full((added, self.spec.samples), EMPTY, dtype=np.int64)]
            )
            self._slot_bytes = np.concatenate(
                [self._slot_bytes, np.zeros((added, self.spec.samples), dtype=np.int64)]
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
        low = clock // window - samples + 1  # lowest sample inside the window, per position
        event_sample = batch.ts // window
        recorded = event_sample >= low
        keys = _CompositeKeys.build(batch, low, samples)

        # Items: the held slots of each entity (alive from its group's first position) and the
        # recorded events (alive from their own position).
        slot_sample = self._slot_sample[batch.group_row]
        slot_bytes = self._slot_bytes[batch.group_row]
        held = slot_sample != EMPTY
        held_group = np.nonzero(held)[0]
        event_positions = np.flatnonzero(recorded)
        items = _Items(
            group=np.concatenate([held_group, batch.group_id[event_positions]]),
            sample=np.concatenate([slot_sample[held], event_sample[event_positions]]),
            start=np.concatenate([batch.group_start[held_group], event_positions]),
            nbytes=np.concatenate([slot_bytes[held], batch.nbytes[event_positions]]),
            first_event=len(held_group),
        )

        # An item leaves the window at the first position of its group whose low exceeds it.
        low_key = keys.of(low, batch.group_id)
        end = np.searchsorted(low_key, keys.of(items.sample + 1, items.group), "left")
        end = np.maximum(end, items.start)
        delta = np.zeros(batch.size + 1, dtype=np.int64)
        np.add.at(delta, items.start, items.nbytes)
        np.add.at(delta, end, -items.nbytes)
        window_bytes = np.cumsum(delta[:-1])

        if spec.rule is WindowRule.RATE:
            # With aligned samples Kafka's padding to (samples - 1) full windows always yields
            # (samples - 1) windows plus the elapsed part of the current one.
            window_size = (samples - 1) * window + clock % window
        else:
            alive = end > items.start
            oldest = _oldest_sample(batch, keys, low_key, items, alive)
            window_size = np.maximum(clock - oldest * window, window)
        window_size = np.maximum(window_size, 1)

        self._store(batch, slot_sample, slot_bytes, items)
        return Measurement(clock, window_bytes, window_size, recorded)

    def _store(
        self,
        batch: _GroupedBatch,
        slot_sample: Int64Array,
        slot_bytes: Int64Array,
        items: _Items,
    ) -> None:
        """Write back each touched entity's window as it stands after its last event."""
        samples, window = self.spec.samples, self.spec.window_ms
        final_clock = batch.clock[batch.group_last]
        final_low = final_clock // window - samples + 1
        expired = slot_sample < final_low[:, None]
        slot_sample[expired] = EMPTY
        slot_bytes[expired] = 0
        new = slice(items.first_event, None)
        group, sample, nbytes = items.group[new], items.sample[new], items.nbytes[new]
        keep = sample >= final_low[group]
        group, sample, nbytes = group[keep], sample[keep], nbytes[keep]
        slot = sample % samples
        # Distinct samples inside one window never share a slot, so a mismatch is a stale slot.
        stale = slot_sample[group, slot] != sample
        slot_sample[group[stale], slot[stale]] = sample[stale]
        slot_bytes[group[stale], slot[stale]] = 0
        np.add.at(slot_bytes, (group, slot), nbytes)
        self._slot_sample[batch.group_row] = slot_sample
        self._slot_bytes[batch.group_row] = slot_bytes
        self._clock[batch.group_row] = final_clock


@dataclass(frozen=True)
class _Items:
    """Recorded samples that a batch measures: held slots first, then the batch's events."""

    group: Int64Array
    sample: Int64Array
    start: Int64Array
    nbytes: Int64Array
    first_event: int


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
        return len(self.group_start) * (self.clock_span + spec.samples + 2) >= _COMPOSITE_LIMIT


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
