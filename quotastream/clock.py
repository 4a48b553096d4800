"""The one clock convention of the agents: wall milliseconds and monotonic seconds, injected.

Wall milliseconds stamp what is published or compared with what the engine wrote (an event's
``ts``, a decision's ``until``): they are the engine's time. Monotonic seconds measure how long
something lasts in this process (a hold, an entry's age): they never jump. A component takes one
``Clock`` and reads both from it, so a test moves both together by injecting one object.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol


class Clock(Protocol):
    def wall_ms(self) -> int:
        """Milliseconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (comparable only within this process)."""
        ...


@dataclass(frozen=True)
class SystemClock:
    """The host's clocks. Every instance is equal (it has no state), so settings that hold one
    compare equal after a pickle round trip, as a Spark task receives them."""

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM_CLOCK: Clock = SystemClock()
