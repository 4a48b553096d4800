"""The one way an agent publishes to the engine's events topic: the proxy's usage, and
``quotastream brokers``' remote log bridge, metrics source and lineage source.

Events are the contract's structs (:mod:`state.event_contract`), sent as batched messages: JSON
arrays of events, each message at most the engine's ``events.max_payload_bytes``
(``docs/events.md``, "Batched messages"). Where order matters (a segment's copy before its
delete), a send is keyed: every event of a key goes to one partition of the topic, in the order
given. One producer factory (:func:`events_producer`) makes every producer to the topic.

:class:`EventsPublisher` sends, and its caller waits for the brokers' acknowledgements where it
must know them (:meth:`EventsPublisher.publish`: the brokers' sources, which keep what failed
for their next pass; the bridge, which commits its position only past what was acknowledged).
:class:`QueuedPublisher` is for a hot path that must never wait for Kafka (the proxy): a thread
of its own sends, fed through a bounded queue, and what cannot be published is counted as
dropped, never silently.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

from kafka import KafkaProducer
from kafka.errors import KafkaError

from quotastream.outage import Outage, run_passes
from quotastream.producer_close import CLOSE_TIMEOUT_S, close_producer
from quotastream.producer_close import longest_close_s as longest_producer_close_s
from state.event_contract import Event, encode
from streaming.engine.client_settings import settings_for

log = logging.getLogger(__name__)

Published = TypeVar("Published", bound=Event)


def events_producer(
    bootstrap_servers: str, client: Mapping[str, Any], **overrides: Any
) -> KafkaProducer:
    """A producer to the engine's events topic that waits for every in-sync replica;
    ``client``: the engine's ``kafka.client`` settings (TLS, SASL), which override these."""
    return KafkaProducer(
        **settings_for(
            KafkaProducer,
            client,
            bootstrap_servers=bootstrap_servers,
            acks="all",
            linger_ms=5,
            **overrides,
        )
    )


class Message(NamedTuple):
    value: bytes
    events: int
    bytes: int  # the counted bytes its events carry (for the dropped-bytes metrics)


def batched_messages(events: Sequence[Event], max_bytes: int) -> list[Message]:
    """JSON arrays of events, each at most ``max_bytes`` (one event per message at worst)."""
    messages: list[Message] = []
    batch: list[bytes] = []
    counted = 0
    size = 2  # the brackets

    def close_batch() -> None:
        messages.append(Message(b"[" + b",".join(batch) + b"]", len(batch), counted))

    for event in events:
        encoded = encode(event)
        if batch and size + len(encoded) + 1 > max_bytes:
            close_batch()
            batch, size, counted = [], 2, 0
        batch.append(encoded)
        size += len(encoded) + 1
        counted += event.bytes
    if batch:
        close_batch()
    return messages


