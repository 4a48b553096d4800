"""Kafka offset ranges for micro-batches: planning, rate limiting and the source's options.

Offsets are kept in Spark's checkpoint as ``{"topic": {"partition": next offset}}`` (JSON object
keys are strings), the same shape as Spark's own Kafka source, with one more entry
(:data:`LAYOUT_KEY`, no topic's name) that pins the checkpoint's shard layout.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from kafka import KafkaConsumer

from streaming.engine.client_settings import ClientSettingError, typed_setting
from streaming.engine.shard_layout import ShardLayout

TopicPartition = tuple[str, int]
#: Next offset to read per topic-partition.
Offsets = dict[TopicPartition, int]


class SourceOptionError(ValueError):
    """A Kafka source option is missing or invalid; the message names it."""


#: The checkpoint's entry for the shard layout: "$" is in no Kafka topic's name.
LAYOUT_KEY = "$shards"


def to_json(offsets: Offsets, layout: ShardLayout | None = None) -> dict[str, dict[str, int]]:
    """The checkpoint form: ``{"topic": {"partition": offset}}``, sorted for stable output, and
    the ``layout`` the checkpoint keeps (None: one begun before layouts)."""
    result: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        result.setdefault(topic, {})[str(partition)] = offset
    if layout is not None:
        result[LAYOUT_KEY] = layout.to_json()
    return result


def from_json(data: Mapping[str, Mapping[str, int]]) -> Offsets:
    """The offsets of the checkpoint form (its layout: :func:`layout_of`)."""
    try:
        return {
            (str(topic), int(partition)): int(offset)
            for topic, partitions in data.items()
            if topic != LAYOUT_KEY
            for partition, offset in partitions.items()
        }
    except (AttributeError, TypeError, ValueError) as exc:
        raise SourceOptionError(f"offsets must look like {{'topic': {{'0': 42}}}}: {exc}") from None


def layout_of(data: Mapping[str, Any]) -> ShardLayout | None:
    """The shard layout the checkpoint form pins; None for a checkpoint begun before layouts."""
    if LAYOUT_KEY not in data:
        return None
    try:
        return ShardLayout.from_json(data[LAYOUT_KEY])
    except ValueError as exc:
        raise SourceOptionError(f"offsets' {LAYOUT_KEY!r}: {exc}") from None


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int  # first offset to read
    end: int  # first offset not to read

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class LostOffsets:
    """A partition whose batch ends below where it began: its log restarted (data loss)."""

    topic: str
    partition: int
    start: int
    end: int


def lost_offsets(start: object, end: object) -> list[LostOffsets]:
    """The partitions of a micro-batch that went backwards, from Spark's progress: each offset
    is this source's checkpoint form, as JSON text or parsed.

    Anything else (another source's offsets, none) has none.
    """
    begin, until = checkpoint_offsets(start), checkpoint_offsets(end)
    if begin is None or until is None:
        return []
    return [
        LostOffsets(topic, partition, begin[(topic, partition)], offset)
        for (topic, partition), offset in sorted(until.items())
        if offset < begin.get((topic, partition), 0)
    ]


def records_read(start: object, end: object, topics: Collection[str] | None = None) -> int:
    """How many Kafka records a micro-batch read, from Spark's progress (offsets as for
    :func:`lost_offsets`), counting only ``topics`` (None: all; the configuration log's offset
    is a version, not records read). A partition that restarted counts from 0."""
    begin, until = checkpoint_offsets(start), checkpoint_offsets(end)
    if until is None:
        return 0
    begin = begin or {}
    return sum(
        offset - (begin.get(tp, 0) if offset >= begin.get(tp, 0) else 0)
        for tp, offset in until.items()
        if topics is None or tp[0] in topics
    )


def checkpoint_offsets(value: object) -> Offsets | None:
    """Offsets as Spark's progress reports them (the checkpoint form, or its JSON text); None
    when absent or not offsets."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, Mapping):
        return None
    try:
        return from_json(value)
    except SourceOptionError:
        return None


def plan_ranges(start: Offsets, end: Offsets) -> list[OffsetRange]:
    """One range per topic-partition that has offsets to read, in a stable order."""
    return [
        OffsetRange(topic, partition, start.get((topic, partition), 0), until)
        for (topic, partition), until in sorted(end.items())
        if until > start.get((topic, partition), 0)
    ]


