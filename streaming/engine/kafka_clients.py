"""kafka-python clients as the engine uses them: consumers without a group, true end offsets,
and calls that ride out a broker outage.

An outage is what kafka-python calls a retriable error: a refused or lost connection, a request
timeout, a partition without a leader (a broker restarting, a leader moving). Every Kafka call
of the engine treats one the same way (:func:`ride_out`, :class:`quotastream.outage.Outage`):
wait and try again, one warning as the outage begins and one as it ends, and give up only after
``kafka.max_outage_s``. Anything else (a refused login, a missing topic's authorisation, lost
offsets) is not waited out.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from quotastream.outage import Outage
from streaming.engine.client_settings import settings_for
from streaming.engine.offsets import Offsets

log = logging.getLogger(__name__)

# kafka-python logs every failed reconnect and metadata refresh at ERROR, several a second while
# a broker is down; the engine reports an outage itself, once as it begins and once as it ends.
for _noisy in ("kafka.net", "kafka.cluster"):
    logging.getLogger(_noisy).setLevel(logging.CRITICAL)

#: The pause between two attempts while a broker is unreachable (each attempt has its own
#: timeout, so this only keeps a refused connection from being retried in a busy loop).
RETRY_PAUSE_S = 0.5

#: The shortest request timeout given to a consumer (it must outlast a fetch's long poll).
_MIN_REQUEST_TIMEOUT_MS = 1_000

#: The longest pause between two attempts to connect to a broker. kafka-python 3 doubles the
#: pause after each refused attempt up to 30 s, so a broker back after an outage of a minute
#: went unnoticed for up to half a minute more (a trigger after it still planned nothing, and
#: every executor's consumer waited its own pause); Java's client stops at 1 s too.
RECONNECT_BACKOFF_MAX_MS = 1_000

T = TypeVar("T")


def is_outage(error: BaseException) -> bool:
    """An unreachable or leaderless broker, or a timeout: worth waiting out."""
    return isinstance(error, KafkaError) and bool(error.retriable)


def kafka_outage(bootstrap_servers: str, max_outage_s: float | None, **options: Any) -> Outage:
    """The outage clock of one Kafka cluster, named by its bootstrap servers."""
    return Outage(f"Kafka at {bootstrap_servers}", max_outage_s, logger=log, **options)


def ride_out(call: Callable[[], T], outage: Outage, pause_s: float = RETRY_PAUSE_S) -> T:
    """``call()`` until it succeeds. Each outage in between counts toward ``outage``, which gives
    up after its ``max_outage_s``; any other error is raised at once."""
    while True:
        try:
            result = call()
        except KafkaError as error:
            if not is_outage(error):
                raise
            outage.failed(error)
            time.sleep(pause_s)
            continue
        outage.recovered()
        return result


def new_consumer(
    bootstrap_servers: str, client: Mapping[str, Any], request_timeout_ms: int
) -> KafkaConsumer:
    """A consumer that reads assigned partitions from given offsets and commits nothing.

    It never creates a topic by asking for it: a broker that lost its topics would otherwise
    recreate them with its default partition count, hiding the loss.

    No request waits longer than ``request_timeout_ms`` (unless ``client`` says otherwise):
    some of kafka-python's waits (a metadata refresh) have no bound of their own but this one,
    30 s by default, and a hung broker would hold a trigger for that long. The same bound holds
    for meeting the broker at all, and a broker that comes back is noticed within
    :data:`RECONNECT_BACKOFF_MAX_MS`.
    """
    settings = settings_for(
        KafkaConsumer,
        client,
        bootstrap_servers=bootstrap_servers.split(","),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",
        allow_auto_create_topics=False,
        # kafka-python requires it above the fetch's long poll (fetch_max_wait_ms, 500 ms).
        request_timeout_ms=max(request_timeout_ms, _MIN_REQUEST_TIMEOUT_MS),
        # A consumer made while the broker is down (a query or an executor starting during an
        # outage) waits this long to meet it, 30 s by default.
        bootstrap_timeout_ms=max(request_timeout_ms, _MIN_REQUEST_TIMEOUT_MS),
        reconnect_backoff_max_ms=RECONNECT_BACKOFF_MAX_MS,
    )
    consumer = KafkaConsumer(**settings)
    _ask_metadata_as_configured(consumer, settings["allow_auto_create_topics"])
    return consumer


def _ask_metadata_as_configured(consumer: KafkaConsumer, allow_auto_create_topics: bool) -> None:
    """kafka-python 3.0.12 builds the consumer's cluster metadata without its
    ``allow_auto_create_topics``, so every Metadata request asked the broker to create the
    topics it names: a broker restarted empty got the events topic back with one partition
    from the engine's own source. The setting is handed on here; a kafka-python whose metadata
    no longer has it fails loudly rather than creating topics again."""
    metadata_config = consumer._client.cluster.config
    if "allow_auto_create_topics" not in metadata_config:
        raise RuntimeError("kafka-python's cluster metadata has no allow_auto_create_topics")
    metadata_config["allow_auto_create_topics"] = allow_auto_create_topics


def end_offsets(
    consumer: KafkaConsumer, partitions: Sequence[TopicPartition], timeout_ms: int
) -> Offsets:
    """Each partition's end offset (ListOffsets: its high watermark), of the partitions the
    broker knows (:func:`_known_offsets`). A broker that does not answer in ``timeout_ms``
    raises kafka-python's timeout."""
    return _known_offsets(consumer.end_offsets, partitions, timeout_ms)


def beginning_offsets(
    consumer: KafkaConsumer, partitions: Sequence[TopicPartition], timeout_ms: int
) -> Offsets:
    """Each partition's earliest offset, as :func:`end_offsets` its end."""
    return _known_offsets(consumer.beginning_offsets, partitions, timeout_ms)


def _known_offsets(
    ask: Callable[..., dict[TopicPartition, int]],
    partitions: Sequence[TopicPartition],
    timeout_ms: int,
) -> Offsets:
    """kafka-python fails a whole ListOffsets with a KeyError when the broker answers that it
    does not know one of the partitions (a topic deleted, or gone with a broker's lost log,
    while the client's metadata still lists it). Then each partition is asked on its own and
    the unknown ones are left out: for the caller they are partitions that are not there."""
    if not partitions:
        return {}
    try:
        found = ask(list(partitions), timeout_ms=timeout_ms)
    except KeyError:
        found = {}
        for tp in partitions:
            with contextlib.suppress(KeyError):
                found |= ask([tp], timeout_ms=timeout_ms)
    return {(tp.topic, tp.partition): offset for tp, offset in found.items()}


def partition_name(tp: TopicPartition) -> str:
    return f"{tp.topic}-{tp.partition}"
