"""Bytes counted between two scrapes of the brokers' cumulative counters: the deltas that become
events (``count``-style sums), with restarts, resets and unreachable brokers handled. Pure.

A broker's JMX counters (``BrokerTopicMetrics`` ``Count``) only grow while its process lives,
and start again from 0 when it restarts. Each scrape of a broker gives its counters' values and
its process's start time; :meth:`CounterDeltas.update` returns what each counter counted since
the previous scrape of that broker:

* the first scrape of a broker (the agent just started, a broker joined) gives no delta: what
  its counters hold was counted before anything was published;
* the broker's process started again (its start time changed), a counter went down (a reset
  without a restart), or a counter appeared since the last scrape (a broker registers a topic's
  meters on the topic's first request, and again after it removed them): the counter's whole
  value is the delta, counted since it started;
* a broker that cannot be scraped gives nothing and keeps its last values, so its counters'
  growth while it was unreachable is counted at the next scrape that reaches it;
* a counter a reachable broker no longer lists (its topic deleted, leadership moved) is
  forgotten.

What cannot be known: bytes a broker counted after its last scrape and before it restarted. The
agent's scrape interval bounds them; they are counted in no event.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Series = TypeVar("Series", bound=Hashable)
#: The last value of a counter the last scrape did not list (counters are never negative).
_UNSEEN = -1.0


@dataclass(frozen=True)
class Scrape(Generic[Series]):
    """One broker's counters at one scrape, and when its process started (epoch seconds)."""

    started_at: float
    values: Mapping[Series, float]


@dataclass
class _Broker(Generic[Series]):
    started_at: float
    values: dict[Series, float] = field(default_factory=dict)


class CounterDeltas(Generic[Series]):
    """The last scrape of each broker, and the deltas of each new one."""

    def __init__(self) -> None:
        self._brokers: dict[int, _Broker[Series]] = {}

    def update(self, broker: int, scrape: Scrape[Series]) -> dict[Series, float]:
        """What each counter of ``broker`` counted since its previous scrape (counters with
        nothing new left out)."""
        last = self._brokers.get(broker)
        deltas: dict[Series, float] = {}
        if last is not None:
            restarted = last.started_at != scrape.started_at
            for series, value in scrape.values.items():
                before = last.values.get(series, _UNSEEN)
                # Unless it grew from the last scrape's value, it started since: all of it is new.
                counted = value - before if not restarted and 0 <= before <= value else value
                if counted > 0:
                    deltas[series] = counted
        self._brokers[broker] = _Broker(scrape.started_at, dict(scrape.values))
        return deltas