class EventsPublisher:
    """Sends events to one events topic through a producer it makes when first needed (Kafka
    may be down when an agent starts) and again after :meth:`close`.

    ``new_producer()`` makes a kafka-python ``KafkaProducer`` (:func:`events_producer`);
    ``headers`` go on every message (the proxy names its instance); ``dead_letter_topic`` is
    where :meth:`send_dead_letter` sends."""

    def __init__(
        self,
        new_producer: Callable[[], Any],
        *,
        topic: str,
        max_message_bytes: int,
        headers: Sequence[tuple[str, bytes]] = (),
        dead_letter_topic: str | None = None,
    ) -> None:
        self._new_producer = new_producer
        self._producer: Any = None
        self.topic = topic
        self._max_message_bytes = max_message_bytes
        self._headers = list(headers) or None
        self._dead_letter_topic = dead_letter_topic

    def producer(self) -> Any:
        """The producer, made now if there is none (raising what kept it from being made)."""
        if self._producer is None:
            self._producer = self._new_producer()
        return self._producer

    def messages(self, events: Sequence[Event]) -> list[Message]:
        return batched_messages(events, self._max_message_bytes)

    def send_message(self, message: Message, key: bytes | None = None) -> Any:
        """Sends one message; its future (raising what kept it from being queued)."""
        return self.producer().send(self.topic, value=message.value, key=key, headers=self._headers)

    def send(
        self, events: Sequence[Published], key_of: Callable[[Published], bytes] | None = None
    ) -> list[Any]:
        """Sends ``events`` as batched messages, keyed by ``key_of`` (each key's events in
        their order, in messages of their own); the messages' futures."""
        if key_of is None:
            return [self.send_message(message) for message in self.messages(events)]
        by_key: dict[bytes, list[Published]] = {}
        for event in events:
            by_key.setdefault(key_of(event), []).append(event)
        return [
            self.send_message(message, key)
            for key, keyed in by_key.items()
            for message in self.messages(keyed)
        ]

    def send_dead_letter(self, letter: Mapping[str, Any]) -> Any:
        """Sends a dead-letter record (:func:`state.event_contract.dead_letter_record`)."""
        if self._dead_letter_topic is None:
            raise ValueError("this publisher has no dead-letter topic")
        return self.producer().send(self._dead_letter_topic, json.dumps(letter).encode())

    def confirm(self, sent: Iterable[Any], timeout_s: float | None) -> None:
        """Returns once the brokers have every message ``sent`` (futures of this publisher's
        sends), raising the first that was not delivered; ``timeout_s`` bounds the wait for
        them (None: as long as the producer's own delivery timeout)."""
        self.producer().flush(timeout=timeout_s)
        for future in sent:
            future.get(timeout=0)

    def publish(
        self,
        events: Sequence[Published],
        key_of: Callable[[Published], bytes] | None = None,
        timeout_s: float = 30,
    ) -> None:
        """Sends ``events`` and returns once the brokers have them all (raising what was not
        delivered)."""
        self.confirm(self.send(events, key_of), timeout_s)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Closes the producer within :func:`~quotastream.producer_close.longest_close_s`: what
        it could not send in time fails its futures. The next send makes a new one."""
        if self._producer is not None:
            producer, self._producer = self._producer, None
            close_producer(producer, timeout_s)


class QueuedPublisher:
    """Publishes from a thread of its own, fed by :meth:`offer` through a bounded queue: the
    caller never waits for Kafka.

    ``max_queued`` bounds the offers waiting for the thread (Kafka down, or slow); past it an
    offer is dropped (``queue_full``). A producer that cannot be made, or a message that cannot
    be sent or is not acknowledged, drops its events (``publish_failed``); the producer is made
    again at the next offer after it could not be. ``on_published(events)`` and
    ``on_drop(reason, events, bytes)`` count outcomes from the producer's callbacks. The first
    failure of an outage is logged with ``meanwhile`` (what goes on, and where the drops are
    counted), and so is the recovery; ``what`` names what is published."""

    def __init__(
        self,
        publisher: EventsPublisher,
        *,
        max_queued: int,
        on_published: Callable[[int], None],
        on_drop: Callable[[str, int, int], None],
        what: str,
        meanwhile: str,
    ) -> None:
        self._publisher = publisher
        self._queue: queue.Queue[Sequence[Event] | None] = queue.Queue(max_queued)
        self._on_published = on_published
        self._on_drop = on_drop
        self._what = what
        self._meanwhile = meanwhile
        self._failing = False
        self._close_timeout_s = 0.0
        self._thread = threading.Thread(target=self._run, name=f"{what}-publisher", daemon=True)
        self._thread.start()

    def offer(self, events: Sequence[Event]) -> None:
        """Hands events to the thread; counted as dropped when it is that far behind (Kafka
        down for longer than the queue holds)."""
        if not events:
            return
        try:
            self._queue.put_nowait(events)
        except queue.Full:
            self._dropped("queue_full", events, RuntimeError("the publisher is that far behind"))

    @staticmethod
    def longest_close_s(timeout_s: float) -> float:
        """How long :meth:`close` may take: ``timeout_s`` for room in the queue, as long for
        the sends still queued, and the producer's own close."""
        return 2 * timeout_s + longest_producer_close_s(timeout_s)

    def close(self, timeout_s: float) -> None:
        """Publishes what was offered, then flushes and closes the producer. It returns once
        every event offered is counted as published or dropped (unless it logs that it could
        not), so the counts a stop leaves are whole."""
        self._close_timeout_s = timeout_s
        longest = self.longest_close_s(timeout_s)
        deadline = time.monotonic() + longest
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            log.error(
                "the %s publisher did not catch up within %.0f s of the stop", self._what, timeout_s
            )
            return
        self._thread.join(max(deadline - time.monotonic(), 0.0))
        if self._thread.is_alive():
            log.error(
                "the %s publisher had not closed %.0f s after the stop: what it still held "
                "is not counted",
                self._what,
                longest,
            )

    def _run(self) -> None:
        while (events := self._queue.get()) is not None:
            try:
                self._publisher.producer()
            except Exception as error:  # NoBrokersAvailable, a bad setting
                self._dropped("publish_failed", events, error)
                continue
            for message in self._publisher.messages(events):
                self._send(message)
        # What it cannot send in time fails its futures: counted as dropped.
        self._publisher.close(self._close_timeout_s)

    def _send(self, message: Message) -> None:
        count, nbytes = message.events, message.bytes
        try:
            future = self._publisher.send_message(message)
        except Exception as error:  # KafkaTimeoutError (no metadata), BufferError, closed
            self._failed(error)
            self._on_drop("publish_failed", count, nbytes)
            return
        future.add_callback(lambda _metadata: self._delivered(count))
        future.add_errback(lambda error: self._undelivered(error, count, nbytes))

    def _delivered(self, count: int) -> None:
        if self._failing:
            self._failing = False
            log.warning(
                "events topic %s is reachable again: publishing %s",
                self._publisher.topic,
                self._what,
            )
        self._on_published(count)

    def _undelivered(self, error: Exception, count: int, nbytes: int) -> None:
        self._failed(error)
        self._on_drop("publish_failed", count, nbytes)

    def _failed(self, error: Exception) -> None:
        if not self._failing:
            self._failing = True
            log.error(
                "cannot publish %s to %s (%s): %s",
                self._what,
                self._publisher.topic,
                error,
                self._meanwhile,
            )

    def _dropped(self, reason: str, events: Sequence[Event], error: Exception) -> None:
        self._failed(error)
        self._on_drop(reason, len(events), sum(event.bytes for event in events))


class PollingSource(Protocol[Published]):
    """An agent part that reads what it publishes in passes (the brokers' metrics, lineages)."""

    def poll(self) -> list[Published]: ...

    def publish(self, events: Sequence[Published]) -> None: ...


def publish_every(
    source: PollingSource[Published], stopped: threading.Event, interval_s: float, outage: Outage
) -> None:
    """``source.publish(source.poll())`` every ``interval_s`` until ``stopped``; a pass that
    fails on Kafka or the network is logged once per outage (:func:`run_passes`), and the next
    pass is the retry."""
    run_passes(
        lambda: source.publish(source.poll()),
        every_s=interval_s,
        stopped=stopped,
        outage=outage,
        errors=(KafkaError, OSError),
    )
