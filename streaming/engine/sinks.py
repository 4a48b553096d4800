"""Where decisions and rejects go: Redis for enforcement points, Kafka for the dead letter.

Both writers run on the executors (inside ``mapInArrow``), one pipelined round trip per Arrow
batch, so no micro-batch is collected to the driver. The key contract is in ``docs/redis.md``.
Replaying a micro-batch after a crash writes the same values again: Redis ends in the same
state; the dead-letter topic may hold a reject twice, identified by its source coordinates.

With the first decisions made with a configuration version, the sink publishes that version's
configuration for agents (:mod:`quotastream.published_config`), in the same pipeline, before them.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import redis
from kafka import KafkaProducer
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

from quotastream.clock import SYSTEM_CLOCK
from quotastream.outage import Outage
from quotastream.published_config import publish_arguments
from quotastream.redis_contract import (
    ReleaseNotice,
    decision_key,
    encode,
    release_channel,
    remote_log_key,
    timer_counts_value,
    timers_key,
)
from state.event_contract import dead_letter_record
from state.live_config import ConfigVersions, LiveConfig
from state.timer_stats import TimerStats
from streaming.engine.batch_summary import SUMMARY_SCHEMA, BatchSummary, SummaryRequest
from streaming.engine.client_settings import settings_for
from streaming.engine.decision_values import decision_values
from streaming.engine.kafka_clients import RECONNECT_BACKOFF_MAX_MS, kafka_outage, ride_out
from streaming.engine.stages import DECISION, REJECT, REMOTE_LOG, TIMERS, unpacked
from streaming.engine.worker_heap import freeze_imports

if TYPE_CHECKING:
    from streaming.engine.settings import EngineSettings

log = logging.getLogger(__name__)

WRITE_COUNTS = pa.schema([("decisions", pa.int64()), ("rejects", pa.int64())])
#: What :func:`write_batches` yields when the driver asks for a metrics summary.
WRITE_SUMMARY = SUMMARY_SCHEMA


@dataclass(frozen=True)
class SinkSettings:
    #: redis-py connection options (:meth:`RedisSettings.connection`; holds the password).
    redis: Mapping[str, Any] = field(repr=False)
    key_prefix: str = "quotastream"
    #: How long a written decision stays readable (the shard gives each its expiry); here,
    #: how often each process publishes the configuration again.
    keep_ms: int = 30_000
    dead_letter_topic: str = "quotastream.dead-letter"
    kafka_bootstrap: str = ""
    #: kafka-python settings of the dead-letter producer (TLS, SASL: secrets).
    kafka_client: Mapping[str, Any] = field(default_factory=dict, repr=False)
    #: How long a micro-batch's dead letters wait out a broker that does not answer.
    kafka_max_outage_s: float = 300.0
    #: While Redis is unreachable a write is retried with exponential backoff (from 50 ms up
    #: to ``max_backoff_ms``) for at most ``max_outage_s``; then the micro-batch fails.
    max_outage_s: float = 300.0
    max_backoff_ms: int = 500
    #: The configuration versions decisions are made with, published for agents (None: not
    #: published).
    configs: ConfigVersions | None = field(default=None, repr=False)
    #: This run of the query: what it publishes replaces any earlier run's.
    run: str = field(default_factory=lambda: uuid.uuid4().hex)

    @staticmethod
    def of(settings: EngineSettings, configs: ConfigVersions | None = None) -> SinkSettings:
        return SinkSettings(
            redis=settings.redis.connection(),
            key_prefix=settings.redis.key_prefix,
            keep_ms=settings.redis.keep_ms,
            dead_letter_topic=settings.kafka.dead_letter_topic,
            kafka_bootstrap=settings.kafka.bootstrap_servers,
            kafka_client=settings.kafka.client_settings(),
            kafka_max_outage_s=settings.kafka.max_outage_s,
            max_outage_s=settings.redis.max_outage_s,
            max_backoff_ms=settings.redis.max_backoff_ms,
            configs=configs,
        )

    @staticmethod
    def local(host: str, port: int, **options: Any) -> SinkSettings:
        """Writing to a Redis without credentials (tests, benchmarks)."""
        return SinkSettings(redis={"host": host, "port": port}, **options)


def release_notice(row: dict[str, Any]) -> ReleaseNotice:
    """The notice of a decision row that ended a pending throttle (``notice`` set)."""
    return ReleaseNotice(
        row["quota"], row["entity"], row["notice"], row["released_at"], int(row["until"])
    )


#: Sets many keys, each with its own expiry, in one command: redis-py spends more per pipelined
#: command than Redis does, and a batch may write a decision per entity of a shard.
_SET_EACH = """
for i, key in ipairs(KEYS) do
  redis.call('SET', key, ARGV[2 * i - 1], 'PXAT', ARGV[2 * i])
