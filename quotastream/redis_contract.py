"""The Redis contract between the engine and enforcement points (``docs/redis.md``).

Everything written to Redis or published there is defined here once: the key and channel names,
and each value's type with its JSON form. The engine's sinks encode with these functions; the
agent client, its cache, the live view and the metrics decode with them. Reading is strict about
what matters and lenient about what may grow: a value that lacks a field or mistypes one raises
:class:`CorruptValueError`, a field the engine adds later is ignored.

"Unlimited" is one thing on this side of the engine: a decision's ``limit`` is None (JSON null).
The core computes with ``inf``; the decision rows it emits carry a null limit.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from quotastream.clock import SYSTEM_CLOCK, Clock
from state.quota_types import QuotaType
from state.remote_log_view import RemoteLog
from state.timer_stats import TimerStats

# --- Names -------------------------------------------------------------------------------------


def decision_key(prefix: str, quota: str, entity: str) -> str:
    """The key holding an entity's latest decision."""
    return f"{prefix}:{quota}:{entity}"


def decision_patterns(prefix: str) -> list[str]:
    """``SCAN MATCH`` patterns that find every decision key, and nothing else."""
    return [f"{prefix}:{quota.value}:*" for quota in QuotaType]


def release_channel(prefix: str, quota: str, entity: str) -> str:
    """The pub/sub channel where the end of an entity's throttle is announced."""
    return f"{prefix}:released:{quota}:{entity}"


def timers_key(prefix: str) -> str:
    """The hash of per-shard timer counts."""
    return f"{prefix}:timers"


def remote_log_key(prefix: str, topic: str, partition: int) -> str:
    """The key holding a partition's remote log sizes (KIP-852)."""
    return f"{prefix}:remote_log_size:{topic}:{partition}"


def live_config_key(prefix: str) -> str:
    """The key holding the live configuration the engine decides with (version and document)."""
    return f"{prefix}:live_config"


def live_config_version_key(prefix: str) -> str:
    """The key holding only the identity of :func:`live_config_key`'s document: what agents
    read to notice a change."""
    return f"{prefix}:live_config_version"


# --- Values ------------------------------------------------------------------------------------


class CorruptValueError(ValueError):
    """A key holds a value the engine does not write there: corrupt, or written by something
    else. Agents treat it as a failed read (``docs/agents.md``)."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key} does not hold a quotastream value: {problem}")
        self.key = key
        self.problem = problem


class Decision(msgspec.Struct, frozen=True):
    """An entity's latest decision: the value at :func:`decision_key`, in this field order."""

    quota: str
    entity: str
    throttle_ms: int  # as decided, at decided_at
    until: int  # epoch ms when the throttle ends (decided_at + throttle_ms)
    rate: float
    limit: float | None  # None: unlimited
    exceeded: bool
    window_ms: int
    decided_at: int
    #: Whether the decision binds. A shadow, exempt or disabled decision (``mode``) reports what
    #: would apply and never delays anyone. (Defaults: values written before the field existed.)
    enforced: bool = True
    mode: str = "enforced"
    #: The live configuration version the decision was made with.
    config_version: int = 0
    #: When the engine released the throttle (its timer fired, a newer decision or an operator
    #: ended it); None while it is pending, or when there was none.
    released_at: int | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.quota, self.entity)

    def throttle_ms_at(self, now_ms: int) -> int:
        """How long the entity is still throttled at ``now_ms``: 0 once released, or when the
        decision does not bind. The only definition of "throttled now"."""
        if self.released_at is not None or not self.enforced:
            return 0
        return max(self.until - now_ms, 0)

    def throttle_ms_now(self, clock: Clock = SYSTEM_CLOCK) -> int:
        """:meth:`throttle_ms_at` ``clock``'s wall milliseconds."""
        return self.throttle_ms_at(clock.wall_ms())

    @property
    def utilisation(self) -> float | None:
        """rate / limit; None when unlimited (or a limit of 0, which no rate fits)."""
        if self.limit is None or self.limit <= 0:
            return None
        return self.rate / self.limit


def decode_decision(key: str, raw: object, entity: tuple[str, str] | None = None) -> Decision:
    """The decision stored at ``key``; with ``entity`` (quota, entity), it must be that one's."""
    decision = decoded(_DECISION, key, raw)
    if entity is not None and decision.key != entity:
        raise CorruptValueError(key, f"it is the decision of {decision.quota} {decision.entity!r}")
    return decision


class ReleaseNotice(msgspec.Struct, frozen=True):
    """What subscribers of :func:`release_channel` receive when a pending throttle ends."""

    quota: str
    entity: str
    reason: str  # why it ended (state.throttle_timers: expired, superseded, ...)
    released_at: int
    until: int


def remote_log_value(remote_log: RemoteLog) -> bytes:
    """The value at :func:`remote_log_key` (written only while the partition has segments)."""
    return encode(remote_log)


def decode_remote_log(key: str, raw: object) -> RemoteLog:
    return decoded(_REMOTE_LOG, key, raw)


def timer_counts_value(stats: TimerStats) -> bytes:
    """One shard's field of the :func:`timers_key` hash."""
    return encode(stats)


def decode_timer_counts(key: str, raw: object) -> TimerStats:
    return decoded(_TIMER_COUNTS, key, raw)


#: JSON of any contract value (compact, in field order).
encode = msgspec.json.Encoder().encode

_T = TypeVar("_T")
_DECISION = msgspec.json.Decoder(Decision)
_REMOTE_LOG = msgspec.json.Decoder(RemoteLog)
_TIMER_COUNTS = msgspec.json.Decoder(TimerStats)


def decoded(decoder: msgspec.json.Decoder[_T], key: str, raw: object) -> _T:
    """``raw``, read from ``key``, decoded as ``decoder``'s type, or :class:`CorruptValueError`."""
    if not isinstance(raw, bytes | str):
        raise CorruptValueError(key, f"a {type(raw).__name__}, not a string")
    try:
        return decoder.decode(raw)
    except msgspec.MsgspecError as exc:
        raise CorruptValueError(key, str(exc)) from None
