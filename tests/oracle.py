"""A deliberately naive, one-event-at-a-time model of Kafka's rolling rates (aligned samples).

It transcribes Kafka's ``SampledStat.purgeObsoleteSamples``, ``Rate.windowSize`` and
``SimpleRate.windowSize`` literally, so the vectorised table can be checked against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from state.quota_types import WindowRule


@dataclass
class OracleWindow:
    samples: int
    window_ms: int
    rule: WindowRule
    clock: int | None = None
    held: dict[int, int] = field(default_factory=dict)

    def record_and_measure(self, ts: int, nbytes: int) -> tuple[int, int, int, bool]:
        """Returns (clock, window bytes, window size ms, recorded)."""
        self.clock = ts if self.clock is None else max(self.clock, ts)
        now, window = self.clock, self.window_ms
        # purgeObsoleteSamples: a sample starting samples * window or more before now is gone.
        self.held = {k: v for k, v in self.held.items() if now - k * window < self.samples * window}
        sample = ts // window
        recorded = now - sample * window < self.samples * window
        if recorded:
            self.held[sample] = self.held.get(sample, 0) + nbytes
        oldest_start = min(self.held) * window
        elapsed = now - oldest_start
        if self.rule is WindowRule.RATE:
            full_windows = elapsed // window
            if full_windows < self.samples - 1:
                elapsed += (self.samples - 1 - full_windows) * window
            size = max(elapsed, 1)
        else:
            size = max(elapsed, window)
        return now, sum(self.held.values()), size, recorded