end
return #KEYS
"""
_KEYS_PER_SET_EACH = 1_000

Command = tuple[str, tuple[Any, ...], dict[str, Any]]


def decision_commands(
    decisions: pa.RecordBatch, values: list[bytes], settings: SinkSettings
) -> list[Command]:
    """The Redis commands that write ``decisions`` (their ``values``, each until its
    ``expire_at``) and announce the throttles that ended."""
    prefix = settings.key_prefix
    quota = decisions.column("quota").to_pylist()
    entity = decisions.column("entity").to_pylist()
    keys = list(map(partial(decision_key, prefix), quota, entity))
    expire_at = decisions.column("expire_at").to_pylist()
    commands: list[Command] = []
    for first in range(0, len(keys), _KEYS_PER_SET_EACH):
        last = first + _KEYS_PER_SET_EACH
        pairs = zip(values[first:last], expire_at[first:last], strict=True)
        arguments = [item for pair in pairs for item in pair]
        chunk = keys[first:last]
        commands.append(("eval", (_SET_EACH, len(chunk), *chunk, *arguments), {}))
    ended = pc.is_valid(decisions.column("notice"))
    for row in decisions.filter(ended).to_pylist():
        channel = release_channel(prefix, row["quota"], row["entity"])
        commands.append(("publish", (channel, encode(release_notice(row))), {}))
    return commands


#: Per process and query run (prefix, run): the configuration version published last, and when.
_PUBLISHED: dict[tuple[str, str], tuple[int, int]] = {}


def config_to_publish(
    decisions: pa.RecordBatch, settings: SinkSettings, now: int
) -> LiveConfig | None:
    """The configuration to publish with ``decisions``: the newest version they were made with,
    unless this process published it (or a newer one) for this run less than ``keep_ms`` ago.
    Published again after ``keep_ms``, so that a Redis that lost it has it again by then."""
    if settings.configs is None or decisions.num_rows == 0:
        return None
    version = pc.max(decisions.column("config_version")).as_py()
    if version is None:
        return None
    last = _PUBLISHED.get((settings.key_prefix, settings.run))
    if last is not None:
        last_version, published_at = last
        # Older: a throttle released under an earlier version; the newer one stays.
        if version < last_version or (
            version == last_version and now - published_at < settings.keep_ms
        ):
            return None
    return settings.configs.at(int(version))


def write_batches(
    batches: Iterator[pa.RecordBatch],
    settings: SinkSettings,
    summary: SummaryRequest | None = None,
) -> Iterator[pa.RecordBatch]:
    """Writes one partition of a micro-batch's output; yields how many rows went where.

    With a ``summary`` request, yields instead a bounded summary of what was written for the
    metrics (:data:`WRITE_SUMMARY`, ``streaming/engine/batch_summary.py``), with the failed Redis
    attempts.
    """
    client = redis_client(settings)
    for batch in batches:
        now = SYSTEM_CLOCK.wall_ms()  # when written: the summary's written_at
        report = BatchSummary(summary, now) if summary is not None else None
        is_decision = pc.equal(batch.column("row_type"), DECISION)
        decisions = batch.filter(is_decision)
        # Only what an agent would act on (state/written_decisions.py); the metrics see all.
        written = decisions.filter(decisions.column("write"))
        commands = decision_commands(written, decision_values(written), settings)
        # Published with any decision made with it, written or not: agents resolve clients,
        # and the proxy caps fetches, with it.
        live = config_to_publish(decisions, settings, now)
        if live is not None:
            # First: an agent that reads a decision made with it can read it too.
            arguments = publish_arguments(settings.key_prefix, live, settings.run)
            commands.insert(0, ("eval", arguments, {}))
        dead_letters: list[bytes] = []
        prefix = settings.key_prefix
        for row in batch.filter(pc.invert(is_decision)).to_pylist():
            if row["row_type"] == REMOTE_LOG:
                key = remote_log_key(prefix, row["topic"], row["partition"])
                # Sizes are kept, not expired: they change only with segment events.
                if row["remote_log"] is not None:
                    commands.append(("set", (key, row["remote_log"]), {}))
                else:
                    commands.append(("delete", (key,), {}))
            elif row["row_type"] == TIMERS:
                counts = TimerStats(**{f.name: row[f"timers_{f.name}"] for f in fields(TimerStats)})
                commands.append(
                    (
                        "hset",
                        (timers_key(prefix), str(row["shard"]), timer_counts_value(counts)),
                        {},
                    )
                )
            elif row["row_type"] == REJECT:
                dead_letters.append(_dead_letter(row))
            if report is not None:
                report.add_other(row)
        if report is not None:
            report.decisions_of(decisions, written.num_rows)
        failures = execute_with_retry(client, commands, settings)
        if live is not None:
            _PUBLISHED[(settings.key_prefix, settings.run)] = (live.version, now)
        send_dead_letters(dead_letters, settings)
        if report is not None:
            report.redis_failures = failures
            yield report.batch()
            continue
        yield pa.RecordBatch.from_pylist(
            [{"decisions": written.num_rows, "rejects": len(dead_letters)}], schema=WRITE_COUNTS
        )


def write_packed(
    batches: Iterator[pa.RecordBatch],
    settings: SinkSettings,
    summary: SummaryRequest | None = None,
) -> Iterator[pa.RecordBatch]:
    """:func:`write_batches` of the stateful stage's packed output (``stages.PACKED_SCHEMA``)."""
    freeze_imports()
    return write_batches(unpacked(batches), settings, summary)


