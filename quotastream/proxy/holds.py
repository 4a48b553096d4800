"""Decisions in: how long the engine holds each client, answered without a Redis round trip.

The hot path (:meth:`Holds.remaining_ms`) reads a dictionary. A thread of its own keeps it
current: every ``refresh_ms`` it asks the agents' :class:`~quotastream.cache.CachedQuotaClient`
for each client seen in the last ``idle_ms`` (``for_client``: the client's counter under the
live configuration the engine published, so a quota change is followed), and a client seen for
the first time wakes it at once. So a decision reaches the proxy at most ``refresh_ms`` after
the engine wrote it, plus one round trip; while Redis is unreachable the cached client answers
by its failure policy (fail open: no hold; fail closed: ``fail_closed_delay_ms``), and counts
each answer by its source (``quotastream_agent_answers_total``).

A hold is the client's remaining throttle, as an instant of this process's monotonic clock.
The engine's decision counts the bytes up to its last event (``decided_at``) and reaches the
proxy a flush, a trigger, a micro-batch and a refresh later (about a second or two). Two things
happen to the client's window meanwhile, and the proxy measures both itself
(:meth:`Holds.held_until`) from its own count of what it forwarded (:class:`Forwarded`):

* the client sends: a client released by a decision would send at its own rate all that time,
  bytes the next decision pays back only in part (a producer offering 3x its quota got
  1.1-1.6x of it through), so each byte forwarded since ``decided_at`` adds ``1 / limit``
  seconds at once, on every broker of the entity;
* the window slides: a burst leaves it whole when its sample gets older than the window (a
  greedy consumer takes ten windows' worth at once and is then held until then), and a broker
  serves the next request at once, where a decision made before would hold the client a
  decision's latency longer (a greedy consumer's cycle of 11 s became 13 s).

What it forwards between two refreshes is counted at the next one. Bytes that other proxies
forwarded for the same entity are counted by the engine only: the proxy knows how many the
decision counted, not when each came, so it places them evenly over the decision's window, as a
steady stream would have put them, and they leave it as it slides. A client the engine has not
decided yet (its first bytes are still on their way to it) is measured from nothing, under the
limit it resolves to locally, as a broker measures a client it has just met.

A fail-closed answer has no ``until`` of its own: it holds the client
``fail_closed_delay_ms`` from the pass that gave it, and the next one starts when that ended, so
that a client still gets a request through per delay, as "delay everyone" means.

Every connection of the client asks for its hold before forwarding a request, so a client
spread over many brokers is held on all of them by a cluster-wide decision.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Final

from quotastream.cache import CachedQuotaClient, Source
from quotastream.clock import SYSTEM_CLOCK, Clock
from quotastream.proxy.hold_window import (
    ClientKey,
    Forwarded,
    headroom_of,
    hold_end,
    window_over_ms,
)
from quotastream.redis_contract import Decision

log = logging.getLogger(__name__)


class Holds:
    def __init__(
        self,
        decisions: CachedQuotaClient,
        refresh_ms: int,
        idle_ms: int,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._decisions = decisions
        self._refresh_s = refresh_ms / 1000
        self._idle_s = idle_ms / 1000
        self._clock = clock
        self.forwarded = Forwarded()
        #: How many brokers clients fetch from (a cluster-wide fetch quota's window is shared).
        self._brokers: Callable[[], int] = lambda: 1
        self._until: dict[ClientKey, float] = {}
        #: Each decided client's decision and the keys of its counter, as of the last refresh.
        self._decided: dict[ClientKey, tuple[Decision, tuple[ClientKey, ...]]] = {}
        self._largest_fetch: dict[ClientKey, int | None] = {}
        #: Per decided entity: the bytes its window had room for when last measured, less those
        #: forwarded since (:meth:`record_forwarded`).
        self._headroom: dict[tuple[str, str], float] = {}
        #: Per quota: its sample width, as of the last refresh (:meth:`_window_ms_of`).
        self._window_ms: dict[str, int] = {}
        self._seen: dict[ClientKey, float] = {}
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="decision-refresh", daemon=True)

    def count_brokers_with(self, brokers: Callable[[], int]) -> None:
        """How to count the brokers a consumer may fetch from at once (the proxy's routes)."""
        self._brokers = brokers

    def start(self) -> None:
        self._thread.start()

    #: How long :meth:`stop` waits for the refresh thread (a Redis read at most).
    STOP_TIMEOUT_S: Final = 5.0

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        self._thread.join(self.STOP_TIMEOUT_S)

    def remaining_ms(self, key: ClientKey) -> int:
        """How long the client is still held (0: not held); a dictionary read."""
        now = self._clock.monotonic()
        if key not in self._seen:
            self._wake.set()
        self._seen[key] = now
        until = self._until.get(key)
        if until is None or until <= now:
            return 0
        return int((until - now) * 1000) + 1  # never release a millisecond early

    def over_quota_with(self, key: ClientKey, nbytes: int) -> int:
        """How long the client would be throttled had its counter also recorded ``nbytes`` now
        (0: within its quota). A broker asks it of each Fetch response before it sends it: one
        over the quota is answered empty instead, and not recorded. It measures the bytes
        forwarded until now (:meth:`held_until`): for fetch responses, which come at most a few
        per connection a second."""
        decided = self._decided.get(key)
        if decided is None:
            return 0
        decision, keys = decided
        now_ms = self._clock.wall_ms()
        return max(self.held_until(decision, keys, now_ms, nbytes) - now_ms, 0)

    def held_until(
        self, decision: Decision, keys: Iterable[ClientKey], now_ms: int, extra_bytes: int = 0
    ) -> int:
        """When (wall ms) a throttle by ``decision`` ends, measured at ``now_ms`` with the bytes
        forwarded for its entity's ``keys`` and ``extra_bytes`` more (``hold_window``), under the
        quota's window as the configuration followed now has it."""
        spec = self._decisions.client.window_of(decision.quota)
        over_ms = window_over_ms(decision, spec, self.forwarded, keys, now_ms, extra_bytes)
        return hold_end(decision, over_ms, now_ms)

    def record_forwarded(self, key: ClientKey, nbytes: int, now_ms: int) -> int:
        """Counts ``nbytes`` forwarded for the client at ``now_ms`` and checks its quota as a
        broker checks each request it records (record first, then check): how long the client
        is held from now for them (0: still within its quota). The hold is the client's on every
        connection at once (:meth:`remaining_ms`).

        A broker measures every request. Here a measure merges a dozen samples of each of the
        entity's keys (~0.15 ms), so the last measure's headroom (the bytes the window had room
        for) is spent first, and the window is measured again only once it is spent: a client
        far under its quota costs a subtraction a request, and one at its quota a measure per
        request, as many as its quota lets through. Without this check
        a client with a backlog (Kafka's Java producer buffers 32 MB) sends at wire speed until
        the next refresh, and is then held for seconds: held long and let through in bursts, where
        a broker holds it short and often."""
        self.forwarded.record(key, nbytes, now_ms, self._window_ms_of(key[0]))
        decided = self._decided.get(key)
        if decided is None:
            return 0
        decision, keys = decided
        headroom = self._headroom.get(decision.key, math.inf) - nbytes
        self._headroom[decision.key] = headroom
        if headroom >= 0:
            return 0
        return self._measure(decision, keys, now_ms)

    def _window_ms_of(self, quota: str) -> int:
        """A quota's sample width under the configuration the last refresh followed (resolving
        it costs a few microseconds, which each forwarded request would pay)."""
        width = self._window_ms.get(quota)
        if width is None:
            width = self._window_ms[quota] = self._decisions.client.window_of(quota).window_ms
        return width

    def _measure(self, decision: Decision, keys: tuple[ClientKey, ...], now_ms: int) -> int:
        """Measures the entity's window at ``now_ms``: holds each of its ``keys`` (never
        shortening a hold) and keeps the headroom left; the hold in ms from now."""
        spec = self._decisions.client.window_of(decision.quota)
        over_ms = window_over_ms(decision, spec, self.forwarded, keys, now_ms)
        self._headroom[decision.key] = headroom_of(decision, over_ms)
        if over_ms is None:  # held by the decision's until alone, as the last refresh left it
            return 0
        held_ms = hold_end(decision, over_ms, now_ms) - now_ms
        if held_ms <= 0:
            return 0
        until = self._clock.monotonic() + held_ms / 1000
        for key in keys:
            if self._until.get(key, 0.0) < until:
                self._until[key] = until
        return held_ms

    def largest_fetch(self, key: ClientKey) -> int | None:
        """The most a fetch of the client may return (its fetch quota's window, as a broker caps
        ``max_bytes``); None: uncapped. Resolved locally, without Redis, at first sight, and
        again on each refresh pass (the live configuration may have changed it)."""
        if key not in self._largest_fetch:
            self._largest_fetch[key] = self._fetch_cap(key)
        return self._largest_fetch[key]

    def _fetch_cap(self, key: ClientKey) -> int | None:
        return self._decisions.client.largest_fetch(*key[1:], brokers=self._brokers())

    def refresh(self) -> None:
        """Looks up every client seen within ``idle_ms`` (one pass of the refresh thread)."""
        now = self._clock.monotonic()
        decided: dict[ClientKey, Decision] = {}
        for key, seen in list(self._seen.items()):
            if now - seen > self._idle_s:
                del self._seen[key]
                self._until.pop(key, None)
                self._largest_fetch.pop(key, None)
                self.forwarded.forget(key)
                continue
            answer = self._decisions.for_client(*key)
            if key in self._largest_fetch:  # resolved with the configuration just followed
                self._largest_fetch[key] = self._fetch_cap(key)
            if answer.source is Source.FAIL_CLOSED and self._until.get(key, 0.0) > now:
                continue  # a policy hold runs its course: re-read, it would never end
            if answer.decision is not None and answer.source is not Source.FAIL_CLOSED:
                decided[key] = answer.decision
            elif answer.source in (Source.FRESH, Source.CACHED, Source.STALE):
                # Not decided yet (the engine has not read its first bytes): measured from
                # nothing, as a broker measures a client it has just met.
                decided[key] = self._decisions.client.undecided(*key)
            elif answer.throttle_ms > 0:
                self._until[key] = self._clock.monotonic() + answer.throttle_ms / 1000
            else:
                self._until.pop(key, None)
            if key not in decided:
                span_ms = self._decisions.client.window_of(key[0]).span_ms
                self.forwarded.forget_until(key, self._clock.wall_ms() - span_ms)
        self._window_ms = {}  # resolved again with the configuration just followed
        self._hold_for_forwarded(decided)

    def _hold_for_forwarded(self, decided: dict[ClientKey, Decision]) -> None:
        """Holds each decided client until its decision's end measured now (:meth:`held_until`),
        with the bytes forwarded for its entity on any broker (a cluster-wide quota's entity is
        one), and keeps each entity's headroom (:meth:`record_forwarded`)."""
        keys_of: dict[tuple[str, str], list[ClientKey]] = defaultdict(list)
        for key, decision in decided.items():
            keys_of[decision.key].append(key)
        self._decided = {key: (d, tuple(keys_of[d.key])) for key, d in decided.items()}
        wall_ms, now = self._clock.wall_ms(), self._clock.monotonic()
        headroom: dict[tuple[str, str], float] = {}
        for entity, keys in keys_of.items():
            decision = decided[keys[0]]
            spec = self._decisions.client.window_of(decision.quota)
            over_ms = window_over_ms(decision, spec, self.forwarded, keys, wall_ms)
            until_ms = hold_end(decision, over_ms, wall_ms)
            for key in keys:
                if until_ms > wall_ms:
                    self._until[key] = now + (until_ms - wall_ms) / 1000
                else:
                    self._until.pop(key, None)
            headroom[entity] = headroom_of(decision, over_ms)
        self._headroom = headroom
        for key, decision in decided.items():
            spec = self._decisions.client.window_of(key[0])
            # Kept as long as the decision's own window may count them (its overlapping sample),
            # or a window now (a client not decided yet).
            counted_since = max(decision.decided_at, wall_ms - spec.span_ms)
            oldest = counted_since // spec.window_ms - spec.samples
            self.forwarded.fold(key, decision.decided_at, spec.window_ms, oldest)

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._wake.clear()
            try:
                self.refresh()
            except Exception:  # a refused command, a bug: log it, keep the last answers
                log.exception("refreshing the decisions failed; holds stay as they were")
            self._wake.wait(self._refresh_s)
