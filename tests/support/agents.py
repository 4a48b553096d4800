"""What the agents' tests share: a clock that moves when told, and the contract's quota
configuration."""

from __future__ import annotations

from state.config import parse_quota_config


class FakeClock:
    """Monotonic seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now

    def advance_ms(self, ms: int) -> None:
        self.now += ms / 1000


CONFIG = parse_quota_config(
    {"clients": [{"user": "alice", "producer_byte_rate": 100}]}, "contract config"
)