def execute_with_retry(client: redis.Redis, commands: list[Command], settings: SinkSettings) -> int:
    """Sends ``commands`` in one pipelined round trip, retrying while Redis is unreachable.

    Returns the failed attempts. Every command is idempotent but ``publish`` (a release notice
    may then arrive twice), so a retry sends them all again. Raises :class:`OutageError` once
    Redis has been unreachable for ``max_outage_s``.
    """
    if not commands:
        return 0
    outage = Outage(f"Redis {_endpoint(settings)}", settings.max_outage_s, logger=log)

    def attempt() -> None:
        # A failed pipeline forgets its commands: each attempt builds its own.
        pipeline = client.pipeline(transaction=False)
        for name, args, kwargs in commands:
            getattr(pipeline, name)(*args, **kwargs)
        pipeline.execute()

    backoff = ExponentialBackoff(cap=settings.max_backoff_ms / 1000, base=0.05)
    retry = Retry(backoff, retries=-1, supported_errors=_UNREACHABLE)
    retry.call_with_retry(attempt, outage.failed, is_retryable=_is_outage)
    outage.recovered()
    return outage.failures


def send_dead_letters(records: list[bytes], settings: SinkSettings) -> None:
    """Sends rejected events to the dead-letter topic and waits until the broker has them all,
    waiting out a broker that does not answer for up to ``kafka_max_outage_s``.

    The producer keeps what it could not deliver and retries it (its delivery timeout outlasts
    the outage limit); a send or flush that times out meanwhile counts toward the outage.
    """
    if not records:
        return
    outage = kafka_outage(settings.kafka_bootstrap, settings.kafka_max_outage_s)
    producer = ride_out(lambda: _producer(settings), outage)
    topic = settings.dead_letter_topic
    futures = [ride_out(partial(producer.send, topic, value), outage) for value in records]
    ride_out(lambda: producer.flush(timeout=_PRODUCER_WAIT_MS / 1000), outage)
    for future in futures:
        if future.failed():
            raise future.exception


_UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, OSError)


def _is_outage(error: Exception) -> bool:
    # A refused login is a configuration error, not an outage: waiting will not fix it.
    return not isinstance(error, redis.AuthenticationError)


def _endpoint(settings: SinkSettings) -> str:
    return f"{settings.redis.get('host')}:{settings.redis.get('port')}"


def _dead_letter(row: dict[str, Any]) -> bytes:
    source = {key: row[key] for key in ("topic", "partition", "offset", "index")}
    record = dead_letter_record(row["reason"], row["detail"], row["payload"] or b"", source)
    return json.dumps(record).encode()


_REDIS: dict[tuple[tuple[str, Any], ...], redis.Redis] = {}
_PRODUCERS: dict[tuple[tuple[str, Any], ...], KafkaProducer] = {}


def close_cached_clients() -> None:
    """Closes the Redis clients and dead-letter producers this process's writes keep (a worker
    keeps them for its life; see ``kafka_source.close_worker_consumers``)."""
    while _PRODUCERS:
        _, producer = _PRODUCERS.popitem()
        producer.close(timeout=1)
    while _REDIS:
        _, client = _REDIS.popitem()
        client.close()


def redis_client(settings: SinkSettings) -> redis.Redis:
    # Keyed by the credentials too: a worker may serve queries that log in differently.
    key = tuple(sorted(settings.redis.items()))
    if key not in _REDIS:
        # No retries inside redis-py: execute_with_retry owns the backoff and the count.
        _REDIS[key] = redis.Redis(**settings.redis, retry=Retry(NoBackoff(), 0))
    return _REDIS[key]


#: How long one send may block (for metadata) and one flush may wait, before the outage clock
#: is asked whether to go on waiting.
_PRODUCER_WAIT_MS = 2_000


def _producer(settings: SinkSettings) -> KafkaProducer:
    key = (
        ("bootstrap", settings.kafka_bootstrap),
        ("max_outage_s", settings.kafka_max_outage_s),
        *sorted(settings.kafka_client.items()),
    )
    if key not in _PRODUCERS:
        _PRODUCERS[key] = KafkaProducer(
            **settings_for(
                KafkaProducer,
                settings.kafka_client,
                bootstrap_servers=settings.kafka_bootstrap.split(","),
                max_block_ms=_PRODUCER_WAIT_MS,
                # Undelivered records are kept and retried for longer than an outage is waited out.
                delivery_timeout_ms=int(settings.kafka_max_outage_s * 1000) + 120_000,
                reconnect_backoff_max_ms=RECONNECT_BACKOFF_MAX_MS,
            )
        )
    return _PRODUCERS[key]
