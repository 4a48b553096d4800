"""The lookup client enforcement agents use (key contract: ``docs/redis.md``)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields
from typing import Any, cast

import msgspec
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from quotastream.published_config import PublishedConfig, PublishedVersion
from quotastream.redis_contract import (
    CorruptValueError,
    Decision,
    decision_key,
    decision_patterns,
    decode_decision,
    decode_remote_log,
    decode_timer_counts,
    decoded,
    live_config_key,
    live_config_version_key,
    release_channel,
    remote_log_key,
    timers_key,
)
from state.config import QuotaConfig, parse_quota_config
from state.configfile import ConfigError
from state.live_config import Mode
from state.quota_rules import QuotaRules, Resolved, per_broker
from state.quota_types import CLIENT_QUOTA_TYPES, QuotaType
from state.remote_log_view import RemoteLog
from state.timer_stats import TimerStats
from state.window import WindowSpec, window_spec


def decision_keys(client: redis.Redis, prefix: str) -> list[bytes]:
    """Every decision key under ``prefix`` (a scan: for dashboards and tests, not agents)."""
    return [
        key
        for pattern in decision_patterns(prefix)
        for key in client.scan_iter(pattern, count=10_000)
    ]


@dataclass(frozen=True)
class _Resolver:
    """What clients are resolved with: a quota configuration, and where it came from."""

    rules: QuotaRules | None  # None: no configuration to resolve with
    #: The published live configuration's identity; None: the static quota file.
    published: PublishedVersion | None = None


_PUBLISHED_VERSION = msgspec.json.Decoder(PublishedVersion)
_PUBLISHED_CONFIG = msgspec.json.Decoder(PublishedConfig)


class QuotaClient:
    """Reads decisions, and resolves a client's counter as the engine does.

    ``config`` is the static quota file. Clients are resolved with the live configuration the
    engine publishes (:mod:`quotastream.published_config`) whenever there is one, and with
    ``config`` while none is published: ``for_client`` reads the published version in the same
    round trip as the decision, and rebuilds the resolver when it changes.
    """

    def __init__(
        self, client: redis.Redis, prefix: str = "quotastream", config: QuotaConfig | None = None
    ) -> None:
        self._redis = client
        self._prefix = prefix
        self._version_key = live_config_version_key(prefix)
        self._static = _Resolver(QuotaRules(config) if config is not None else None)
        self._resolver = self._static

    @staticmethod
    def connect(
        host: str,
        port: int,
        prefix: str = "quotastream",
        config: QuotaConfig | None = None,
        *,
        timeout_s: float | None = None,
        **redis_options: Any,
    ) -> QuotaClient:
        """A client on its own connection; ``redis_options`` go to ``redis.Redis``.

        With ``timeout_s``, every call makes one attempt bounded by it: redis-py's default
        retries (three, with backoff) would hold a call for seconds against a dead Redis.
        """
        if timeout_s is not None:
            redis_options = redis_options | {
                "socket_timeout": timeout_s,
                "socket_connect_timeout": timeout_s,
                "retry": Retry(NoBackoff(), 0),
            }
        return QuotaClient(redis.Redis(host=host, port=port, **redis_options), prefix, config)

    def lookup(self, quota: str, entity: str) -> Decision | None:
        """The decision for an entity key (``user=alice,client-id=app1,broker=1``), if any.

        Raises :class:`CorruptValueError` when the key holds something else."""
        key = decision_key(self._prefix, quota, entity)
        return _decision(key, quota, entity, self._redis.get(key))

    def wait_until_released(self, quota: str, entity: str, timeout_s: float) -> Decision | None:
        """Block until the entity's throttle ends, woken by the engine's release notice.

        Returns the entity's decision then (None if it has none). Returns when ``until`` passes
        even if no notice came (a notice published while nobody listened is lost), and after
        ``timeout_s`` at the latest; check ``throttle_ms_now()`` on the result.
        """
        deadline = time.monotonic() + timeout_s
        # redis-py leaves pubsub() unannotated.
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        with pubsub as channel:
            # Subscribed before reading, so a release between the two is not missed.
            channel.subscribe(release_channel(self._prefix, quota, entity))
            decision = self.lookup(quota, entity)
            while decision is not None and decision.throttle_ms_now() > 0:
                left = min(deadline - time.monotonic(), decision.throttle_ms_now() / 1000)
                if left <= 0:
                    break
                if channel.get_message(timeout=left) is not None:
                    decision = self.lookup(quota, entity)
        return decision

    def remote_log(self, topic: str, partition: int) -> RemoteLog:
        """A partition's remote log sizes in one round trip (empty when it has none)."""
        key = remote_log_key(self._prefix, topic, partition)
        raw = self._redis.get(key)
        if raw is None:
            return RemoteLog(topic, partition, 0)
        return decode_remote_log(key, raw)

    def timer_counts(self) -> TimerStats:
        """Throttle timers summed over the engine's shards (as each last reported)."""
        key = timers_key(self._prefix)
        per_shard = cast(dict[bytes, bytes], self._redis.hgetall(key))
        reports = [decode_timer_counts(key, raw) for raw in per_shard.values()]
        return TimerStats(
            **{f.name: sum(getattr(r, f.name) for r in reports) for f in fields(TimerStats)}
        )

    def for_client(self, quota: str, user: str, client_id: str, broker: int) -> Decision | None:
        """The decision that applies to a client, whichever counter its quota level uses under
        the live configuration: one round trip, unless the published version changed."""
        if self._resolver.rules is None:
            # Nothing to resolve with yet but what the engine may have published.
            self.follow_live_config()
            return self.lookup(quota, self.entity_of_client(quota, user, client_id, broker))
        entity = self.entity_of_client(quota, user, client_id, broker)
        key = decision_key(self._prefix, quota, entity)
        # Not redis-py's mget(), which imports inside its body on every call (~10 us).
        values = self._redis.execute_command("MGET", self._version_key, key)  # type: ignore[no-untyped-call]
        assert isinstance(values, list)
        published, raw = values
        if self._follow(published):
            followed = self.entity_of_client(quota, user, client_id, broker)
            if followed != entity:
                return self.lookup(quota, followed)
        return _decision(key, quota, entity, raw)

    @property
    def config_version(self) -> int | None:
        """The live configuration version clients are resolved with; None: the static file."""
        published = self._resolver.published
        return None if published is None else published.version

    def follow_live_config(self) -> bool:
        """Resolves clients with the live configuration the engine published last, or with the
        static file while none is published; True when that changed.

        One ``GET`` of the published version; the configuration itself is read only when its
        version changed. Raises :class:`CorruptValueError` (and keeps resolving as before) when
        a key holds something else.
        """
        return self._follow(self._redis.get(live_config_version_key(self._prefix)))

    def _follow(self, published_version: object) -> bool:
        current = self._resolver
        if published_version is None:
            self._resolver = self._static
            return current is not self._static
        version_key = live_config_version_key(self._prefix)
        published = decoded(_PUBLISHED_VERSION, version_key, published_version)
        if published == current.published:
            return False
        document_key = live_config_key(self._prefix)
        raw = self._redis.get(document_key)
        if raw is None:  # gone since (evicted, flushed): as if nothing were published
            self._resolver = self._static
            return current is not self._static
        document = decoded(_PUBLISHED_CONFIG, document_key, raw)
        try:
            config = parse_quota_config(document.config, document_key)
        except ConfigError as exc:
            raise CorruptValueError(document_key, str(exc)) from None
        self._resolver = _Resolver(QuotaRules(config), document.identity)
        return True

    def entity_of_client(self, quota: str, user: str, client_id: str, broker: int | None) -> str:
        """The client's counter under the configuration it is currently resolved with (no
        round trip: :meth:`for_client` follows the live configuration first). ``broker`` may be
        None only for a quota measured cluster-wide (``scope: cluster``), whose counters name
        no broker; ValueError for one measured per broker."""
        return self._resolved(quota, user, client_id, broker).entity

    def undecided(self, quota: str, user: str, client_id: str, broker: int) -> Decision:
        """A client's decision before the engine has made one (its counter has no key): nothing
        counted (``decided_at`` 0), under the limit it resolves to. An enforcement point that
        counts what it forwards measures the client's window from it (``quotastream proxy``).
        No round trip."""
        resolved = self._resolved(quota, user, client_id, broker)
        return Decision(
            quota=quota,
            entity=resolved.entity,
            throttle_ms=0,
            until=0,
            rate=0.0,
            limit=None if math.isinf(resolved.limit) else resolved.limit,
            exceeded=False,
            window_ms=1,
            decided_at=0,
            enforced=resolved.mode is Mode.ENFORCED,
            mode=resolved.mode.value,
        )

    def largest_fetch(self, user: str, client_id: str, broker: int, brokers: int) -> int | None:
        """The most one fetch response may carry under the client's binding fetch quota, as a
        broker caps a fetch's ``max_bytes`` (Kafka's ``maxValueInQuotaWindow``: limit x
        (samples - 1) x window); a cluster-wide quota's window is shared by the ``brokers``
        a consumer fetches from at once. None: unlimited, or a quota that does not bind. No
        round trip."""
        resolved = self._resolved("fetch", user, client_id, broker)
        if math.isinf(resolved.limit) or resolved.mode is not Mode.ENFORCED:
            return None
        rules = self._resolver.rules
        assert rules is not None
        window = rules.config.quota_types.of(QuotaType.FETCH)
        shared_by = max(brokers, 1) if window.scope == "cluster" else 1
        return int(resolved.limit * (window.samples - 1) * window.window_ms / 1000 / shared_by)

    def window_of(self, quota: str) -> WindowSpec:
        """How a client quota measures usage under the configuration currently followed (no
        round trip)."""
        rules = self._resolver.rules
        if rules is None:
            raise ValueError(
                "measuring a client's window needs the quota config: none was given and the "
                "engine has published none"
            )
        return window_spec(rules.config, QuotaType(quota))

    def _resolved(self, quota: str, user: str, client_id: str, broker: int | None) -> Resolved:
        rules = self._resolver.rules
        if rules is None:
            raise ValueError(
                "resolving a client's entity needs the quota config: none was given and the "
                "engine has published none"
            )
        quota_type = _client_quota(quota, user, broker)
        if broker is None and per_broker(rules.config, quota_type):
            raise ValueError(
                f"{quota} is measured per broker (quota_types.{quota}.scope: broker): the "
                "client's counter names the broker it is connected to"
            )
        return rules.client(quota_type, user, client_id, broker)


def _client_quota(quota: str, user: str, broker: int | None) -> QuotaType:
    """``quota`` as a client quota type, once the client is one the engine's events can name."""
    if quota not in CLIENT_QUOTA_TYPES:
        raise ValueError(f"{quota!r} is not a client quota ({', '.join(CLIENT_QUOTA_TYPES)})")
    if not user:
        raise ValueError("a client's user must not be empty")
    if broker is None:
        return QuotaType(quota)
    if isinstance(broker, bool) or not isinstance(broker, int) or broker < 0:
        raise ValueError(f"broker {broker!r} is not a broker id (an integer >= 0)")
    return QuotaType(quota)


def _decision(key: str, quota: str, entity: str, raw: object) -> Decision | None:
    if raw is None:
        return None
    assert isinstance(raw, bytes)
    return decode_decision(key, raw, (quota, entity))
