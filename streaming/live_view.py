"""What the engine is deciding, read back from Redis: the entities closest to (or over) their limit.

A rich table on a terminal; one plain summary line per refresh otherwise (logs, CI).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis
from rich.table import Table

from quotastream.client import decision_keys


@dataclass(frozen=True)
class Snapshot:
    decisions: list[dict[str, Any]]

    @property
    def throttled(self) -> list[dict[str, Any]]:
        now = int(time.time() * 1000)
        return [d for d in self.decisions if d["exceeded"] and d["until"] > now]

    def top(self, count: int) -> list[dict[str, Any]]:
        return sorted(self.decisions, key=_utilisation, reverse=True)[:count]

    def summary(self) -> str:
        over = _count_by_quota(d for d in self.decisions if d["exceeded"])
        return (
            f"{len(self.decisions)} entities decided; over limit: {over}; "
            f"throttled now: {_count_by_quota(self.throttled)}"
        )

    def table(self, count: int = 12) -> Table:
        table = Table(title=f"quotastream — {self.summary()}", expand=True)
        for column in ("quota", "entity", "rate B/s", "limit B/s", "use %", "throttle ms"):
            table.add_column(column, justify="left" if column in ("quota", "entity") else "right")
        now = int(time.time() * 1000)
        for decision in self.top(count):
            limit = decision["limit"]
            remaining = max(decision["until"] - now, 0)
            style = "bold red" if remaining > 0 else ("yellow" if decision["exceeded"] else "")
            table.add_row(
                decision["quota"],
                decision["entity"],
                f"{decision['rate']:,.0f}",
                "∞" if limit is None else f"{limit:,.0f}",
                "-" if limit is None else f"{100 * decision['rate'] / limit:.0f}",
                str(remaining),
                style=style,
            )
        return table


def snapshot(client: redis.Redis, prefix: str) -> Snapshot:
    keys = decision_keys(client, prefix)
    values = client.mget(keys) if keys else []
    assert isinstance(values, list)
    return Snapshot([json.loads(value) for value in values if value is not None])


def _count_by_quota(decisions: Iterable[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for decision in decisions:
        counts[decision["quota"]] = counts.get(decision["quota"], 0) + 1
    return ", ".join(f"{quota}={count}" for quota, count in sorted(counts.items())) or "none"


def _utilisation(decision: dict[str, Any]) -> float:
    limit = decision["limit"]
    return 0.0 if not limit else float(decision["rate"]) / float(limit)
