"""A short soak: the claims of ``bench/soak.py`` (state bounded by the active entities, memory
flat) as a test that fails on growth.

Both stages of the streaming job run without Spark, as Spark runs them per shard (the state of
each shard carried from one micro-batch to the next), over a simulated clock: 14 generations of
clients, each active for 2 one-second micro-batches and then gone for good. With
``events.max_past_ms`` the engine forgets an entity once its windows are empty at the eviction
horizon, so the state must follow the active generations, not every client ever seen; throttles
must all be released; and the process must not keep what the batches allocated. The 30-minute run
through Spark stays a benchmark (``bench/soak.py``).
"""

from __future__ import annotations

import _tracemalloc
import functools
import gc
import json
import random
import statistics
import sys
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

from state.config import parse_quota_config
from state.core import QuotaCore
from state.events import EventBounds
from state.shard import ShardState
from state.throttle_timers import ThrottleTimers
from state.written_decisions import WritePolicy
from streaming.engine.shard_layout import ShardLayout
from streaming.engine.source_records import KafkaRecords
from streaming.engine.stages import StageSettings, update_shard
from tests.support.factories import BASE, produce
from tests.support.stage_runs import shard_inputs

GENERATIONS = 14
BATCHES_PER_GENERATION = 2
CLIENTS_PER_GENERATION = 150
EVENTS_PER_BATCH = 400
MAX_PAST_MS = 3_000
WINDOW_MS = 3 * 1000

