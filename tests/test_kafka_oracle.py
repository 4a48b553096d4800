"""Apache Kafka itself as the oracle of client quotas: real traffic through a real broker, and the
engine's decisions for the same traffic compared with the broker's, response by response.

**Setup.** One Apache Kafka node (``streaming/kafka_broker.py``) with Kafka's default quota
windows (``quota.window.num`` 11, ``quota.window.size.seconds`` 1; the engine's configuration says
the same). Its client listener is SASL_PLAINTEXT with SCRAM users: on plaintext every client is
``User:ANONYMOUS``, so a user quota and the default user's quota would be one usage counter and one
would shadow the other; with a user per shape, each shape has counters of its own, all quotas
are set once before any traffic and none is removed (Kafka's ``quotaTypesEnabled`` only grows,
the engine's kinds follow its configuration: they agree only while the broker has exactly the
engine's quotas). The quotas are set with AlterClientQuotas and checked with
DescribeClientQuotas (``tests/kafka_quotas.py``); the engine's configuration is built from the
same mapping. The shapes run at the same time, one thread each (their counters are independent),
each client sending one request at a time and holding back while throttled, as Kafka's clients do.

**What is compared.** For every Produce and Fetch response: the broker's ``throttle_time_ms``,
and the engine's ``throttle_ms`` for an event with the bytes the broker counted (Produce: the
request's frame; Fetch: 4 + the response body, for a throttled fetch the response it would have
sent) at the time the broker recorded it (Produce: the batch's LogAppendTime; Fetch: the middle of
the exchange). A throttled fetch is checked by the engine with its bytes, then recorded with 0
bytes, as the broker records and then un-records it (``KafkaApis.handleFetchRequest``).

**Windows.** Kafka opens a sample at the time of the record that finds the current one complete
(``SampledStat.record``/``advance``: ``now - start >= window``), so its first sample starts at the
counter's first record ``t0`` and each later one at the first record at least a window after the
previous start: with gaps (a throttled client waits) the starts drift off ``t0 + k * window``.
The engine's samples are aligned to multiples of the window. The harness shifts each shape's
event times by one constant so that its first record lands on a multiple of the window. Then,
for as long as the broker can have recorded a response less than ``samples * window`` after
``t0`` (*fresh* windows), the two are the same function of the times: Kafka has opened at most
``samples`` samples (no ring slot reused, nothing purged), so both count every byte so far over
``(samples - 1) * window + (elapsed mod window)``; only the recording times differ.

**Tolerance, fresh windows.** The broker recorded request ``i`` at some ``b_i`` in
``[earliest_i, received_i]``; the engine uses one point of that interval, so its elapsed time
since ``t0`` is off by at most ``w_i + w_0`` (the two intervals' widths), and throttle time,
``bytes / limit - window size``, moves 1:1 with the window: ``|engine - broker| <= w_i + w_0 + 1``
(1 for rounding and the engine's 1 ms minimum). Except where the elapsed interval contains a
multiple of the window: there Kafka's padded window drops by a whole window, and the two may
differ by up to a window. So the number of disagreeing responses is at most the number of such
*straddling* responses, and every other response agrees within its bound. Asserted.

**Tolerance, steady state.** After ``samples * window`` the alignment matters. At broker time
``b`` both count every record after the horizon ``b - samples * window`` (Kafka purges a sample
by its last event, and never reuses a sample holding such a record: reuse needs ``samples + 1``
later starts, at least a window apart), and both count the sample of the oldest of those whole:
Kafka from that record's sample start (samples hold records less than a window from their start),
the engine from the aligned start below it, less than a window apart. So the windows differ by
less than a window, and the byte sums by the bytes recorded in the window before the horizon:
``|engine - broker| <= window + those bytes / limit``, plus the timing bound and, where a record
lies within the timing uncertainty of the horizon (counted by one and not the other: a purge
decided by a millisecond), the time from it to the next record. Asserted for every response;
how large the differences are is the table's.

**Without the shift** (event times as stamped) the engine's first sample starts up to a window
before ``t0``: in the fresh windows its window, padded like Kafka's, differs from Kafka's by less
than a window (plus the timing bound), and so do the throttles. Checked too.

``pytest -s tests/test_kafka_oracle.py`` prints the agreement table (docs/semantics.md §8).
"""

from __future__ import annotations

import bisect
import json
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pytest

from state.config import QuotaConfig, parse_quota_config
from state.core import QuotaCore
from state.events import parse_events
from streaming.kafka_broker import KafkaNode, ScramUser, Security, start_kafka
from tests.kafka_quotas import (
    DEFAULT,
    Exchange,
    QuotaClient,
    QuotaEntity,
    alter_client_quotas,
    await_client_quotas,
    connect,
    create_topic,
)

