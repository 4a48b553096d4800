"""How many throttle timers are pending, fired and cancelled: the engine reports these counts and
agents read them back (``QuotaClient.timer_counts``).

A module of its own, apart from ``state.throttle_timers``, so that the agent package reads it
without importing pandas, numpy or pyarrow.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TimerStats:
    """Timers pending now, and fired and cancelled since the state began."""

    pending: int
    fired: int
    cancelled: int
