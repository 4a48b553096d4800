"""Kafka's hierarchical timing wheel (the purgatory redesign), over numpy arrays.

A wheel has ``wheel_size`` buckets of ``tick_ms``; a timer further out than the wheel's interval
goes to an overflow wheel whose tick is that interval, created on demand. Buckets, not timers,
wait in a priority queue ordered by their expiration, so :meth:`TimingWheel.advance` jumps from one
non-empty bucket to the next instead of ticking. A timer fires at ``floor(expiration / tick_ms) *
tick_ms`` of the finest wheel; one already due when added fires at once.

Timers live in slots of flat arrays. A handle names a slot and the serial number of the timer that
took it, so :meth:`~TimingWheel.cancel` is O(1) and a stale handle (of a timer that has fired or
been cancelled) cancels nothing. Each bucket keeps its members in a dense array and each timer
knows its position there: cancelling moves the bucket's last member into the hole, so the wheel
holds exactly its pending timers, never a cancelled one. Every operation takes a batch of timers
and costs a handful of numpy operations per bucket touched, not per timer.

The encoded form keeps the clock, the counters and each pending timer's handle and expiration;
decoding places the timers afresh, which changes no firing time and keeps every handle valid.
"""

from __future__ import annotations

import heapq
import io
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

_SLOT_BITS = 24
_SLOT_MASK = (1 << _SLOT_BITS) - 1
#: Serial numbers wrap; a stale handle could only match after this many timers in its slot.
_SERIAL_MASK = (1 << (63 - _SLOT_BITS)) - 1
MAX_TIMERS = 1 << _SLOT_BITS
_FREE = -1
_NOT_QUEUED = -1
_FORMAT = "quotastream.timing_wheel.1"


#: Kafka's purgatory defaults.
KAFKA_TICK_MS = 1
KAFKA_WHEEL_SIZE = 20


class WheelDecodeError(ValueError):
    """Bytes that are not an encoded timing wheel."""


@dataclass(frozen=True)
class Added:
    """What :meth:`TimingWheel.add` did with each timer."""

    handles: Int64Array
    #: Already due when added (``expiration < now + tick_ms``): fired at once, not held.
    due: BoolArray


@dataclass(frozen=True)
class Fired:
    """Timers that fired in one :meth:`TimingWheel.advance`, by expiration (then handle)."""

    handles: Int64Array
    expirations: Int64Array
    #: When each fired: its expiration rounded down to the finest tick.
    fired_at: Int64Array


