"""Events an agent publishes to the engine's events topic, as batched messages: JSON arrays of
events, each message under the engine's ``events.max_payload_bytes`` (``docs/events.md``,
"Batched messages"). ``quotastream proxy`` publishes its clients' usage this way, and
``quotastream brokers`` the counts it reads from the brokers' metrics and the lineages it walks,
each in passes (:func:`publish_every`)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import NamedTuple, Protocol, TypeVar

import msgspec
from kafka.errors import KafkaError

from quotastream.outage import Outage, run_passes


class CountedEvent(msgspec.Struct, kw_only=True, gc=False, omit_defaults=True):
    """What every counted event carries; each kind adds its own fields (``None``: left out)."""

    kind: str
    ts: int
    bytes: int
    count: int


class Message(NamedTuple):
    value: bytes
    events: int
    bytes: int  # the counted bytes its events carry (for the dropped-bytes metric)


def batched_messages(events: Sequence[CountedEvent], max_bytes: int) -> list[Message]:
    """JSON arrays of events, each at most ``max_bytes`` (one event per message at worst)."""
    encoder = msgspec.json.Encoder()
    messages: list[Message] = []
    batch: list[bytes] = []
    counted = 0
    size = 2  # the brackets

    def close_batch() -> None:
        messages.append(Message(b"[" + b",".join(batch) + b"]", len(batch), counted))

    for event in events:
        encoded = encoder.encode(event)
        if batch and size + len(encoded) + 1 > max_bytes:
            close_batch()
            batch, size, counted = [], 2, 0
        batch.append(encoded)
        size += len(encoded) + 1
        counted += event.bytes
    if batch:
        close_batch()
    return messages


Event = TypeVar("Event", bound=CountedEvent)


class PollingSource(Protocol[Event]):
    """An agent part that reads what it publishes in passes (the brokers' metrics, lineages)."""

    def poll(self) -> list[Event]: ...

    def publish(self, events: Sequence[Event]) -> None: ...


def publish_every(
    source: PollingSource[Event], stopped: threading.Event, interval_s: float, outage: Outage
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
