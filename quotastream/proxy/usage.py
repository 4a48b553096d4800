"""Usage out: the bytes the broker counts, summed per sample and published as events.

What is counted is what the broker's quota records (``docs/semantics.md``): a Produce request's
size (the frame without its 4-byte length, ``acks=0`` too), a Fetch response's
``FetchResponse.sizeOf`` (4 + its body). The proxy sums them per (quota, user, client-id,
broker, sample of the quota's window) with the number of requests as ``count``; a sum's ``ts``
is its latest request's time, so the engine's samples see the same last event as Kafka's.

Every ``flush_interval_ms`` the sums are handed to the agents' queued publisher
(:class:`quotastream.publisher.QueuedPublisher`, its thread sending them as batched messages to
the events topic), each message tagged with the proxy instance in a ``quotastream-proxy``
header. The hot path never waits for Kafka: sums are bounded (``max_pending_sums``) and so is
the queue of flushes waiting for the publisher. What cannot be kept, because Kafka or the topic
is unavailable for longer than those bounds or the send fails, is counted as dropped (events
and bytes, by reason) and logged once per outage: never silently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from quotastream.publisher import EventsPublisher, QueuedPublisher
from state.event_contract import EventKind, Fetch, Produce

PRODUCE: Final = EventKind.PRODUCE.value
FETCH: Final = EventKind.FETCH.value
#: The contract's struct of each kind counted.
_EVENT_OF_KIND: Final = {PRODUCE: Produce, FETCH: Fetch}

#: The message header naming the proxy instance that published a message.
INSTANCE_HEADER: Final = "quotastream-proxy"


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

    def take(self) -> list[Produce]:
        """The sums so far as events, ``produce`` or ``fetch`` (and an empty book)."""
        sums, self._sums = self._sums, {}
        return [
            _EVENT_OF_KIND[key.kind](
                ts=total.ts,
                bytes=total.bytes,
                count=total.count,
                user=key.user,
                client_id=key.client_id,
                broker=key.broker,
            )
            for key, total in sums.items()
        ]


def usage_publisher(
    new_producer: Callable[[], Any],
    *,
    topic: str,
    instance: str,
    max_message_bytes: int,
    max_queued_flushes: int,
    on_published: Callable[[int], None],
    on_drop: Callable[[str, int, int], None],
) -> QueuedPublisher:
    """The proxy's publisher: flushes of sums, queued for a thread that sends them to
    ``topic``, each message naming ``instance``. ``new_producer()`` makes a ``KafkaProducer``
    (its ``max_block_ms`` bounds how long a send may wait for a broker that is down); it is
    called in the publisher's thread, again after it failed, so that a proxy starts while Kafka
    is down."""
    return QueuedPublisher(
        EventsPublisher(
            new_producer,
            topic=topic,
            max_message_bytes=max_message_bytes,
            headers=[(INSTANCE_HEADER, instance.encode())],
        ),
        max_queued=max_queued_flushes,
        on_published=on_published,
        on_drop=on_drop,
        what="usage",
        meanwhile="client traffic flows on, and what cannot be published is counted as dropped "
        "(quotastream_proxy_events_dropped_total)",
    )
