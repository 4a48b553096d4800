"""Usage out: the bytes the broker counts, summed per sample and published as events.

What is counted is what the broker's quota records (``docs/semantics.md``): a Produce request's
size (the frame without its 4-byte length, ``acks=0`` too), a Fetch response's
``FetchResponse.sizeOf`` (4 + its body). The proxy sums them per (quota, user, client-id,
broker, sample of the quota's window) with the number of requests as ``count``; a sum's ``ts``
is its latest request's time, so the engine's samples see the same last event as Kafka's.

Every ``flush_interval_ms`` the sums are handed to a publisher thread, which sends them as
batched messages (JSON arrays, each under the engine's ``max_payload_bytes``) to the events
topic, each message tagged with the proxy instance in a ``quotastream-proxy`` header. The hot
path never waits for Kafka: sums are bounded (``max_pending_sums``) and so is the queue of
flushes waiting for the publisher. What cannot be kept, because Kafka or the topic is
unavailable for longer than those bounds or the send fails, is counted as dropped (events and
bytes, by reason) and logged once per outage: never silently.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from quotastream.producer_close import close_producer
from quotastream.producer_close import longest_close_s as longest_producer_close_s
from quotastream.published_events import CountedEvent, Message, batched_messages

log = logging.getLogger(__name__)

PRODUCE: Final = "produce"
FETCH: Final = "fetch"

#: The message header naming the proxy instance that published a message.
INSTANCE_HEADER: Final = "quotastream-proxy"


class UsageEvent(CountedEvent, kw_only=True, gc=False):
    """A ``produce`` or ``fetch`` event of the engine's contract (``docs/events.md``)."""

    user: str
    client_id: str
    broker: int


@dataclass(frozen=True, slots=True)
class _SumKey:
    kind: str
    user: str
    client_id: str
    broker: int
    sample: int


class _Sum:
    __slots__ = ("bytes", "count", "ts")

    def __init__(self) -> None:
        self.bytes = 0
        self.count = 0
        self.ts = 0


@dataclass
class Dropped:
    """What could not be published, by reason (a metric and a log line, never silent)."""

    events: int = 0
    bytes: int = 0


class UsageSums:
    """Per-sample sums of counted bytes; owned by the proxy's event loop thread."""

    def __init__(
        self,
        window_ms: dict[str, int],
        max_pending_sums: int,
        on_drop: Callable[[str, int, int], None],
    ) -> None:
        self._window_ms = window_ms
        self._max = max_pending_sums
        self._on_drop = on_drop
        self._sums: dict[_SumKey, _Sum] = {}

    def __len__(self) -> int:
        return len(self._sums)

    def record(
        self, *, kind: str, user: str, client_id: str, broker: int, nbytes: int, now_ms: int
    ) -> None:
        key = _SumKey(kind, user, client_id, broker, now_ms // self._window_ms[kind])
        total = self._sums.get(key)
        if total is None:
            if len(self._sums) >= self._max:
                self._on_drop("buffer_full", 1, nbytes)
                return
            total = self._sums[key] = _Sum()
        total.bytes += nbytes
        total.count += 1
        total.ts = now_ms

    def take(self) -> list[UsageEvent]:
        """The sums so far as events (and an empty book)."""
        sums, self._sums = self._sums, {}
        return [
            UsageEvent(
                kind=key.kind,
                ts=total.ts,
                bytes=total.bytes,
                count=total.count,
                user=key.user,
                client_id=key.client_id,
                broker=key.broker,
            )
            for key, total in sums.items()
        ]


class UsagePublisher:
    """Sends flushed sums to the events topic from a thread of its own (kafka-python).

    ``new_producer()`` makes a ``KafkaProducer`` (its ``max_block_ms`` bounds how long a send
    may wait for a broker that is down); it is called in the publisher's thread, again after it
    failed, so that a proxy starts while Kafka is down. ``on_published(events)`` and
    ``on_drop(reason, events, bytes)`` count outcomes from the producer's callbacks.
    """

    def __init__(
        self,
        new_producer: Callable[[], Any],
        *,
        topic: str,
        instance: str,
        max_message_bytes: int,
        max_queued_flushes: int,
        on_published: Callable[[int], None],
        on_drop: Callable[[str, int, int], None],
    ) -> None:
        self._new_producer = new_producer
        self._producer: Any = None
        self._topic = topic
        self._headers = [(INSTANCE_HEADER, instance.encode())]
        self._max_message_bytes = max_message_bytes
        self._queue: queue.Queue[list[UsageEvent] | None] = queue.Queue(max_queued_flushes)
        self._on_published = on_published
        self._on_drop = on_drop
        self._failing = False
        self._close_timeout_s = 0.0
        self._thread = threading.Thread(target=self._run, name="usage-publisher", daemon=True)
        self._thread.start()

    def offer(self, events: list[UsageEvent]) -> None:
        """Hands a flush to the publisher; counted as dropped when the publisher is that far
        behind (Kafka down for longer than the queue holds)."""
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
            log.error("the usage publisher did not catch up within %.0f s of the stop", timeout_s)
            return
        self._thread.join(max(deadline - time.monotonic(), 0.0))
        if self._thread.is_alive():
            log.error(
                "the usage publisher had not closed %.0f s after the stop: what it still held "
                "is not counted",
                longest,
            )

    def _run(self) -> None:
        while (events := self._queue.get()) is not None:
            if self._producer is None:
                try:
                    self._producer = self._new_producer()
                except Exception as error:  # NoBrokersAvailable, a bad setting
                    self._dropped("publish_failed", events, error)
                    continue
            for message in batched_messages(events, self._max_message_bytes):
                self._send(message)
        if self._producer is not None:
            # What it cannot send in time fails its futures: counted as dropped.
            close_producer(self._producer, self._close_timeout_s)

    def _send(self, message: Message) -> None:
        count, nbytes = message.events, message.bytes
        try:
            future = self._producer.send(self._topic, value=message.value, headers=self._headers)
        except Exception as error:  # KafkaTimeoutError (no metadata), BufferError, closed
            self._failed(error)
            self._on_drop("publish_failed", count, nbytes)
            return
        future.add_callback(lambda _metadata: self._delivered(count))
        future.add_errback(lambda error: self._undelivered(error, count, nbytes))

    def _delivered(self, count: int) -> None:
        if self._failing:
            self._failing = False
            log.warning("events topic %s is reachable again: publishing usage", self._topic)
        self._on_published(count)

    def _undelivered(self, error: Exception, count: int, nbytes: int) -> None:
        self._failed(error)
        self._on_drop("publish_failed", count, nbytes)

    def _failed(self, error: Exception) -> None:
        if not self._failing:
            self._failing = True
            log.error(
                "cannot publish usage to %s (%s): client traffic flows on, and what cannot be "
                "published is counted as dropped (quotastream_proxy_events_dropped_total)",
                self._topic,
                error,
            )

    def _dropped(self, reason: str, events: list[UsageEvent], error: Exception) -> None:
        self._failed(error)
        self._on_drop(reason, len(events), sum(event.bytes for event in events))
