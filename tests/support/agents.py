"""What the agents' tests share: a clock that moves when told, and the contract's quota
configuration."""

from __future__ import annotations

import time

from state.config import parse_quota_config


class FakeClock:
    """A :class:`quotastream.clock.Clock` that moves only when a test says so: monotonic seconds
    from 1000, and wall milliseconds from ``wall_ms`` (by default the host's when it is made, so
    that decisions a test writes at ``time.time()`` are current), moved together."""

    def __init__(self, wall_ms: int | None = None) -> None:
        self.now = 1_000.0
        self._wall_start_ms = time.time_ns() // 1_000_000 if wall_ms is None else wall_ms

    def wall_ms(self) -> int:
        return self._wall_start_ms + round((self.now - 1_000.0) * 1000)

    def monotonic(self) -> float:
        return self.now

    def advance_ms(self, ms: int) -> None:
        self.now += ms / 1000


CONFIG = parse_quota_config(
    {"clients": [{"user": "alice", "producer_byte_rate": 100}]}, "contract config"
)
