"""Decisions in: how long the engine holds each client, answered without a Redis round trip.

The hot path (:meth:`Holds.remaining_ms`) reads a dictionary. A thread of its own keeps it
current: every ``refresh_ms`` it asks the agents' :class:`~quotastream.cache.CachedQuotaClient`
for each client seen in the last ``idle_ms`` (``for_client``: the client's counter under the
live configuration the engine published, so a quota change is followed), and a client seen for
the first time wakes it at once. So a decision reaches the proxy at most ``refresh_ms`` after
the engine wrote it, plus one round trip; while Redis is unreachable the cached client answers
by its failure policy (fail open: no hold; fail closed: ``fail_closed_delay_ms``), and counts
each answer by its source (``quotastream_agent_answers_total``).

A hold is the client's remaining throttle: the end of its decision's throttle, as an instant of
this process's monotonic clock. The engine's decision counts the bytes up to its last event
(``decided_at``) and reaches the proxy a flush, a trigger, a micro-batch and a refresh later
(about a second or two): a client released by it would send at its own rate all that time,
bytes the next decision pays back only in part, since the window forgets them as it slides (a
producer offering 3x its quota got 1.1-1.6x of it through). So the proxy counts what it
forwarded for each client (:class:`Forwarded`) and holds the client until
``Decision.until_with`` the bytes of its entity forwarded after ``decided_at``: Kafka's throttle
of the decision's window and those bytes, as if the engine had seen them (each byte adds
``1 / limit`` seconds). What it forwards between two refreshes is counted at the next one. Bytes
that other proxies forwarded for the same entity are counted by the engine only.

A fail-closed answer has no ``until`` of its own: it holds the client
``fail_closed_delay_ms`` from the pass that gave it, and the next one starts when that ended, so
that a client still gets a request through per delay, as "delay everyone" means.

Every connection of the client asks for its hold before forwarding a request, so a client
spread over many brokers is held on all of them by a cluster-wide decision.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable

from quotastream.cache import CachedQuotaClient, Source
from quotastream.redis_contract import Decision

log = logging.getLogger(__name__)

#: (quota, user, client-id, broker): what a client's decision is looked up by.
ClientKey = tuple[str, str, str, int]

#: How long forwarded bytes are kept for a decision that has not counted them yet: longer than
#: a decision's latency (the engine's batches run in seconds), short enough to bound memory: a
#: bucket per millisecond with traffic, so at most 10,000 per client (about 1 MB), and as many
#: as the requests of those 10 s over all clients (300,000 at the proxy's 30,000 a second).
FORWARDED_HORIZON_MS = 10_000


class Forwarded:
    """The counted bytes forwarded per client, by millisecond, since the client's decision.

    :meth:`record` runs on the connections' event loop and :meth:`since` / :meth:`forget_until`
    on the refresh thread: a deque's append and popleft are atomic, and a millisecond bucket is
    added to in place (bytes added to a bucket while it is dropped as older than a decision
    belong to the decision's own millisecond, which the engine may have counted already)."""

    def __init__(self) -> None:
        self._sent: dict[ClientKey, deque[list[int]]] = {}

    def record(self, key: ClientKey, nbytes: int, now_ms: int) -> None:
        sent = self._sent.get(key)
        if sent is None:
            sent = self._sent[key] = deque()
        if sent and sent[-1][0] == now_ms:
            sent[-1][1] += nbytes
        else:
            sent.append([now_ms, nbytes])

    def since(self, keys: Iterable[ClientKey], after_ms: int) -> int:
        """Bytes forwarded for ``keys`` after ``after_ms``."""
        total = 0
        for key in keys:
            # A copy: the event loop appends meanwhile (copied in one C call, under the GIL).
            for at, nbytes in reversed(tuple(self._sent.get(key, ()))):
                if at <= after_ms:
                    break
                total += nbytes
        return total

    def forget_until(self, key: ClientKey, until_ms: int) -> None:
        """Drops the buckets at or before ``until_ms`` (counted by a decision, or too old)."""
        sent = self._sent.get(key)
        while sent and sent[0][0] <= until_ms:
            sent.popleft()

    def forget(self, key: ClientKey) -> None:
        self._sent.pop(key, None)


class Holds:
    def __init__(
        self,
        decisions: CachedQuotaClient,
        refresh_ms: int,
        idle_ms: int,
        clock: Callable[[], float] = time.monotonic,
        wall_clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self._decisions = decisions
        self._refresh_s = refresh_ms / 1000
        self._idle_s = idle_ms / 1000
        self._clock = clock
        self._wall_clock_ms = wall_clock_ms
        self.forwarded = Forwarded()
        #: How many brokers clients fetch from (a cluster-wide fetch quota's window is shared).
        self._brokers: Callable[[], int] = lambda: 1
        self._until: dict[ClientKey, float] = {}
        #: Each decided client's decision and the keys of its counter, as of the last refresh.
        self._decided: dict[ClientKey, tuple[Decision, tuple[ClientKey, ...]]] = {}
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

    def over_quota_with(self, key: ClientKey, nbytes: int) -> int:
        """How long the client would be throttled had its counter also recorded ``nbytes`` now
        (0: within its quota). A broker asks it of each Fetch response before it sends it: one
        over the quota is answered empty instead, and not recorded. It adds up the bytes
        forwarded since the decision (:meth:`Forwarded.since`): for fetch responses, which come
        at most a few per connection a second."""
        decided = self._decided.get(key)
        if decided is None:
            return 0
        decision, keys = decided
        unseen = self.forwarded.since(keys, decision.decided_at)
        return max(decision.until_with(unseen + nbytes) - self._wall_clock_ms(), 0)

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
            elif answer.throttle_ms > 0:
                self._until[key] = self._clock() + answer.throttle_ms / 1000
            else:
                self._until.pop(key, None)
            if key not in decided:
                self.forwarded.forget_until(key, self._wall_clock_ms() - FORWARDED_HORIZON_MS)
        self._hold_for_forwarded(decided)

    def _hold_for_forwarded(self, decided: dict[ClientKey, Decision]) -> None:
        """Holds each decided client until its decision's end with the bytes forwarded for its
        entity (on any broker: a cluster-wide quota's entity is one) since ``decided_at``."""
        keys_of: dict[tuple[str, str], list[ClientKey]] = defaultdict(list)
        for key, decision in decided.items():
            keys_of[decision.key].append(key)
        self._decided = {key: (d, tuple(keys_of[d.key])) for key, d in decided.items()}
        wall_ms, now = self._wall_clock_ms(), self._clock()
        for key, decision in decided.items():
            keys = keys_of[decision.key]
            until_ms = decision.until_with(self.forwarded.since(keys, decision.decided_at))
            self.forwarded.forget_until(
                key, max(decision.decided_at, wall_ms - FORWARDED_HORIZON_MS)
            )
            if until_ms > wall_ms:
                self._until[key] = now + (until_ms - wall_ms) / 1000
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