class TimingWheel:
    """Pending timers of one owner (e.g. one state shard); times are epoch milliseconds."""

    def __init__(
        self, tick_ms: int = KAFKA_TICK_MS, wheel_size: int = KAFKA_WHEEL_SIZE, start_ms: int = 0
    ) -> None:
        if tick_ms < 1:
            raise ValueError(f"tick_ms must be at least 1, got {tick_ms}")
        if wheel_size < 2:
            raise ValueError(f"wheel_size must be at least 2, got {wheel_size}")
        self.tick_ms = tick_ms
        self.wheel_size = wheel_size
        self._now = start_ms - start_ms % tick_ms
        self._next_serial = 0
        self.fired_total = 0
        self.cancelled_total = 0
        # Timer slots.
        self._serial = np.full(0, _FREE, dtype=np.int64)
        self._expiration = np.zeros(0, dtype=np.int64)
        self._bucket = np.zeros(0, dtype=np.int64)
        self._position = np.zeros(0, dtype=np.int64)
        self._free = np.zeros(0, dtype=np.int64)  # a stack of free slots
        self._free_count = 0
        # Buckets: level * wheel_size + index.
        self._members: list[Int64Array] = []
        self._size = np.zeros(0, dtype=np.int64)
        self._bucket_expiration = np.zeros(0, dtype=np.int64)
        self._queue: list[tuple[int, int]] = []  # (expiration, bucket), stale entries skipped

    # ------------------------------------------------------------------ queries
    @property
    def now_ms(self) -> int:
        """The wheel's clock: the last time advanced to, rounded down to a tick."""
        return self._now

    @property
    def levels(self) -> int:
        """Wheels in the hierarchy (overflow wheels are created on demand)."""
        return len(self._members) // self.wheel_size

    def __len__(self) -> int:
        """Timers held, which is exactly the timers pending."""
        return len(self._serial) - self._free_count

    def held_by_buckets(self) -> int:
        """Timers the buckets hold (equal to ``len(self)``; kept apart to be checked)."""
        return int(self._size.sum())

    def next_expiration(self) -> int | None:
        """The expiration of the earliest non-empty bucket: when to advance next."""
        queue = self._queue
        while queue and self._bucket_expiration[queue[0][1]] != queue[0][0]:
            heapq.heappop(queue)
        return queue[0][0] if queue else None

    def pending(self) -> tuple[Int64Array, Int64Array]:
        """Handles and expirations of the pending timers."""
        slots = np.flatnonzero(self._serial != _FREE)
        return self._handles(slots), self._expiration[slots].copy()

    def is_pending(self, handles: Int64Array) -> BoolArray:
        return self._live_slots(np.asarray(handles, dtype=np.int64)) >= 0

    # ------------------------------------------------------------------ operations
    def add(self, expirations: Int64Array) -> Added:
        """Start one timer per expiration; O(1) each (one vectorised pass per wheel level)."""
        expirations = np.asarray(expirations, dtype=np.int64)
        count = len(expirations)
        slots = self._allocate(count)
        serials = (self._next_serial + np.arange(count, dtype=np.int64)) & _SERIAL_MASK
        self._next_serial = (self._next_serial + count) & _SERIAL_MASK
        self._serial[slots] = serials
        self._expiration[slots] = expirations
        handles = (serials << _SLOT_BITS) | slots
        due = expirations < self._now + self.tick_ms
        self._place(slots[~due])
        self._release(slots[due])
        self.fired_total += int(due.sum())
        return Added(handles, due)

    def cancel(self, handles: Int64Array) -> BoolArray:
        """Stop pending timers; True where a handle named one (stale handles are ignored)."""
        handles = np.asarray(handles, dtype=np.int64)
        slots = self._live_slots(handles)
        cancelled = slots >= 0
        # A handle repeated in one call cancels its timer once.
        unique, first = np.unique(slots[cancelled], return_index=True)
        repeated = np.ones(int(cancelled.sum()), dtype=np.bool_)
        repeated[first] = False
        cancelled[np.flatnonzero(cancelled)[repeated]] = False
        self._unlink(unique)
        self._release(unique)
        self.cancelled_total += len(unique)
        return cancelled

    def advance(self, to_ms: int) -> Fired:
        """Move the clock to ``to_ms``; return the timers due by then, each exactly once.

        Every bucket expiring by ``to_ms`` is taken from the queue, then its timers are placed
        again against the new clock: a timer fires if ``expiration < now + tick_ms`` and otherwise
        drops into a finer wheel. Results do not depend on how a span is split into calls.
        """
        target = max(self._now, to_ms - to_ms % self.tick_ms)
        taken: list[Int64Array] = []
        queue = self._queue
        while queue and queue[0][0] <= target:
            expiration, bucket = heapq.heappop(queue)
            if self._bucket_expiration[bucket] != expiration:
                continue  # emptied by cancels, or a stale entry
            size = int(self._size[bucket])
            taken.append(self._members[bucket][:size].copy())
            self._size[bucket] = 0
            self._bucket_expiration[bucket] = _NOT_QUEUED
        self._now = target
        slots = np.concatenate(taken) if taken else np.zeros(0, dtype=np.int64)
        self._bucket[slots] = _FREE
        due = self._expiration[slots] < self._now + self.tick_ms
        self._place(slots[~due])
        fired = slots[due]
        order = np.lexsort((self._serial[fired], self._expiration[fired]))
        fired = fired[order]
        expirations = self._expiration[fired].copy()
        handles = self._handles(fired)
        self._release(fired)
        self.fired_total += len(fired)
        return Fired(handles, expirations, expirations - expirations % self.tick_ms)

    # ------------------------------------------------------------------ encoding
    def encode(self) -> bytes:
        """The wheel as compact bytes: clock, counters, and each pending timer's handle and time."""
        handles, expirations = self.pending()
        header = np.array(
            [
                self.tick_ms,
                self.wheel_size,
                self._now,
                self._next_serial,
                self.fired_total,
                self.cancelled_total,
                len(self._serial),
            ],
            dtype=np.int64,
        )
        buffer = io.BytesIO()
        np.savez_compressed(
            buffer,
            format=np.array(_FORMAT),
            header=header,
            handles=handles,
            expirations=expirations,
        )
        return buffer.getvalue()

    @classmethod
    def decode(cls, data: bytes) -> TimingWheel:
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as stored:
                if str(stored["format"]) != _FORMAT:
                    raise WheelDecodeError(f"unsupported timing wheel format {stored['format']}")
                header = stored["header"].astype(np.int64)
                handles = stored["handles"].astype(np.int64)
                expirations = stored["expirations"].astype(np.int64)
        except (OSError, KeyError, ValueError) as exc:
            if isinstance(exc, WheelDecodeError):
                raise
            raise WheelDecodeError(f"not an encoded timing wheel: {exc}") from None
        tick, size, now, next_serial, fired, cancelled, capacity = (int(v) for v in header)
        wheel = cls(tick, size, now)
        wheel._next_serial, wheel.fired_total, wheel.cancelled_total = next_serial, fired, cancelled
        wheel._grow_slots(capacity)
        slots = handles & _SLOT_MASK
        wheel._serial[slots] = handles >> _SLOT_BITS
        wheel._expiration[slots] = expirations
        free = np.flatnonzero(wheel._serial == _FREE)[::-1]
        wheel._free[: len(free)] = free
        wheel._free_count = len(free)
        wheel._place(slots)
        return wheel

    # ------------------------------------------------------------------ internals
    def _handles(self, slots: Int64Array) -> Int64Array:
        handles: Int64Array = (self._serial[slots] << _SLOT_BITS) | slots
        return handles

    def _live_slots(self, handles: Int64Array) -> Int64Array:
        """The slot of each handle's pending timer, -1 where it names none."""
        slots = handles & _SLOT_MASK
        inside = (handles >= 0) & (slots < len(self._serial))
        live = np.zeros(len(handles), dtype=np.bool_)
        live[inside] = self._serial[slots[inside]] == handles[inside] >> _SLOT_BITS
        return np.where(live, slots, -1)

    def _allocate(self, count: int) -> Int64Array:
        if count > self._free_count:
            needed = len(self) + count
            if needed > MAX_TIMERS:
                raise OverflowError(f"a wheel holds at most {MAX_TIMERS} timers, asked {needed}")
            self._grow_slots(min(max(2 * len(self._serial), needed, 64), MAX_TIMERS))
        start = self._free_count - count
        slots = self._free[start : self._free_count][::-1].copy()
        self._free_count = start
        return slots

    def _grow_slots(self, capacity: int) -> None:
        old = len(self._serial)
        if capacity <= old:
            return
        extra = capacity - old
        self._serial = np.concatenate([self._serial, np.full(extra, _FREE, dtype=np.int64)])
        self._expiration = np.concatenate([self._expiration, np.zeros(extra, dtype=np.int64)])
        self._bucket = np.concatenate([self._bucket, np.full(extra, _FREE, dtype=np.int64)])
        self._position = np.concatenate([self._position, np.zeros(extra, dtype=np.int64)])
        # New slots go under the free ones already there; the lowest new slot is taken first.
        free = np.concatenate(
            [
                np.arange(capacity - 1, old - 1, -1, dtype=np.int64),
                self._free[: self._free_count],
                np.zeros(old - self._free_count, dtype=np.int64),
            ]
        )
        self._free = free
        self._free_count += extra

    def _release(self, slots: Int64Array) -> None:
        self._serial[slots] = _FREE
        self._bucket[slots] = _FREE
        end = self._free_count + len(slots)
        self._free[self._free_count : end] = slots
        self._free_count = end

    def _place(self, slots: Int64Array) -> None:
        """Put not-yet-due timers in the bucket of the finest wheel whose interval covers them."""
        remaining = slots
        level = 0
        while len(remaining):
            tick = self.tick_ms * self.wheel_size**level
            current = self._now - self._now % tick
            expirations = self._expiration[remaining]
            fits = expirations < current + tick * self.wheel_size
            if level >= self.levels:
                self._add_level()
            here = remaining[fits]
            virtual = expirations[fits] // tick
            self._insert(here, level * self.wheel_size + virtual % self.wheel_size, virtual * tick)
            remaining = remaining[~fits]
            level += 1

    def _add_level(self) -> None:
        size = self.wheel_size
        self._members.extend(np.zeros(4, dtype=np.int64) for _ in range(size))
        self._size = np.concatenate([self._size, np.zeros(size, dtype=np.int64)])
        self._bucket_expiration = np.concatenate(
            [self._bucket_expiration, np.full(size, _NOT_QUEUED, dtype=np.int64)]
        )

    def _insert(self, slots: Int64Array, buckets: Int64Array, expirations: Int64Array) -> None:
        if not len(slots):
            return
        order, runs = _runs_by_bucket(buckets)
        slots, buckets, expirations = slots[order], buckets[order], expirations[order]
        for bucket, start, end in runs:
            size = int(self._size[bucket])
            members = self._members[bucket]
            if size + end - start > len(members):
                grown = np.zeros(max(2 * len(members), size + end - start), dtype=np.int64)
                grown[:size] = members[:size]
                self._members[bucket] = members = grown
            chunk = slots[start:end]
            members[size : size + len(chunk)] = chunk
            self._position[chunk] = np.arange(size, size + len(chunk))
            self._size[bucket] = size + len(chunk)
            expiration = int(expirations[start])
            if self._bucket_expiration[bucket] != expiration:
                self._bucket_expiration[bucket] = expiration
                heapq.heappush(self._queue, (expiration, bucket))
        self._bucket[slots] = buckets

    def _unlink(self, slots: Int64Array) -> None:
        """Take timers out of their buckets, the last members filling the holes."""
        if not len(slots):
            return
        buckets = self._bucket[slots]
        self._bucket[slots] = _FREE  # marks them, so the loop below can tell them apart
        order, runs = _runs_by_bucket(buckets)
        slots = slots[order]
        for bucket, start, end in runs:
            size = int(self._size[bucket])
            kept = size - (end - start)
            members = self._members[bucket]
            positions = self._position[slots[start:end]]
            holes = positions[positions < kept]
            tail = members[kept:size]
            movers = tail[self._bucket[tail] != _FREE]
            members[holes] = movers
            self._position[movers] = holes
            self._size[bucket] = kept
            if kept == 0:
                self._bucket_expiration[bucket] = _NOT_QUEUED  # its queue entry goes stale


def _runs_by_bucket(buckets: Int64Array) -> tuple[Int64Array, list[tuple[int, int, int]]]:
    """An order that groups timers by bucket, and each group as (bucket, start, end) in it."""
    order = np.argsort(buckets, kind="stable")
    ordered = buckets[order]
    starts = np.flatnonzero(np.diff(ordered, prepend=-1))
    ends = np.append(starts[1:], len(ordered))
    runs = zip(ordered[starts].tolist(), starts.tolist(), ends.tolist(), strict=True)
    return order, list(runs)
