"""Decisions in: how long the engine holds each client, answered without a Redis round trip.

The hot path (:meth:`Holds.remaining_ms`) reads a dictionary. A thread of its own keeps it
current: every ``refresh_ms`` it asks the agents' :class:`~quotastream.cache.CachedQuotaClient`
for each client seen in the last ``idle_ms`` (``for_client``: the client's counter under the
live configuration the engine published, so a quota change is followed), and a client seen for
the first time wakes it at once. So a decision reaches the proxy at most ``refresh_ms`` after
the engine wrote it, plus one round trip; while Redis is unreachable the cached client answers
by its failure policy (fail open: no hold; fail closed: ``fail_closed_delay_ms``), and counts
each answer by its source (``quotastream_agent_answers_total``).

A hold is the client's remaining throttle: ``until`` of its decision, as an instant of this
process's monotonic clock. A fail-closed answer has no ``until`` of its own: it holds the client
``fail_closed_delay_ms`` from the pass that gave it, and the next one starts when that ended, so
that a client still gets a request through per delay, as "delay everyone" means.

Every connection of the client asks for its hold before forwarding a request, so a client
spread over many brokers is held on all of them by a cluster-wide decision.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from quotastream.cache import CachedQuotaClient, Source

log = logging.getLogger(__name__)

#: (quota, user, client-id, broker): what a client's decision is looked up by.
ClientKey = tuple[str, str, str, int]


class Holds:
    def __init__(
        self,
        decisions: CachedQuotaClient,
        refresh_ms: int,
        idle_ms: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._decisions = decisions
        self._refresh_s = refresh_ms / 1000
        self._idle_s = idle_ms / 1000
        self._clock = clock
        #: How many brokers clients fetch from (a cluster-wide fetch quota's window is shared).
        self._brokers: Callable[[], int] = lambda: 1
        self._until: dict[ClientKey, float] = {}
        self._largest_fetch: dict[ClientKey, int | None] = {}
        self._seen: dict[ClientKey, float] = {}
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="decision-refresh", daemon=True)

    def count_brokers_with(self, brokers: Callable[[], int]) -> None:
        """How to count the brokers a consumer may fetch from at once (the proxy's routes)."""
        self._brokers = brokers

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        self._thread.join(5)

    def remaining_ms(self, key: ClientKey) -> int:
        """How long the client is still held (0: not held); a dictionary read."""
        now = self._clock()
        if key not in self._seen:
            self._wake.set()
        self._seen[key] = now
        until = self._until.get(key)
        if until is None or until <= now:
            return 0
        return int((until - now) * 1000) + 1  # never release a millisecond early

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
        now = self._clock()
        for key, seen in list(self._seen.items()):
            if now - seen > self._idle_s:
                del self._seen[key]
                self._until.pop(key, None)
                self._largest_fetch.pop(key, None)
                continue
            answer = self._decisions.for_client(*key)
            if key in self._largest_fetch:  # resolved with the configuration just followed
                self._largest_fetch[key] = self._fetch_cap(key)
            if answer.source is Source.FAIL_CLOSED and self._until.get(key, 0.0) > now:
                continue  # a policy hold runs its course: re-read, it would never end
            if answer.throttle_ms > 0:
                self._until[key] = self._clock() + answer.throttle_ms / 1000
            else:
                self._until.pop(key, None)

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._wake.clear()
            try:
                self.refresh()
            except Exception:  # a refused command, a bug: log it, keep the last answers
                log.exception("refreshing the decisions failed; holds stay as they were")
            self._wake.wait(self._refresh_s)
