"""What a publisher sends, as the engine's validator judges it."""

from __future__ import annotations

from collections.abc import Sequence

from quotastream.publisher import batched_messages
from state.event_contract import Event
from state.events import EventBounds, parse_events

#: Any time: the publishers' clocks are wall clocks, the property is the rest of the contract.
ANY_TIME = EventBounds(min_ts_ms=0, max_ts_ms=2**63 - 1)


def assert_all_accepted(
    events: Sequence[Event], max_message_bytes: int, bounds: EventBounds = ANY_TIME
) -> None:
    """``events``, in the batched messages the agents' publisher makes of them, are every one
    accepted by the engine's validator, in order."""
    messages = [message.value for message in batched_messages(events, max_message_bytes)]
    parsed = parse_events(messages, bounds)
    assert parsed.rejected.empty, parsed.rejected.to_dict("records")
    assert parsed.accepted["ts"].tolist() == [event.ts for event in events]
    assert parsed.accepted["bytes"].tolist() == [event.bytes for event in events]
    assert parsed.accepted["kind"].astype(str).tolist() == [event.kind for event in events]
