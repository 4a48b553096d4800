"""The event contract (state/event_contract.py) holds for every publisher: whatever the proxy,
``quotastream brokers``' metrics and lineage sources and ``simulate`` can emit, the engine's
validator (``state.events.parse_events``) accepts, every event (the remote log bridge's
segments: tests/test_remote_segments.py). And the agents can use the contract: importing them
loads none of the engine's numpy, pandas, pyarrow or pyspark."""

from __future__ import annotations

import json
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.structs import TopicPartition

from quotastream.brokers.broker_metrics import (
    REASSIGNMENT_BYTES,
    REMOTE_FETCH_BYTES,
    REMOTE_FETCH_REQUESTS,
    counts_of,
)
from quotastream.brokers.lineage import Answer, report_of
from quotastream.proxy.usage import FETCH, PRODUCE, UsageSums
from state.config import TOPIC_NAME
from state.events import parse_events
from streaming.commands.traffic import Scenario, messages
from tests.support.published import assert_all_accepted

#: What the proxy publishes, as ``quotastream proxy`` bounds it (events.max_payload_bytes).
MAX_MESSAGE_BYTES = 65_536
#: Wall-clock milliseconds, within the validator's default bounds (2000 to 2100).
WALL_MS = st.integers(946_684_800_000, 4_102_444_800_000)
BROKER = st.integers(0, 2**31 - 1)
TOPIC = st.from_regex(TOPIC_NAME, fullmatch=True)

#: One request the proxy counts: ``UsageSums.record``'s arguments. A user is a SASL principal or
#: ``ANONYMOUS``, never empty; the contract bounds names to 1024 characters.
requests = st.fixed_dictionaries(
    {
        "kind": st.sampled_from([PRODUCE, FETCH]),
        "user": st.text(min_size=1, max_size=1024),
        "client_id": st.text(max_size=1024),
        "broker": BROKER,
        "nbytes": st.integers(0, 2**40),
        "now_ms": WALL_MS,
    }
)


@settings(max_examples=60, deadline=None)
@given(counted=st.lists(requests, max_size=30))
def test_the_proxys_usage_is_accepted(counted: list[dict[str, object]]) -> None:
    sums = UsageSums({PRODUCE: 1000, FETCH: 2000}, 10_000, lambda *dropped: None)
    for request in counted:
        sums.record(**request)  # type: ignore[arg-type]
    assert_all_accepted(sums.take(), MAX_MESSAGE_BYTES)


#: A broker's counter deltas, as ``CounterDeltas.update`` gives them: per topic, or broker-wide.
deltas = st.dictionaries(
    st.one_of(
        st.tuples(st.sampled_from([REMOTE_FETCH_BYTES, REMOTE_FETCH_REQUESTS]), TOPIC),
        st.tuples(st.sampled_from(sorted(REASSIGNMENT_BYTES)), st.just("")),
    ),
    st.floats(min_value=0.5, max_value=2.0**53),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(broker=BROKER, counted=deltas, ts=WALL_MS)
def test_the_brokers_metrics_counts_are_accepted(
    broker: int, counted: dict[tuple[str, str], float], ts: int
) -> None:
    assert_all_accepted(counts_of(broker, counted, ts), MAX_MESSAGE_BYTES)


@st.composite
def walks(draw: st.DrawFn) -> tuple[list[Answer], int]:
    """A leader's answers down its cache, latest epoch first, as :func:`walk` collects them, and
    the log start offset: each answer gives where the epoch above it starts."""
    epochs = sorted(draw(st.sets(st.integers(0, 2**31 - 1), min_size=1, max_size=20)))
    starts = sorted(
        draw(st.lists(st.integers(0, 2**62), min_size=len(epochs), max_size=len(epochs)))
    )
    log_end = draw(st.integers(starts[-1], 2**63 - 1))
    log_start = draw(st.integers(0, starts[0]))
    answers = [Answer(epochs[-1], log_end)]
    answers += [Answer(epochs[i], starts[i + 1]) for i in reversed(range(len(epochs) - 1))]
    return answers, log_start


@settings(max_examples=60, deadline=None)
@given(
    leader=BROKER,
    topic=TOPIC,
    partition=st.integers(0, 2**31 - 1),
    walked=st.lists(walks(), min_size=1, max_size=5),
    ts=WALL_MS,
)
def test_the_lineage_reports_are_accepted(
    leader: int, topic: str, partition: int, walked: list[tuple[list[Answer], int]], ts: int
) -> None:
    reports = [
        report_of(leader, TopicPartition(topic, partition), answers, log_start, ts)
        for answers, log_start in walked
    ]
    assert_all_accepted(reports, MAX_MESSAGE_BYTES)


@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    second=st.integers(0, 119),
    events_per_message=st.sampled_from([1, 7, 500]),
)
def test_simulated_traffic_is_accepted(seed: int, second: int, events_per_message: int) -> None:
    """``quotastream simulate``'s events, one per message or batched, as it sends them."""
    scenario = Scenario(seed)
    for earlier in range(second % 3):  # the scenario's generator moves on with each second
        scenario.second(earlier, 1_767_225_600_000)
    events = scenario.second(second, 1_767_225_600_000)
    parsed = parse_events(list(messages(events, events_per_message)))
    assert parsed.rejected.empty, parsed.rejected.to_dict("records")
    assert len(parsed.accepted) == len(events)


#: What the engine needs and an agent must not load.
HEAVY = ("numpy", "pandas", "pyarrow", "pyspark")


def test_the_agents_load_none_of_the_engines_libraries() -> None:
    """Every module of the proxy and of ``quotastream brokers``, the publisher and the contract,
    imported in a fresh interpreter."""
    code = f"""
import importlib, json, pkgutil, sys
import quotastream.proxy, quotastream.brokers
for package in (quotastream.proxy, quotastream.brokers):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(module.name)
import quotastream.publisher, state.event_contract
print(json.dumps(sorted(name for name in sys.modules if name.split(".")[0] in {HEAVY!r})))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(result.stdout) == []