SAMPLES: Final = 11
WINDOW_MS: Final = 1000
FRESH_MS: Final = SAMPLES * WINDOW_MS
#: How long each shape sends: its fresh windows, then as long again in the steady state.
DURATION_MS: Final = 2 * FRESH_MS
#: Shapes start this far apart, so that their first requests (each one's t0) do not compete.
STAGGER_MS: Final = 150
BROKER: Final = 1
ADMIN: Final = "admin"
PRODUCE, FETCH = "producer_byte_rate", "consumer_byte_rate"


@dataclass(frozen=True)
class Phase:
    """Until ``until_ms`` after the shape's start: a request of ``value_bytes`` (Produce; Fetch
    reads one prefilled batch) ``gap_ms`` after the previous response or the throttle's end."""

    until_ms: int
    gap_ms: int
    value_bytes: int = 0


@dataclass(frozen=True)
class Shape:
    name: str
    user: str
    client_ids: tuple[str, ...]  # several: the requests go round them, one at a time
    entity: QuotaEntity
    quota: str
    limit: int  # bytes/s
    phases: tuple[Phase, ...]

    @property
    def topic(self) -> str:
        return f"oracle-{self.user}"


SHAPES: Final = (
    # Two clients of one user: one counter, user=alice (level 3).
    Shape(
        "user quota (2 clients)",
        "alice",
        ("alice-1", "alice-2"),
        QuotaEntity("alice"),
        PRODUCE,
        4000,
        (Phase(DURATION_MS, 40, 300),),
    ),
    # (user, client-id), level 1: counter user=bob,client-id=bob-app.
    Shape(
        "(user, client-id) quota",
        "bob",
        ("bob-app",),
        QuotaEntity("bob", "bob-app"),
        PRODUCE,
        3000,
        (Phase(DURATION_MS, 50, 250),),
    ),
    # carol has no quota of her own: the default user's (level 6), her own counter user=carol.
    Shape(
        "default user quota",
        "carol",
        ("carol-app",),
        QuotaEntity(DEFAULT),
        PRODUCE,
        2500,
        (Phase(DURATION_MS, 60, 250),),
    ),
    # Under its quota, then back-to-back 2 KB batches, twice, each from the middle of a window
    # (a burst that starts on a sample boundary is one sample for both): (dave, <default>), level 2.
    Shape(
        "producer bursting",
        "dave",
        ("dave-app",),
        QuotaEntity("dave", DEFAULT),
        PRODUCE,
        5000,
        (
            Phase(3500, 100, 200),
            Phase(5500, 0, 2000),
            Phase(14_500, 100, 200),
            Phase(16_500, 0, 2000),
            Phase(DURATION_MS, 100, 200),
        ),
    ),
    # A consumer reading one batch a fetch: the fetch quota (its only kind: user).
    Shape(
        "consumer (fetch quota)",
        "erin",
        ("erin-app",),
        QuotaEntity("erin"),
        FETCH,
        4000,
        (Phase(DURATION_MS, 40),),
    ),
)
#: The consumer's topic holds more batches than its quota lets it read in the run.
PREFILLED_BATCHES: Final = 400
PREFILLED_VALUE_BYTES: Final = 300
QUOTAS: Final = {shape.entity: {shape.quota: float(shape.limit)} for shape in SHAPES}


def password(user: str) -> str:
    return f"oracle-{user}-secret"


