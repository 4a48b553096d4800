"""Events an agent publishes to the engine's events topic, as batched messages: JSON arrays of
events, each message under the engine's ``events.max_payload_bytes`` (``docs/events.md``,
"Batched messages"). ``quotastream proxy`` publishes its clients' usage this way, and
``quotastream brokers`` the counts it reads from the brokers' metrics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import msgspec


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
