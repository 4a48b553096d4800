"""The per-entity series' bounded set, on the driver: which entities are exported, and their
latest decisions (plain Python, no Prometheus).

The exporter folds each micro-batch's decisions in
(:class:`~streaming.engine.batch_summary.BatchReport`); kept are the top ``top_k`` per quota by
:func:`rank` and every entity throttled now. Entities that leave the set are forgotten, so their
series disappear.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from quotastream.redis_contract import Decision
from streaming.engine.batch_summary import tracking_key
from streaming.engine.metric_names import QUOTAS


def rank(decision: Decision) -> tuple[float, float]:
    """Order of the top-k: utilisation first; unlimited entities after every limited one."""
    ratio = decision.utilisation
    return (-1.0 if ratio is None else ratio, decision.rate)


def select(
    decisions: Iterable[Decision], top_k: int, now_ms: int
) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(the top ``top_k`` per quota by :func:`rank`, the entities throttled at ``now_ms``)."""
    by_quota: dict[str, list[Decision]] = {}
    throttled: set[tuple[str, str]] = set()
    for decision in decisions:
        by_quota.setdefault(decision.quota, []).append(decision)
        if decision.throttle_ms_at(now_ms) > 0:
            throttled.add(decision.key)
    top = {
        decision.key
        for group in by_quota.values()
        for decision in heapq.nlargest(top_k, group, key=rank)
    }
    return top, throttled


@dataclass
class ExportedEntities:
    """What the driver knows: the latest decision of each entity it exports or counts.

    Kept: the top ``top_k`` per quota and every entity throttled now (counted by
    ``quotastream_throttled_entities`` even when ``top_k`` is 0). An entity that leaves both is
    forgotten, and so are entities not decided again for ``keep_ms`` (their Redis keys expire
    then too), unless throttled.
    """

    top_k: int
    keep_ms: int | None = None
    entities: dict[tuple[str, str], Decision] = field(default_factory=dict)
    seen_ms: dict[tuple[str, str], int] = field(default_factory=dict)
    top: set[tuple[str, str]] = field(default_factory=set)
    timers: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # per shard
    remote_log: dict[tuple[str, int], int] = field(default_factory=dict)

    def fold(self, decisions: Iterable[Decision], now_ms: int) -> None:
        for decision in decisions:
            self.entities[decision.key] = decision
            self.seen_ms[decision.key] = now_ms
        if self.keep_ms is not None:
            horizon = now_ms - self.keep_ms
            for key in [k for k, seen in self.seen_ms.items() if seen < horizon]:
                if self.entities[key].throttle_ms_at(now_ms) == 0:
                    del self.entities[key], self.seen_ms[key]
        top, throttled = select(self.entities.values(), self.top_k, now_ms)
        keep = top | throttled
        for key in [k for k in self.entities if k not in keep]:
            del self.entities[key], self.seen_ms[key]
        self.top = top

    def exported(self, now_ms: int) -> list[Decision]:
        """The per-entity series' decisions: the top-k and those throttled at ``now_ms``."""
        if self.top_k == 0:
            return []
        return [
            decision
            for key, decision in self.entities.items()
            if key in self.top or decision.throttle_ms_at(now_ms) > 0
        ]

    def throttled(self, now_ms: int) -> dict[str, int]:
        """Entities throttled at ``now_ms``, per quota (every quota present, 0 included)."""
        counts = dict.fromkeys(QUOTAS, 0)
        for decision in self.entities.values():
            if decision.throttle_ms_at(now_ms) > 0:
                counts[decision.quota] = counts.get(decision.quota, 0) + 1
        return counts

    def tracked(self) -> frozenset[str]:
        """The keys (:func:`tracking_key`) whose new decisions the writers must always return."""
        return frozenset(tracking_key(quota, entity) for quota, entity in self.entities)

    def fold_timers(self, shards: Mapping[int, tuple[int, int, int]]) -> tuple[int, int]:
        """New per-shard (pending, fired, cancelled); returns the (fired, cancelled) increase.

        A shard's fired and cancelled counts are cumulative since its state began; a first
        sight counts in full, a decrease (a new checkpoint) counts from zero.
        """
        fired = cancelled = 0
        for shard, counts in shards.items():
            _, old_fired, old_cancelled = self.timers.get(shard, (0, 0, 0))
            fired += counts[1] - old_fired if counts[1] >= old_fired else counts[1]
            cancelled += counts[2] - old_cancelled if counts[2] >= old_cancelled else counts[2]
            self.timers[shard] = counts
        return fired, cancelled

    def timers_pending(self) -> int:
        return sum(pending for pending, _, _ in self.timers.values())
