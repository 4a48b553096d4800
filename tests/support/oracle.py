"""Deliberately naive, one-event-at-a-time models of Kafka's rolling rates.

* :class:`KafkaRate` transcribes Kafka's own classes (``clients/.../metrics/stats``, 3.8 and
  later): ``SampledStat`` with its ``samples + 1`` ring, ``isComplete``, ``advance``,
  ``purgeObsoleteSamples`` by each sample's last event, ``oldest`` by start time; ``WindowedSum``;
  ``Rate.windowSize`` and ``SimpleRate.windowSize``. Records come in time order, as a broker's
  clock gives them. With ``aligned`` a sample starts at the multiple of the window at or below
  the time that opens it instead of at that time: the engine's one deliberate change of sampling.
* :class:`OracleWindow` is the engine's event-time model: the same rule per aligned sample, for
  events in any order (a late event joins its sample if that sample is still kept).

The columnar table is checked against both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from state.quota_types import WindowRule

#: (clock, window bytes, window size ms, recorded), as the table measures each event.
Measured = tuple[int, int, int, bool]


@dataclass
class _Sample:
    """``SampledStat.Sample`` (eventWindow unset: only time completes a sample)."""

    start_ms: int
    last_event_ms: int
    value: float = 0.0

    def reset(self, start_ms: int, now: int) -> None:
        self.start_ms, self.last_event_ms, self.value = start_ms, now, 0.0


@dataclass
class KafkaRate:
    samples: int
    window_ms: int
    rule: WindowRule
    aligned: bool = False
    ring: list[_Sample] = field(default_factory=list)
    current: int = 0

    def record_and_measure(self, ts: int, nbytes: int) -> Measured:
        """``Sensor.record``: record ``nbytes`` at ``ts``, then measure at ``ts``."""
        self.record(ts, nbytes)
        size = self.window_size(ts)
        return ts, int(self.measure_sum(ts)), size, True

    # SampledStat.record
    def record(self, now: int, value: int) -> None:
        sample = self._current(now)
        if now - sample.start_ms >= self.window_ms:
            sample = self._advance(now)
        sample.value += value  # WindowedSum.update
        sample.last_event_ms = now

    def _advance(self, now: int) -> _Sample:
        self.current = (self.current + 1) % (self.samples + 1)
        if self.current >= len(self.ring):
            self.ring.append(self._new(now))
        else:
            self.ring[self.current].reset(self._start(now), now)
        return self.ring[self.current]

    def _current(self, now: int) -> _Sample:
        if not self.ring:
            self.ring.append(self._new(now))
        return self.ring[self.current]

    def _oldest(self, now: int) -> _Sample:
        if not self.ring:
            self.ring.append(self._new(now))
        oldest = self.ring[0]
        for sample in self.ring[1:]:
            if sample.start_ms < oldest.start_ms:
                oldest = sample
        return oldest

    def _purge(self, now: int) -> None:
        for sample in self.ring:
            if now - sample.last_event_ms >= self.samples * self.window_ms:
                sample.reset(self._start(now), now)

    # SampledStat.measure with WindowedSum.combine
    def measure_sum(self, now: int) -> float:
        self._purge(now)
        return sum(sample.value for sample in self.ring)

    # Rate.windowSize / SimpleRate.windowSize
    def window_size(self, now: int) -> int:
        self._purge(now)
        elapsed = now - self._oldest(now).start_ms
        if self.rule is WindowRule.SIMPLE_RATE:
            return max(elapsed, self.window_ms)
        full_windows = elapsed // self.window_ms
        if full_windows < self.samples - 1:
            elapsed += (self.samples - 1 - full_windows) * self.window_ms
        return max(elapsed, 1)

    def _new(self, now: int) -> _Sample:
        return _Sample(self._start(now), now)

    def _start(self, now: int) -> int:
        return now - now % self.window_ms if self.aligned else now


@dataclass
class OracleWindow:
    """The engine's rule per aligned sample, events in any order."""

    samples: int
    window_ms: int
    rule: WindowRule
    clock: int | None = None
    #: sample -> [bytes, last event time] of the samples still kept.
    kept: dict[int, list[int]] = field(default_factory=dict)

    def record_and_measure(self, ts: int, nbytes: int) -> Measured:
        self.clock = ts if self.clock is None else max(self.clock, ts)
        now, window = self.clock, self.window_ms
        low = now // window - self.samples + 1
        # Older than the overlapping sample before the window: gone, and never recorded again.
        self.kept = {k: v for k, v in self.kept.items() if k >= low - 1}
        sample = ts // window
        recorded = sample >= low - 1
        if recorded:
            held = self.kept.setdefault(sample, [0, ts])
            held[0] += nbytes
            held[1] = max(held[1], ts)
        # purgeObsoleteSamples: the overlapping sample counts while its last event is recent.
        counted = {
            k: v[0] for k, v in self.kept.items() if k >= low or v[1] > now - self.samples * window
        }
        elapsed = now - min(counted) * window
        if self.rule is WindowRule.RATE:
            full_windows = elapsed // window
            if full_windows < self.samples - 1:
                elapsed += (self.samples - 1 - full_windows) * window
            size = max(elapsed, 1)
        else:
            size = max(elapsed, window)
        return now, sum(counted.values()), size, recorded