@pytest.fixture(scope="module")
def broker() -> Iterator[KafkaNode]:
    """A broker of this module's own: its quotas would throttle other tests' clients."""
    users = (ADMIN, *(shape.user for shape in SHAPES))
    security = Security(scram_users=tuple(ScramUser(user, password(user)) for user in users))
    properties = {
        "quota.window.num": str(SAMPLES),
        "quota.window.size.seconds": str(WINDOW_MS // 1000),
    }
    with start_kafka(security=security, properties=properties) as node:
        yield node


@dataclass(frozen=True)
class Compared:
    """One response: the broker's decision, the engine's, and how far apart they may be."""

    exchange: Exchange
    counted_bytes: int
    broker_ms: int
    engine_ms: int
    stamped_ms: int  # the engine's, on the times as stamped (no shift)
    fresh: bool  # recorded less than samples * window after the counter's first record
    straddles: bool  # its elapsed interval holds a multiple of the window
    timing_ms: int  # |difference| due to the recording times alone (fresh windows)
    steady_ms: float  # |difference| the aligned samples allow at any time

    @property
    def difference(self) -> int:
        return abs(self.engine_ms - self.broker_ms)


@pytest.fixture(scope="module")
def oracle(broker: KafkaNode) -> dict[str, list[Compared]]:
    """Every shape's traffic through the broker, and each response compared with the engine."""
    admin = connect(broker.address, ADMIN, password(ADMIN), "oracle-admin")
    try:
        # LogAppendTime: each Produce response says when the broker appended it.
        for shape in SHAPES:
            create_topic(admin, shape.topic, {"message.timestamp.type": "LogAppendTime"})
        create_topic(admin, "oracle-warmup", {})
        for shape in SHAPES:
            if shape.quota == FETCH:
                prefill(broker, shape.topic)
        alter_client_quotas(admin, QUOTAS)
        # Until DescribeClientQuotas answers exactly these: the broker applies them.
        await_client_quotas(admin, QUOTAS)
        warm_up(broker)
        traffic = run_shapes(broker, SHAPES)
    finally:
        admin.close()
    config = engine_config()
    return {shape.name: compare(shape, traffic[shape.name], config) for shape in SHAPES}


def prefill(broker: KafkaNode, topic: str) -> None:
    """The consumer's batches, written before any quota is set (no quota records them)."""
    client = QuotaClient(broker.address, ADMIN, password(ADMIN), "oracle-prefill")
    try:
        for _ in range(PREFILLED_BATCHES):
            client.produce(topic, PREFILLED_VALUE_BYTES)
    finally:
        client.close()


def warm_up(broker: KafkaNode) -> None:
    """Runs the broker's quota code paths once (admin's counters, not the shapes'), so that no
    shape's first request, whose recording time every later comparison depends on, pays for it."""
    client = QuotaClient(broker.address, ADMIN, password(ADMIN), "oracle-warmup")
    try:
        for offset in range(20):
            client.produce("oracle-warmup", 100)
            client.fetch("oracle-warmup", offset)
    finally:
        client.close()


def run_shapes(broker: KafkaNode, shapes: Sequence[Shape]) -> dict[str, list[Exchange]]:
    """Each shape in a thread of its own, its clients connected (SCRAM done) before any starts."""
    clients: dict[str, list[QuotaClient]] = {}
    results: dict[str, list[Exchange]] = {}
    failures: list[BaseException] = []

    def run(shape: Shape, start_ms: float) -> None:
        try:
            results[shape.name] = drive(shape, clients[shape.name], start_ms)
        except BaseException as failure:  # re-raised below, in the test's thread
            failures.append(failure)

    try:
        for shape in shapes:
            clients[shape.name] = []
            for client_id in shape.client_ids:
                clients[shape.name].append(
                    QuotaClient(broker.address, shape.user, password(shape.user), client_id)
                )
        start = time.time_ns() / 1e6 + 200
        threads = [
            threading.Thread(target=run, args=(shape, start + index * STAGGER_MS), name=shape.user)
            for index, shape in enumerate(shapes)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for client in (client for group in clients.values() for client in group):
            client.close()
    if failures:
        raise failures[0]
    return results


def drive(shape: Shape, clients: list[QuotaClient], start_ms: float) -> list[Exchange]:
    """The shape's requests, one at a time, paced by its phases."""
    exchanges: list[Exchange] = []
    offset, turn = 0, 0
    clients[0].wait_until(start_ms)

    def send(client: QuotaClient, value_bytes: int) -> Exchange:
        nonlocal offset
        if shape.quota == PRODUCE:
            exchange = client.produce(shape.topic, value_bytes)
        else:
            exchange = client.fetch(shape.topic, offset)
            assert exchange.served or exchange.throttle_ms, "the consumer read every batch"
            offset += exchange.served
        exchanges.append(exchange)
        return exchange

    for phase in shape.phases:
        while time.time_ns() / 1e6 < start_ms + phase.until_ms:
            client = clients[turn % len(clients)]
            turn += 1
            exchange = send(client, phase.value_bytes)
            client.wait_until(exchange.received_ms + phase.gap_ms)
    # A consumer ends on a served fetch: the one that says what a throttled fetch of the same
    # offset would have returned (the client waits out the throttle first).
    while not exchanges[-1].served:
        send(clients[(turn - 1) % len(clients)], 0)
    return exchanges


def engine_config() -> QuotaConfig:
    """The broker's quotas and window settings in conf/quotas.yaml's format."""
    entries: list[dict[str, Any]] = []
    for entity, values in QUOTAS.items():
        entry: dict[str, Any] = {}
        if entity.user is not None:
            entry["user"] = entity.user
        if entity.client_id is not None:
            entry["client_id"] = entity.client_id
        entries.append(entry | {key: int(value) for key, value in values.items()})
    windows = {"samples": SAMPLES, "window_ms": WINDOW_MS}
    return parse_quota_config(
        {"quota_types": {"produce": windows, "fetch": windows}, "clients": entries},
        "the oracle's quotas",
    )


def compare(shape: Shape, exchanges: list[Exchange], config: QuotaConfig) -> list[Compared]:
    counted = counted_bytes(exchanges)
    # The broker's recording time: between these two (ms), and the engine's estimate of it.
    low = [exchange.earliest_ms for exchange in exchanges]
    high = [exchange.received_ms for exchange in exchanges]
    estimate = [
        exchange.earliest_ms
        if exchange.kind == "produce"
        else (exchange.sent_ms + exchange.received_ms) // 2
        for exchange in exchanges
    ]
    shift = -estimate[0] % WINDOW_MS
    # Any record's estimate is off by at most the widest interval.
    widest = max(h - lo for lo, h in zip(low, high, strict=True))
    aligned = engine_decisions(exchanges, [ts + shift for ts in estimate], counted, config)
    stamped = engine_decisions(exchanges, estimate, counted, config)
    compared = []
    for i, exchange in enumerate(exchanges):
        # The broker's time since the counter's first record lies in [elapsed_low, elapsed_high].
        elapsed_low, elapsed_high = low[i] - high[0], high[i] - low[0]
        timing = (high[i] - low[i]) + (high[0] - low[0]) + 1
        # In the steady state the two windows reach back to the sample of the first record
        # after the horizon; a record within ``slack`` of it may be that first record for one
        # and not for the other: their window starts differ by less than a window plus the
        # time from the first record either may count to the first both count.
        slack = timing + widest
        horizon = estimate[i] - FRESH_MS
        first_either = bisect.bisect_right(estimate, horizon - slack)
        first_both = bisect.bisect_right(estimate, horizon + slack)
        ambiguous = estimate[first_both] - estimate[first_either] if first_both <= i else 0
        # The bytes either may count besides those both count: recorded in the window before
        # the horizon.
        edge = sum(
            counted[j] if exchanges[j].served else 0
            for j in range(i)
            if horizon - WINDOW_MS - slack < estimate[j] <= horizon + slack
        )
        compared.append(
            Compared(
                exchange=exchange,
                counted_bytes=counted[i],
                broker_ms=exchange.throttle_ms,
                engine_ms=aligned[i],
                stamped_ms=stamped[i],
                fresh=elapsed_high < FRESH_MS,
                straddles=elapsed_low // WINDOW_MS != elapsed_high // WINDOW_MS,
                timing_ms=timing,
                steady_ms=WINDOW_MS + ambiguous + edge * 1000 / shape.limit + slack,
            )
        )
    return compared


def counted_bytes(exchanges: list[Exchange]) -> list[int]:
    """What the broker recorded for each request: a throttled fetch is answered empty, but the
    broker recorded (then un-recorded) the response it would have sent, the one that serves the
    same offset later."""
    if exchanges[0].kind == "produce":
        return [exchange.counted_bytes for exchange in exchanges]
    served = {exchange.offset: exchange.counted_bytes for exchange in exchanges if exchange.served}
    assert all(exchange.offset in served for exchange in exchanges), "a fetch never served"
    return [served[exchange.offset] for exchange in exchanges]


def engine_decisions(
    exchanges: list[Exchange], times: list[int], counted: list[int], config: QuotaConfig
) -> list[int]:
    """The engine's throttle_ms per request: produce events as recorded; a fetch is checked with
    its bytes, and when the broker answered it empty, recorded with 0 bytes instead."""
    events = parse_events(
        [
            json.dumps(
                {
                    "kind": exchange.kind,
                    "user": exchange.user,
                    "client_id": exchange.client_id,
                    "broker": BROKER,
                    "bytes": nbytes,
                    "ts": ts,
                }
            ).encode()
            for exchange, ts, nbytes in zip(exchanges, times, counted, strict=True)
        ]
    ).accepted
    assert len(events) == len(exchanges)
    core = QuotaCore(config)
    throttles: list[int] = []
    start = 0
    # Runs of served requests (every Produce is) are decided in one batch each; a throttled
    # fetch is decided on a copy of the windows, then recorded empty.
    for i, exchange in enumerate([*exchanges, None]):
        if exchange is not None and exchange.served:
            continue
        if start < i:
            throttles += core.decide(events.iloc[start:i])["throttle_ms"].tolist()
        if exchange is None:
            break
        before = core.encode_state()
        throttles += core.decide(events.iloc[i : i + 1])["throttle_ms"].tolist()
        core = QuotaCore.restore(config, before)
        core.decide(events.iloc[i : i + 1].assign(bytes=0))
        start = i + 1
    return [int(ms) for ms in throttles]


@dataclass(frozen=True)
class Agreement:
    responses: int
    both: int
    broker_only: int
    engine_only: int
    p50_ms: float  # |engine - broker| over the responses either throttled
    max_ms: int

    @staticmethod
    def of(compared: Sequence[Compared], engine: str = "engine_ms") -> Agreement:
        pairs = [(c.broker_ms, int(getattr(c, engine))) for c in compared]
        differences = [abs(e - b) for b, e in pairs if b or e]
        return Agreement(
            responses=len(pairs),
            both=sum(1 for b, e in pairs if b and e),
            broker_only=sum(1 for b, e in pairs if b and not e),
            engine_only=sum(1 for b, e in pairs if e and not b),
            p50_ms=statistics.median(differences) if differences else 0.0,
            max_ms=max(differences, default=0),
        )

    def cells(self) -> list[str]:
        return [
            str(self.responses),
            str(self.both),
            str(self.broker_only),
            str(self.engine_only),
            f"{self.p50_ms:g} / {self.max_ms}",
        ]


@pytest.mark.parametrize("shape", SHAPES, ids=[shape.user for shape in SHAPES])
def test_the_engine_decides_as_the_broker(oracle: dict[str, list[Compared]], shape: Shape) -> None:
    """Every response within the tolerance the module's docstring derives."""
    compared = oracle[shape.name]
    fresh = [c for c in compared if c.fresh]
    steady = [c for c in compared if not c.fresh]
    # The shape means something: the broker throttled in both parts of the run.
    assert sum(c.broker_ms > 0 for c in fresh) >= 3, "no throttling in the fresh windows"
    assert sum(c.broker_ms > 0 for c in steady) >= 3, "no throttling in the steady state"
    # Fresh windows, first record aligned: equal but for the recording times.
    outside = [c for c in fresh if c.difference > c.timing_ms]
    assert all(c.straddles for c in outside), [
        (c.exchange, c.broker_ms, c.engine_ms, c.timing_ms) for c in outside if not c.straddles
    ]
    assert len(outside) <= sum(c.straddles for c in fresh)
    # At any time: the aligned samples' bound.
    beyond = [c for c in compared if c.difference > c.steady_ms]
    assert not beyond, [(c.exchange, c.broker_ms, c.engine_ms, c.steady_ms) for c in beyond]
    # As stamped, fresh windows: the engine's first sample starts up to a window early.
    stamped = [c for c in fresh if abs(c.stamped_ms - c.broker_ms) >= WINDOW_MS + c.timing_ms]
    assert not stamped, [(c.exchange, c.broker_ms, c.stamped_ms) for c in stamped]


def test_the_agreement_table(oracle: dict[str, list[Compared]]) -> None:
    """Prints docs/semantics.md's table (``pytest -s``)."""
    header = [
        "shape",
        "part",
        "responses",
        "throttled by both",
        "broker only",
        "engine only",
        "difference p50 / max (ms)",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for shape in SHAPES:
        compared = oracle[shape.name]
        parts = {
            f"first {FRESH_MS // 1000} s": [c for c in compared if c.fresh],
            "after": [c for c in compared if not c.fresh],
        }
        for part, rows in parts.items():
            cells = [shape.name, part, *Agreement.of(rows).cells()]
            lines.append("| " + " | ".join(cells) + " |")
    stamped = ["| shape | responses | both | broker only | engine only | p50 / max (ms) |"]
    stamped.append("|---|---|---|---|---|---|")
    for shape in SHAPES:
        rows = [c for c in oracle[shape.name] if c.fresh]
        cells = [shape.name, *Agreement.of(rows, "stamped_ms").cells()]
        stamped.append("| " + " | ".join(cells) + " |")
    timing = [c.timing_ms for shape in SHAPES for c in oracle[shape.name]]
    straddling = sum(c.straddles for shape in SHAPES for c in oracle[shape.name] if c.fresh)
    print()
    print("\n".join(lines))
    print()
    print(f"first {FRESH_MS // 1000} s, event times as stamped (no shift):")
    print("\n".join(stamped))
    print()
    print(
        f"timing bound p50 {statistics.median(timing):g} ms, max {max(timing)} ms; "
        f"straddling responses in the first {FRESH_MS // 1000} s: {straddling}"
    )
    assert all(len(oracle[shape.name]) > 50 for shape in SHAPES)
