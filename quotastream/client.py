"""The lookup client enforcement agents use (key contract: ``docs/redis.md``)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar, cast

import msgspec
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from quotastream.keys import (
    decision_key,
    decision_patterns,
    live_config_key,
    live_config_version_key,
    release_channel,
    remote_log_key,
    timers_key,
)
from quotastream.published_config import PublishedConfig, PublishedVersion
from state.config import QuotaConfig, parse_quota_config
from state.configfile import ConfigError
from state.leader_epochs import breach
from state.quota_rules import QuotaRules
from state.quota_types import CLIENT_QUOTA_TYPES, QuotaType
from state.timer_stats import TimerStats


class CorruptValueError(ValueError):
    """A key holds a value the engine does not write there: corrupt, or written by something
    else. Agents treat it as a failed read (``docs/agents.md``)."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key} does not hold a quotastream value: {problem}")
        self.key = key
        self.problem = problem


@dataclass(frozen=True)
class Decision:
    quota: str
    entity: str
    throttle_ms: int  # as decided, at decided_at
    until: int  # epoch ms when the throttle ends (decided_at + throttle_ms)
    rate: float
    limit: float | None
    exceeded: bool
    window_ms: int
    decided_at: int
    #: Whether the decision binds. A shadow, exempt or disabled decision (``mode``) reports what
    #: would apply and never delays anyone.
    enforced: bool = True
    mode: str = "enforced"
    #: The live configuration version the decision was made with.
    config_version: int = 0
    #: When the engine released the throttle (its timer fired, a newer decision or an operator
    #: ended it); None while it is pending, or when there was none.
    released_at: int | None = None

    @staticmethod
    def from_json(key: str, quota: str, entity: str, raw: bytes) -> Decision:
        """The decision stored at ``key`` for (``quota``, ``entity``); fields the engine may add
        later are ignored, a missing or mistyped one raises :class:`CorruptValueError`."""
        try:
            decision = _DECISION.decode(raw)
        except msgspec.MsgspecError as exc:
            raise CorruptValueError(key, str(exc)) from None
        if (decision.quota, decision.entity) != (quota, entity):
            raise CorruptValueError(
                key, f"it is the decision of {decision.quota} {decision.entity!r}"
            )
        return decision

    def throttle_ms_now(self, now_ms: int | None = None) -> int:
        """How long the entity is still throttled, from now (0 for a decision not enforced)."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return remaining_throttle_ms(self.until, self.released_at, self.enforced, now)


_DECISION = msgspec.json.Decoder(Decision)


def remaining_throttle_ms(until: int, released_at: int | None, enforced: bool, now_ms: int) -> int:
    """How long a decision still throttles at ``now_ms``: 0 once released, or if not enforced."""
    if released_at is not None or not enforced:
        return 0
    return max(until - now_ms, 0)


def decision_keys(client: redis.Redis, prefix: str) -> list[bytes]:
    """Every decision key under ``prefix`` (a scan: for dashboards and tests, not agents)."""
    return [
        key
        for pattern in decision_patterns(prefix)
        for key in client.scan_iter(pattern, count=10_000)
    ]


@dataclass(frozen=True)
class RemoteLog:
    """A partition's remote log (KIP-852), as the engine last wrote it."""

    topic: str
    partition: int
    total: int  # RemoteLogSizeBytes: bytes in remote storage, all leader epochs
    epochs: dict[int, int]  # leader epoch -> bytes of the segments listed under it
    segments: list[tuple[str, int, int]]  # (segment id, leader epoch, bytes), oldest copy first
    #: The size retention counts: within the reported lineage (all live segments without one).
    retention_bytes: int = 0
    #: The cleaner's walk: (segment id, bytes, within the lineage), in order.
    retention_walk: list[tuple[str, int, bool]] = field(default_factory=list)
    #: The lineage the broker last reported: (leader epoch, first offset), or None.
    lineage: list[tuple[int, int]] | None = None

    def size(self, leader_epoch: int) -> int:
        """``remoteLogSize(partition, leaderEpoch)``: 0 for an epoch with no remote segments."""
        return self.epochs.get(leader_epoch, 0)

    def retention_breach(self, retention_bytes: int, local_only_bytes: int) -> list[str]:
        """The segments size-based retention deletes, in order (Kafka's walk)."""
        return breach(self.retention_walk, self.retention_bytes, local_only_bytes, retention_bytes)

    @staticmethod
    def of(document: dict[str, Any]) -> RemoteLog:
        """From the engine's document (one written before lineages counts every segment)."""
        segments = [(str(s), int(e), int(b)) for s, e, b in document["segments"]]
        retention = document.get("retention") or {
            "lineage": None,
            "bytes": document["total"],
            "walk": [[segment, size, True] for segment, _, size in segments],
        }
        lineage = retention["lineage"]
        return RemoteLog(
            str(document["topic"]),
            int(document["partition"]),
            int(document["total"]),
            {int(epoch): int(size) for epoch, size in document["epochs"].items()},
            segments,
            int(retention["bytes"]),
            [(str(s), int(b), bool(w)) for s, b, w in retention["walk"]],
            None if lineage is None else [(int(e), int(o)) for e, o in lineage],
        )


