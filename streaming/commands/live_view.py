"""What the engine is deciding, read back from Redis: the entities closest to (or over) their limit.

Redis holds the decisions agents act on (docs/redis.md): throttles, their ends, and entities near
their limit (``redis.write_near_limit``), so those are what the view counts and lists.

A rich table on a terminal; one plain summary line per refresh otherwise (logs, CI). The view
reads decisions as agents do (:mod:`quotastream.redis_contract`), so "throttled" here is what an
agent would enforce: shadow, exempt and released decisions are over their limit, not throttled.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import redis
from rich.table import Table

from quotastream.client import decision_keys
from quotastream.clock import SYSTEM_CLOCK
from quotastream.redis_contract import CorruptValueError, Decision, decode_decision


@dataclass(frozen=True)
class Snapshot:
    decisions: list[Decision]
    #: Keys that held something other than a decision (shown, not dropped silently).
    unreadable: int = 0
    taken_at_ms: int = field(default_factory=SYSTEM_CLOCK.wall_ms)

    @property
    def throttled(self) -> list[Decision]:
        return [d for d in self.decisions if d.throttle_ms_at(self.taken_at_ms) > 0]

    def top(self, count: int) -> list[Decision]:
        return sorted(self.decisions, key=_utilisation, reverse=True)[:count]

    def summary(self) -> str:
        over = _count_by_quota(d for d in self.decisions if d.exceeded)
        line = (
            f"{len(self.decisions)} entities written; over limit: {over}; "
            f"throttled now: {_count_by_quota(self.throttled)}"
        )
        return line + (f"; unreadable keys: {self.unreadable}" if self.unreadable else "")

    def table(self, count: int = 12) -> Table:
        table = Table(title=f"quotastream — {self.summary()}", expand=True)
        for column in ("quota", "entity", "rate B/s", "limit B/s", "use %", "throttle ms"):
            table.add_column(column, justify="left" if column in ("quota", "entity") else "right")
        for decision in self.top(count):
            remaining = decision.throttle_ms_at(self.taken_at_ms)
            share = decision.utilisation
            style = "bold red" if remaining > 0 else ("yellow" if decision.exceeded else "")
            table.add_row(
                decision.quota,
                decision.entity,
                f"{decision.rate:,.0f}",
                "∞" if decision.limit is None else f"{decision.limit:,.0f}",
                "-" if share is None else f"{100 * share:.0f}",
                str(remaining),
                style=style,
            )
        return table


def snapshot(client: redis.Redis, prefix: str) -> Snapshot:
    keys = decision_keys(client, prefix)
    values = client.mget(keys) if keys else []
    assert isinstance(values, list)
    decisions, unreadable = [], 0
    for key, value in zip(keys, values, strict=True):
        if value is None:  # expired since the scan
            continue
        try:
            decisions.append(decode_decision(key.decode(), value))
        except CorruptValueError:
            unreadable += 1
    return Snapshot(decisions, unreadable)


def _count_by_quota(decisions: Iterable[Decision]) -> str:
    counts: dict[str, int] = {}
    for decision in decisions:
        counts[decision.quota] = counts.get(decision.quota, 0) + 1
    return ", ".join(f"{quota}={count}" for quota, count in sorted(counts.items())) or "none"


def _utilisation(decision: Decision) -> float:
    return decision.utilisation or 0.0
