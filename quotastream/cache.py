"""A cached lookup for enforcement agents: a staleness bound, and an answer when Redis is down.

``CachedQuotaClient`` sits over ``QuotaClient.lookup`` (the one way to read a decision). A decision
read less than ``max_staleness_ms`` ago is answered from memory, without a round trip. When Redis
is unreachable or slow (``timeout_ms``), the answer comes from the cache if the entry is younger
than ``fail_open_staleness_ms``, else from the failure policy: fail open (no delay, the default)
or fail closed (``fail_closed_delay_ms``). Each ``Answer`` says where it came from (``source``).

An outage is logged once when it begins and once when it ends, and counted (``errors``, or the
Prometheus counter ``quotastream_agent_redis_errors_total`` in the ``registry`` given); while Redis
is down, lookups answer at once and Redis is tried again once per ``backoff_ms``. A key that holds
something other than a decision (corrupt, or written by another program) is answered the same way
as an unreachable Redis, for that key only: counted (``corrupt_values``,
``quotastream_agent_corrupt_values_total``) and logged once per key.

``for_client`` resolves clients with the live configuration the engine publishes
(``QuotaClient.follow_live_config``), checked at most once per ``max_staleness_ms``: an agent
reads a client's new counter at most that long after the engine first writes it, the same bound
as for any decision it caches. See ``docs/agents.md``.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import redis
from prometheus_client import CollectorRegistry, Counter, Gauge

from quotastream.client import QuotaClient
from quotastream.clock import SYSTEM_CLOCK, Clock
from quotastream.outage import Outage
from quotastream.redis_contract import CorruptValueError, Decision
from state.config import QuotaConfig

log = logging.getLogger(__name__)

#: What counts as Redis being unreachable (redis-py's ``AuthenticationError`` and
#: ``BusyLoadingError`` are ``ConnectionError``\\ s). Other errors (a refused command: a
#: misconfigured ACL) are raised.
UNREACHABLE: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError, OSError)


class FailurePolicy(StrEnum):
    OPEN = "open"  # no delay: traffic flows unthrottled while the engine cannot be read
    CLOSED = "closed"  # delay everyone by ``fail_closed_delay_ms``


class Source(StrEnum):
    """Where an answer came from (the staleness flag)."""

    FRESH = "fresh"  # read from Redis by this lookup
    CACHED = "cached"  # from the cache, younger than ``max_staleness_ms``
    STALE = "stale"  # Redis unreachable: from the cache, younger than ``fail_open_staleness_ms``
    FAIL_OPEN = "fail_open"  # Redis unreachable and nothing recent cached: no delay
    FAIL_CLOSED = "fail_closed"  # Redis unreachable and nothing recent cached: the policy delay


@dataclass(frozen=True)
class CacheSettings:
    #: How old a cached decision may be to answer without a round trip.
    max_staleness_ms: int = 1_000
    #: How old a cached decision may be to answer while Redis is unreachable.
    fail_open_staleness_ms: int = 30_000
    #: Socket connect and read timeout of each Redis call (``connect`` sets it).
    timeout_ms: int = 200
    failure_policy: FailurePolicy = FailurePolicy.OPEN
    #: The delay a fail-closed answer imposes.
    fail_closed_delay_ms: int = 1_000
    #: While Redis is unreachable, how long lookups answer without trying it.
    backoff_ms: int = 1_000
    #: Cached decisions kept (least recently used first out).
    max_entries: int = 100_000

    def __post_init__(self) -> None:
        if min(self.max_staleness_ms, self.timeout_ms, self.backoff_ms, self.max_entries) <= 0:
            raise ValueError("staleness, timeout, backoff and cache size must be positive")
        if self.fail_open_staleness_ms < self.max_staleness_ms:
            raise ValueError("fail_open_staleness_ms must be at least max_staleness_ms")
        if self.fail_closed_delay_ms < 0:
            raise ValueError("fail_closed_delay_ms must not be negative")


@dataclass(frozen=True)
class Answer:
    #: The decision (None: the entity has none, or a failure-policy answer).
    decision: Decision | None
    source: Source
    #: How long ago the decision was read from Redis (0 when fresh or from the policy).
    age_ms: int
    #: The delay to apply now: the decision's ``throttle_ms_now()``, or the policy's.
    throttle_ms: int

    @property
    def stale(self) -> bool:
        """Redis could not be read for this answer (a stale cache entry or the policy)."""
        return self.source in (Source.STALE, Source.FAIL_OPEN, Source.FAIL_CLOSED)


#: The corrupt-value record of the published live configuration (either of its keys).
_LIVE_CONFIG = ("live_config", "")


@dataclass(frozen=True)
class _Entry:
    decision: Decision | None
    read_at: float  # ``clock.monotonic()`` seconds


class CachedQuotaClient:
    """``QuotaClient.lookup`` and ``for_client`` with a local cache and a failure policy.

    Thread-safe. ``clock`` (:mod:`quotastream.clock`, injectable): its monotonic seconds age
    entries and pace retries, its wall milliseconds are what ``Decision.throttle_ms_now``
    measures ``until`` against.
    """

    def __init__(
        self,
        client: QuotaClient,
        settings: CacheSettings | None = None,
        *,
        name: str = "redis",
        registry: CollectorRegistry | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.client = client
        self.settings = settings or CacheSettings()
        self.name = name
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._live_config_checked_at: float | None = None
        # An agent never gives up on Redis: it answers by its failure policy meanwhile.
        self._outage = Outage(
            f"Redis {name}",
            math.inf,
            meanwhile=(
                f"answering from cached decisions up to {self.settings.fail_open_staleness_ms} ms "
                f"old, else failing {self.settings.failure_policy.value}; retrying every "
                f"{self.settings.backoff_ms} ms"
            ),
            clock=clock,
            logger=log,
        )
        self._retry_at = 0.0
        self._meanwhile = (
            f"answering from cached decisions up to {self.settings.fail_open_staleness_ms} ms "
            f"old, else failing {self.settings.failure_policy.value}, until it holds a decision"
        )
        #: Lookups answered without trying Redis because it was down (within the backoff).
        self.skipped = 0
        #: Values read that were not decisions (each answered by the failure policy).
        self.corrupt_values = 0
        self._corrupt_keys: set[tuple[str, str]] = set()
        self._metrics = _Metrics(registry) if registry is not None else None

    @staticmethod
    def connect(
        host: str,
        port: int,
        prefix: str = "quotastream",
        config: QuotaConfig | None = None,
        settings: CacheSettings | None = None,
        *,
        registry: CollectorRegistry | None = None,
        clock: Clock = SYSTEM_CLOCK,
        **redis_options: Any,
    ) -> CachedQuotaClient:
        """A cached client on its own connection, with ``settings.timeout_ms`` and no retries.

        ``redis_options`` go to ``redis.Redis`` (``username``, ``password``, ``ssl``, ...).
        redis-py's own default retries (three, with backoff) would hold a lookup for seconds
        against a dead Redis; here a lookup makes one attempt, and ``backoff_ms`` paces the next.
        """
        settings = settings or CacheSettings()
        # One attempt per lookup: ``backoff_ms`` paces retries, not redis-py.
        client = QuotaClient.connect(
            host, port, prefix, config, timeout_s=settings.timeout_ms / 1000, **redis_options
        )
        return CachedQuotaClient(
            client,
            settings,
            name=f"{host}:{port}",
            registry=registry,
            clock=clock,
        )

    @property
    def redis_up(self) -> bool:
        """False from a failed call until the next successful one."""
        return not self._outage.down

    @property
    def errors(self) -> int:
        """Failed Redis calls (at most one per ``backoff_ms`` during an outage)."""
        return self._outage.failures

    @property
    def outages(self) -> int:
        """Outages seen (transitions from up to down)."""
        return self._outage.outages

    def lookup(self, quota: str, entity: str) -> Answer:
        """The decision for an entity key, from the cache when it is recent enough."""
        key = (quota, entity)
        now = self._clock.monotonic()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and self._age_ms(entry, now) < self.settings.max_staleness_ms:
                self._entries.move_to_end(key)
                return self._answer(entry.decision, Source.CACHED, self._age_ms(entry, now))
            if self._outage.down and now < self._retry_at:
                self.skipped += 1
                return self._unreachable(entry, now)
            if self._outage.down:
                # This caller probes; the others keep answering without trying until it is done.
                self._retry_at = now + self.settings.backoff_ms / 1000
        try:
            decision = self.client.lookup(quota, entity)
        except UNREACHABLE as error:
            with self._lock:
                self._failed(error)
                return self._unreachable(self._entries.get(key), self._clock.monotonic())
        except CorruptValueError as error:
            with self._lock:
                self._recovered()  # Redis answered
                self._corrupt(key, error, self._meanwhile)
                return self._unreachable(self._entries.get(key), self._clock.monotonic())
        with self._lock:
            self._recovered()
            self._corrupt_keys.discard(key)
            self._entries[key] = _Entry(decision, self._clock.monotonic())
            self._entries.move_to_end(key)
            while len(self._entries) > self.settings.max_entries:
                self._entries.popitem(last=False)
            return self._answer(decision, Source.FRESH, 0)

    def for_client(self, quota: str, user: str, client_id: str, broker: int) -> Answer:
        """The answer for a client. Its entity is resolved locally with the live configuration
        (checked at most once per ``max_staleness_ms``; the rules remember each client's)."""
        self._follow_live_config()
        return self.lookup(quota, self.client.entity_of_client(quota, user, client_id, broker))

    def _follow_live_config(self) -> None:
        """Checks the published configuration version if it was not checked within
        ``max_staleness_ms``; a failed check is an outage or a corrupt value like a lookup's,
        and clients stay resolved as before."""
        now = self._clock.monotonic()
        with self._lock:
            checked_at = self._live_config_checked_at
            if checked_at is not None and now - checked_at < self.settings.max_staleness_ms / 1000:
                return
            if self._outage.down and now < self._retry_at:
                return
            self._live_config_checked_at = now
            if self._outage.down:
                self._retry_at = now + self.settings.backoff_ms / 1000
        try:
            self.client.follow_live_config()
        except UNREACHABLE as error:
            with self._lock:
                self._failed(error)
            return
        except CorruptValueError as error:
            with self._lock:
                self._recovered()
                self._corrupt(
                    _LIVE_CONFIG,
                    error,
                    "resolving clients as before until it holds a published configuration",
                )
            return
        with self._lock:
            self._recovered()
            self._corrupt_keys.discard(_LIVE_CONFIG)

    def _age_ms(self, entry: _Entry, now: float) -> int:
        return max(int((now - entry.read_at) * 1000), 0)

    def _answer(self, decision: Decision | None, source: Source, age_ms: int) -> Answer:
        if source is Source.FAIL_OPEN:
            throttle_ms = 0
        elif source is Source.FAIL_CLOSED:
            throttle_ms = self.settings.fail_closed_delay_ms
        else:
            throttle_ms = 0 if decision is None else decision.throttle_ms_now(self._clock)
        if self._metrics is not None:
            self._metrics.answers.labels(source.value).inc()
        return Answer(decision, source, age_ms, throttle_ms)

    def _unreachable(self, entry: _Entry | None, now: float) -> Answer:
        if entry is not None:
            age_ms = self._age_ms(entry, now)
            if age_ms < self.settings.fail_open_staleness_ms:
                return self._answer(entry.decision, Source.STALE, age_ms)
        if self.settings.failure_policy is FailurePolicy.CLOSED:
            return self._answer(None, Source.FAIL_CLOSED, 0)
        return self._answer(None, Source.FAIL_OPEN, 0)

    def _failed(self, error: Exception) -> None:
        self._retry_at = self._clock.monotonic() + self.settings.backoff_ms / 1000
        if self._metrics is not None:
            self._metrics.errors.inc()
        if self._outage.failed(error) and self._metrics is not None:
            self._metrics.up.set(0)

    def _corrupt(self, key: tuple[str, str], error: CorruptValueError, meanwhile: str) -> None:
        self.corrupt_values += 1
        if self._metrics is not None:
            self._metrics.corrupt.inc()
        if key not in self._corrupt_keys:
            if len(self._corrupt_keys) >= self.settings.max_entries:
                self._corrupt_keys.clear()
            self._corrupt_keys.add(key)
            log.warning("%s; %s", error, meanwhile)

    def _recovered(self) -> None:
        if self._outage.recovered() is not None and self._metrics is not None:
            self._metrics.up.set(1)


class _Metrics:
    """The agent's Prometheus metrics, in the caller's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.errors = Counter(
            "quotastream_agent_redis_errors",
            "Redis calls that failed (connection refused, timeout); one per backoff when down",
            registry=registry,
        )
        self.answers = Counter(
            "quotastream_agent_answers",
            "Lookups answered, by source (fresh, cached, stale, fail_open, fail_closed)",
            ["source"],
            registry=registry,
        )
        self.corrupt = Counter(
            "quotastream_agent_corrupt_values",
            "Values read that are not decisions (corrupt, or written by something else); each "
            "answered as if Redis were unreachable",
            registry=registry,
        )
        self.up = Gauge(
            "quotastream_agent_redis_up",
            "1 while the last Redis call succeeded, 0 during an outage",
            registry=registry,
        )
        self.up.set(1)