@dataclass(frozen=True)
class _Resolver:
    """What clients are resolved with: a quota configuration, and where it came from."""

    rules: QuotaRules | None  # None: no configuration to resolve with
    #: The published live configuration's identity; None: the static quota file.
    published: PublishedVersion | None = None


_T = TypeVar("_T")
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
            return RemoteLog(topic, partition, 0, {}, [])
        assert isinstance(raw, bytes)
        try:
            return RemoteLog.of(msgspec.json.decode(raw))
        except (msgspec.MsgspecError, LookupError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptValueError(key, f"{type(exc).__name__}: {exc}") from None

    def timer_counts(self) -> TimerStats:
        """Throttle timers summed over the engine's shards (as each last reported)."""
        per_shard = cast(dict[bytes, bytes], self._redis.hgetall(timers_key(self._prefix)))
        reports = [json.loads(raw) for raw in per_shard.values()]
        return TimerStats(
            **{f.name: sum(int(r[f.name]) for r in reports) for f in fields(TimerStats)}
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
        values = self._redis.mget(live_config_version_key(self._prefix), key)
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
        published = _decoded(_PUBLISHED_VERSION, version_key, published_version)
        if published == current.published:
            return False
        document_key = live_config_key(self._prefix)
        raw = self._redis.get(document_key)
        if raw is None:  # gone since (evicted, flushed): as if nothing were published
            self._resolver = self._static
            return current is not self._static
        document = _decoded(_PUBLISHED_CONFIG, document_key, raw)
        try:
            config = parse_quota_config(document.config, document_key)
        except ConfigError as exc:
            raise CorruptValueError(document_key, str(exc)) from None
        self._resolver = _Resolver(QuotaRules(config), document.identity)
        return True

    def entity_of_client(self, quota: str, user: str, client_id: str, broker: int) -> str:
        """The client's counter under the configuration it is currently resolved with (no
        round trip: :meth:`for_client` follows the live configuration first)."""
        rules = self._resolver.rules
        if rules is None:
            raise ValueError(
                "resolving a client's entity needs the quota config: none was given and the "
                "engine has published none"
            )
        return rules.client(_client_quota(quota, user, broker), user, client_id, broker).entity


def _client_quota(quota: str, user: str, broker: int) -> QuotaType:
    """``quota`` as a client quota type, once the client is one the engine's events can name."""
    if quota not in CLIENT_QUOTA_TYPES:
        raise ValueError(f"{quota!r} is not a client quota ({', '.join(CLIENT_QUOTA_TYPES)})")
    if not user:
        raise ValueError("a client's user must not be empty")
    if isinstance(broker, bool) or not isinstance(broker, int) or broker < 0:
        raise ValueError(f"broker {broker!r} is not a broker id (an integer >= 0)")
    return QuotaType(quota)


def _decision(key: str, quota: str, entity: str, raw: object) -> Decision | None:
    if raw is None:
        return None
    assert isinstance(raw, bytes)
    return Decision.from_json(key, quota, entity, raw)


def _decoded(decoder: msgspec.json.Decoder[_T], key: str, raw: object) -> _T:
    assert isinstance(raw, bytes)
    try:
        return decoder.decode(raw)
    except msgspec.MsgspecError as exc:
        raise CorruptValueError(key, str(exc)) from None