CONFIG = parse_quota_config(
    {
        # Short windows (3 samples of 1 s), so that a generation ages out within a few batches.
        "quota_types": {"produce": {"samples": 3, "window_ms": 1000}},
        # Many clients are throttled now and then: timers are set, and must all be released.
        "clients": [{"user": "<default>", "producer_byte_rate": 2_000}],
    },
    "soak config",
)
#: An entity stays until its last event is a window older than the horizon, so at most this many
#: generations are in the state at once.
GENERATIONS_KEPT = -(-(MAX_PAST_MS + WINDOW_MS) // (BATCHES_PER_GENERATION * 1000)) + 1
#: Python memory a micro-batch may leave behind once warm, as the slope of a least-squares line
#: through the samples. Counted as ``python_bytes_held`` counts it, the slope is about 8 B a
#: batch; a batch that kept 150 bytes more gives a slope of about 165.
LEAK_BOUND_BYTES_PER_BATCH = 128


@dataclass(frozen=True)
class Sample:
    entities: int
    state_bytes: int
    pending_timers: int
    python_bytes: int


class SimulatedClock:
    def __init__(self) -> None:
        self.now_ms = BASE

    def wall_ms(self) -> int:
        return self.now_ms

    def monotonic(self) -> float:
        return self.now_ms / 1000


def batch_values(rng: random.Random, generation: int, now_ms: int) -> list[bytes]:
    return [
        json.dumps(
            produce(
                f"g{generation}-u{event % CLIENTS_PER_GENERATION}",  # every client, every batch
                "app",
                rng.randrange(100, 2000),
                now_ms - rng.randrange(1000),
            )
        ).encode()
        for event in range(EVENTS_PER_BATCH)
    ]


#: Enough frames that an allocation deep in pandas still shows the engine's call that made it.
TRACED_FRAMES = 12
#: The engine's code, by directory: what the batches allocate is allocated under it.
ENGINE_DIRECTORIES = tuple(
    f"{Path(__file__).parents[1] / package}/" for package in ("state", "streaming")
)


@functools.cache
def _is_engine_file(filename: str) -> bool:
    return filename.startswith(ENGINE_DIRECTORIES)


def python_bytes_held() -> int:
    """The Python memory the batches left allocated: what was allocated under the engine's code
    and is still held.

    Three holders are not the engine's and are left out. This test's own allocations (its list of
    samples grows by one a generation). Other threads of the process: in a full test run, the
    threads of earlier tests' clients and Spark's gateway allocate while the soak runs, which read
    as a spike or a slope. And CPython's type attribute cache: each entry keeps a reference to the
    name it was looked up by, including names made afresh by C code (numpy's
    ``PyObject_GetAttrString(ufunc, "accumulate")`` in every ``cumsum``), and an entry moves
    whenever a type's version changes. It holds at most 4,096 names, so it fills slowly over a
    run (about 1 kB a generation here) and then stops: bounded, but it would read as growth.
    """
    sys._clear_type_cache()
    # A trace is counted if any of its frames is the engine's (as ``tracemalloc.Filter(...,
    # all_frames=True)`` selects it), read from the raw traces: ``Snapshot.filter_traces`` matches
    # each frame with ``fnmatch`` in Python, traced as well, and took 1.5 s a sample here.
    return sum(
        trace[1]
        for trace in _tracemalloc._get_traces()
        if any(_is_engine_file(filename) for filename, _line in trace[2])
    )


def measure(states: dict[int, ShardState]) -> tuple[int, int, int]:
    entities = state_bytes = pending = 0
    for state in states.values():
        core = QuotaCore.restore(CONFIG, state.tables)
        entities += sum(len(table) for table in core.tables.values())
        state_bytes += sum(map(len, (state.tables, state.timers, state.remote_log, state.written)))
        pending += ThrottleTimers.decode(state.timers).stats().pending
    return entities, state_bytes, pending


def run_soak(
    max_past_ms: int | None, generations: int = GENERATIONS, *, trace_memory: bool = True
) -> list[Sample]:
    """One sample per generation, taken at its last micro-batch; its Python memory is 0 unless
    ``trace_memory``, and before the first warm generation (``GENERATIONS_KEPT``): tracing every
    allocation, ``TRACED_FRAMES`` deep, makes a batch about ten times as slow, and only the warm
    samples are compared. What the warm batches allocate and keep is traced all the same."""
    clock = SimulatedClock()
    stage = StageSettings(
        # One shard: the state of every entity in one group, as a shard holds it.
        CONFIG,
        EventBounds(),
        65_536,
        max_past_ms=max_past_ms,
        clock=clock,
        # A written decision is remembered until its key expires: within the run, as an idle
        # entity's windows are (the default, 30 s, is longer than the whole run).
        write_policy=WritePolicy(keep_ms=WINDOW_MS),
    )
    rng = random.Random(2026)
    states: dict[int, ShardState] = {}
    offset = 0
    samples = []
    try:
        for generation in range(generations):
            if trace_memory and generation == GENERATIONS_KEPT:
                tracemalloc.start(TRACED_FRAMES)
            for _ in range(BATCHES_PER_GENERATION):
                clock.now_ms += 1000
                values = batch_values(rng, generation, clock.now_ms)
                records = KafkaRecords(
                    "events", 0, list(range(offset, offset + len(values))), list(values), 0
                )
                offset += len(values)
                for shard, rows in shard_inputs([records], stage, ShardLayout(1, 1)).items():
                    update = update_shard(states.get(shard), rows, stage, shard, clock.now_ms)
                    if update.state is not None:
                        states[shard] = update.state
            gc.collect()
            entities, state_bytes, pending = measure(states)
            held = python_bytes_held() if tracemalloc.is_tracing() else 0
            samples.append(Sample(entities, state_bytes, pending, held))
    finally:
        tracemalloc.stop()
    return samples


def test_state_follows_the_active_clients_and_memory_stays_flat() -> None:
    samples = run_soak(MAX_PAST_MS)
    warm = samples[GENERATIONS_KEPT:]
    # Bounded by the generations still within the horizon, not by all clients ever seen.
    assert max(s.entities for s in samples) <= GENERATIONS_KEPT * CLIENTS_PER_GENERATION
    assert samples[-1].entities <= GENERATIONS_KEPT * CLIENTS_PER_GENERATION
    seen = GENERATIONS * CLIENTS_PER_GENERATION
    assert samples[-1].entities < seen / 4
    # Once the first generations have aged out, nothing grows: the last third of the run keeps
    # no more state than the first third after warm-up, and no batch leaves Python memory behind.
    third = len(warm) // 3
    first, last = warm[:third], warm[-third:]
    assert max(s.state_bytes for s in last) <= 1.1 * max(s.state_bytes for s in first)
    held = [s.python_bytes for s in warm]
    per_generation = statistics.linear_regression(range(len(held)), held).slope
    assert per_generation / BATCHES_PER_GENERATION <= LEAK_BOUND_BYTES_PER_BATCH, held
    # Throttles were set all along, and none is left pending beyond its generation's.
    assert max(s.pending_timers for s in samples) > 0
    assert max(s.pending_timers for s in last) <= CLIENTS_PER_GENERATION
    print(
        "entities per generation:",
        [s.entities for s in samples],
        f"state {first[0].state_bytes} -> {last[-1].state_bytes} B,"
        f" python {held[0]} -> {held[-1]} B ({per_generation:+.0f} B a generation)",
    )


def test_without_a_horizon_every_client_ever_seen_is_kept() -> None:
    """The control: the same soak without ``max_past_ms`` keeps every entity, so the bound above
    is the eviction's doing, not the workload's."""
    generations = GENERATIONS_KEPT + 2
    samples = run_soak(None, generations, trace_memory=False)
    assert samples[-1].entities == generations * CLIENTS_PER_GENERATION
