"""The proxy's hold arithmetic without Redis (``quotastream/proxy/hold_window.py``): a client's
window measured from a decision, the quota's window and the bytes the proxy forwarded, with
the engine's throttle formula."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from quotastream.proxy.hold_window import ClientKey, Forwarded, hold_end, window_over_ms
from quotastream.redis_contract import Decision
from state.quota_types import WindowRule
from state.throttle import throttle_ms
from state.window import WindowSpec

QUOTA_BYTES_PER_S = 300_000
SAMPLE_MS = 1000
#: Kafka's client quota window: 11 samples of a second, measured as ``Rate`` measures.
SPEC = WindowSpec(samples=11, window_ms=SAMPLE_MS, rule=WindowRule.RATE)
NOW_MS = 2_000_000_000_000


def held_until(
    forwarded: Forwarded,
    decision: Decision,
    keys: Iterable[ClientKey],
    now_ms: int,
    extra_bytes: int = 0,
) -> int:
    over_ms = window_over_ms(decision, SPEC, forwarded, keys, now_ms, extra_bytes)
    return hold_end(decision, over_ms, now_ms)


def engine_decision(key: ClientKey, window_bytes: int, at_ms: int, **fields: object) -> Decision:
    """The decision the engine makes at ``at_ms`` of ``window_bytes`` in 10 samples and the
    elapsed part of the current one, with its own throttle formula (``state.throttle``)."""
    window_ms = 10 * SAMPLE_MS + at_ms % SAMPLE_MS
    rate = window_bytes * 1000 / window_ms
    delay = int(
        throttle_ms(np.array([rate]), np.array([float(QUOTA_BYTES_PER_S)]), np.array([window_ms]))[
            0
        ]
    )
    values: dict[str, Any] = {
        "quota": key[0],
        "entity": "client-id=c",
        "throttle_ms": delay,
        "until": at_ms + delay,
        "rate": rate,
        "limit": float(QUOTA_BYTES_PER_S),
        "exceeded": delay > 0,
        "window_ms": window_ms,
        "decided_at": at_ms,
    }
    return Decision(**(values | fields))


@settings(max_examples=200, deadline=None)
@given(
    decided_in_sample=st.integers(0, SAMPLE_MS - 1),
    sent=st.lists(st.tuples(st.integers(0, 9_999), st.integers(0, 2_000_000)), max_size=20),
    unseen=st.integers(0, 5_000_000),
)
# A window exactly half a millisecond past its bound in exact arithmetic: the engine's double
# was a hair under the half and rounded down, the proxy's (bytes over the limit, not the rate
# first) a hair over and rounded up, 1 ms longer.
@example(
    decided_in_sample=1,
    sent=[(0, n) for n in (0, 96, 249, 297, 685, 1309, 1487, 1699, 2111, 2426, 2548, 4362)]
    + [(0, n) for n in (5637, 5637, 5, 20160, 112620, 117495, 1505527, 2000000)],
    unseen=0,
)
def test_measured_when_decided_a_hold_ends_when_the_engines_decision_does(
    decided_in_sample: int,
    sent: list[tuple[int, int]],
    unseen: int,
) -> None:
    """``held_until`` at ``decided_at`` with every byte of the window forwarded by this proxy:
    the engine's ``until``, to the millisecond (one throttle formula); each limit's worth of bytes
    forwarded since adds a second to a throttled client's hold."""
    forwarded = Forwarded()
    key: ClientKey = ("produce", "ANONYMOUS", "c", 1)
    decided_at = NOW_MS + decided_in_sample
    oldest_whole = (decided_at // SAMPLE_MS - 10) * SAMPLE_MS
    for back_ms, nbytes in sorted(sent, reverse=True):
        forwarded.record(key, nbytes, max(decided_at - back_ms, oldest_whole), SAMPLE_MS)
    decision = engine_decision(key, sum(n for _, n in sent), decided_at)
    until = held_until(forwarded, decision, [key], decided_at)
    assert until == decision.until
    later = held_until(forwarded, decision, [key], decided_at, unseen + QUOTA_BYTES_PER_S * 3)
    if held_until(forwarded, decision, [key], decided_at, unseen) > decided_at:
        assert later - held_until(forwarded, decision, [key], decided_at, unseen) in range(
            2999, 3002
        )


def test_a_decision_that_does_not_bind_holds_nobody() -> None:
    forwarded = Forwarded()
    key: ClientKey = ("produce", "ANONYMOUS", "c", 1)
    decision = engine_decision(key, 10**9, NOW_MS, mode="shadow", enforced=False)
    assert held_until(forwarded, decision, [key], NOW_MS + 5, 10**9) == NOW_MS + 5


@pytest.mark.parametrize("limit", [None, 0.0], ids=["unlimited", "a-limit-of-zero"])
def test_without_a_limit_to_divide_by_a_hold_ends_at_the_decisions_until(
    limit: float | None,
) -> None:
    forwarded = Forwarded()
    """A limit of 0 throttles for as long as the engine says; forwarded bytes change nothing."""
    key: ClientKey = ("produce", "ANONYMOUS", "c", 1)
    decision = engine_decision(key, 150, NOW_MS, limit=limit, until=NOW_MS + 7_000)
    assert held_until(forwarded, decision, [key], NOW_MS + 5, 10**9) == NOW_MS + 7_000


@pytest.mark.parametrize("released_after_until_ms", [0, -5])  # its tick's rounding: before
def test_bytes_forwarded_since_extend_a_throttle_its_timer_already_released(
    released_after_until_ms: int,
) -> None:
    forwarded = Forwarded()
    """The engine releases a throttle whose ``until`` has passed (``released_at`` is its
    micro-batch's time): bytes forwarded after the decision still hold the client."""
    key: ClientKey = ("produce", "ANONYMOUS", "c", 1)
    decision = engine_decision(key, 3_150_000, NOW_MS)  # held 0.5 s
    released = msgspec.structs.replace(
        decision, released_at=decision.until + released_after_until_ms
    )
    forwarded.record(key, 3_150_000, NOW_MS, SAMPLE_MS)
    extended = held_until(forwarded, released, [key], NOW_MS + 600, 600_000)
    assert extended == held_until(forwarded, decision, [key], NOW_MS + 600, 600_000)
    assert extended == decision.until + 2_000