def group_ranges(
    ranges: list[OffsetRange], tasks: int, min_records: int
) -> list[list[OffsetRange]]:
    """``ranges`` packed into at most ``tasks`` read tasks of at least ``min_records`` records
    each (fewer tasks when there is little to read), balanced by size, in a stable order.

    Each task costs Spark a Python worker round trip (tens of milliseconds): a micro-batch of a
    few records should be one task, a large one should keep every core busy.
    """
    total = sum(offset_range.size for offset_range in ranges)
    count = max(1, min(len(ranges), tasks, total // max(min_records, 1)))
    groups: list[list[OffsetRange]] = [[] for _ in range(count)]
    loads = [0] * count
    # Largest first, each to the least loaded task: within 4/3 of the best balance.
    for offset_range in sorted(ranges, key=lambda r: (-r.size, r.topic, r.partition)):
        lightest = loads.index(min(loads))
        groups[lightest].append(offset_range)
        loads[lightest] += offset_range.size
    return [sorted(group, key=lambda r: (r.topic, r.partition)) for group in groups if group]


def limit_end(start: Offsets, available: Offsets, max_records: int | None) -> Offsets:
    """End offsets that read at most ``max_records`` in all, shared in proportion to each
    partition's backlog; a partition with a backlog always advances (as Spark's Kafka source)."""
    backlog = {tp: max(end - start.get(tp, 0), 0) for tp, end in available.items()}
    total = sum(backlog.values())
    if max_records is None or total <= max_records:
        return dict(available)
    limited = {}
    for tp, end in available.items():
        share = max_records * backlog[tp] / total
        step = math.ceil(share) if share < 1 else math.floor(share)
        limited[tp] = min(start.get(tp, 0) + step, end)
    return limited


_CLIENT_OPTION_PREFIX = "kafka."


@dataclass(frozen=True)
class SourceOptions:
    bootstrap_servers: str
    topics: tuple[str, ...]
    starting_offsets: Literal["earliest", "latest"] | Offsets = "latest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    #: How long one Kafka request of the source may take (offsets, the tail of a log) and how
    #: long a read waits for records before it checks whether they are gone or the broker down.
    poll_timeout_ms: int = 2_000
    #: How long the source waits out a broker that does not answer before the query fails.
    max_outage_s: float = 300.0
    #: Where the driver's source reports its outage clock (``streaming.engine.source_status``).
    status_file: str | None = None
    #: The live configuration's log (``streaming.engine.config_log``): its end offset is pinned with
    #: each batch's offsets as the configuration version the batch decides with.
    config_topic: str | None = None
    #: At most this many read tasks per micro-batch (the engine passes Spark's parallelism);
    #: None: one per topic-partition.
    read_tasks: int | None = None
    #: The shard layout a new checkpoint takes (one already begun keeps its own): ``shards``
    #: spread over ``stateTasks``, the ``spark.sql.shuffle.partitions`` the query starts with.
    layout: ShardLayout = field(default_factory=lambda: ShardLayout(1, 1))
    #: kafka-python settings from ``kafka.*`` options (``kafka.security.protocol`` ->
    #: ``security_protocol``). May hold secrets (SASL passwords): kept out of repr and logs.
    client: dict[str, Any] = field(default_factory=dict, repr=False)

    @staticmethod
    def parse(options: Mapping[str, str]) -> SourceOptions:
        """From Spark's ``.option()`` strings, with errors that name the option."""
        lowered = {key.lower(): value for key, value in options.items()}

        def required(name: str) -> str:
            value = lowered.get(name.lower(), "").strip()
            if not value:
                raise SourceOptionError(f"option {name!r} is required")
            return value

        topics = tuple(t.strip() for t in required("subscribe").split(",") if t.strip())
        starting = lowered.get("startingoffsets", "latest").strip()
        starting_offsets: Literal["earliest", "latest"] | Offsets
        if starting in ("earliest", "latest"):
            starting_offsets = starting  # type: ignore[assignment]
        else:
            try:
                starting_offsets = from_json(json.loads(starting))
            except json.JSONDecodeError:
                raise SourceOptionError(
                    f"option 'startingOffsets' must be earliest, latest or JSON, got {starting!r}"
                ) from None
        config_topic = lowered.get("configtopic", "").strip() or None
        if config_topic in topics:
            raise SourceOptionError(
                f"option 'configTopic' ({config_topic!r}) must not also be subscribed as events"
            )
        return SourceOptions(
            bootstrap_servers=required("kafka.bootstrap.servers"),
            topics=topics,
            starting_offsets=starting_offsets,
            max_offsets_per_trigger=_positive(lowered, "maxOffsetsPerTrigger", int),
            fail_on_data_loss=_boolean(lowered, "failOnDataLoss", default=True),
            poll_timeout_ms=_positive(lowered, "kafkaConsumer.pollTimeoutMs", int) or 2_000,
            max_outage_s=_positive(lowered, "maxOutageSeconds", float) or 300.0,
            status_file=lowered.get("statusfile", "").strip() or None,
            config_topic=config_topic,
            read_tasks=_positive(lowered, "readTasks", int),
            layout=ShardLayout(
                _positive(lowered, "shards", int) or 1, _positive(lowered, "stateTasks", int) or 1
            ),
            client=_client_settings(options),
        )


def _client_settings(options: Mapping[str, str]) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for key, value in options.items():
        if not key.lower().startswith(_CLIENT_OPTION_PREFIX):
            continue
        if key.lower() == "kafka.bootstrap.servers":
            continue
        name = key[len(_CLIENT_OPTION_PREFIX) :].replace(".", "_")
        if name not in KafkaConsumer.DEFAULT_CONFIG:
            raise SourceOptionError(
                f"option {key!r} is not a kafka-python consumer setting ({name!r})"
            )
        try:
            # Spark passes option values as text.
            settings[name] = typed_setting(name, value)
        except ClientSettingError as error:
            raise SourceOptionError(f"option {key!r} {error}") from None
    return settings


_Number = TypeVar("_Number", int, float)


def _positive(options: Mapping[str, str], name: str, kind: type[_Number]) -> _Number | None:
    raw = options.get(name.lower())
    if raw is None:
        return None
    whole = kind is int
    try:
        value = kind(raw)
    except ValueError:
        what = "a whole number" if whole else "a number"
        raise SourceOptionError(f"option {name!r} must be {what}, got {raw!r}") from None
    if not math.isfinite(value) or value <= 0:
        bound = ">= 1" if whole else "> 0"
        raise SourceOptionError(f"option {name!r} must be {bound}, got {raw!r}")
    return value


def _boolean(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise SourceOptionError(f"option {name!r} must be true or false, got {raw!r}")
