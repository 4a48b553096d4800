"""The agents' one publisher to the events topic (quotastream/publisher.py): batched messages,
each bounded and holding every event once, in order. Its sends to a real Kafka are tested
through the proxy (tests/test_proxy_faults.py) and ``quotastream brokers``
(tests/test_remote_log_bridge.py, tests/test_broker_metrics_cluster.py)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from quotastream.publisher import batched_messages
from state.event_contract import Fetch, Produce

usage_fields = {
    "ts": st.integers(0, 2**53),
    "bytes": st.integers(0, 2**40),
    "count": st.integers(1, 10_000),
    "user": st.text(max_size=30),
    "client_id": st.text(max_size=30),
    "broker": st.integers(0, 5000),
}
usage_events = st.one_of(st.builds(Produce, **usage_fields), st.builds(Fetch, **usage_fields))


@settings(max_examples=150, deadline=None)
@given(events=st.lists(usage_events, max_size=40), max_bytes=st.integers(1, 700))
def test_batched_messages_are_bounded_json_arrays_holding_every_event_once(
    events: list[Produce], max_bytes: int
) -> None:
    messages = batched_messages(events, max_bytes)
    published: list[Any] = []
    for message in messages:
        content = json.loads(message.value)
        assert isinstance(content, list)
        assert content, "no empty message"
        assert len(message.value) <= max_bytes or len(content) == 1
        assert message.events == len(content)
        assert message.bytes == sum(event["bytes"] for event in content)
        published += content
    assert published == [msgspec.to_builtins(event) for event in events]


def test_batched_messages_fill_each_message_before_starting_the_next() -> None:
    event = Produce(ts=1, bytes=10, count=1, user="u", client_id="c", broker=1)
    size = len(msgspec.json.encode(event))
    messages = batched_messages([event] * 10, max_bytes=2 + 3 * size + 2 + 1)
    assert [m.events for m in messages] == [3, 3, 3, 1]
    assert [m.bytes for m in messages] == [30, 30, 30, 10]
    assert batched_messages([], max_bytes=100) == []
