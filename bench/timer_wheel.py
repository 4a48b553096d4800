"""Requests per second of the timing wheel against a ``heapq`` timer: Kafka's purgatory benchmark.

Reproduces the benchmark of Kafka's purgatory redesign in simulated time (nothing sleeps).
Requests arrive with exponential inter-arrival times at ``--rate`` requests per simulated
second; each is enqueued with a timer expiring 200 ms after its arrival, and its completion time
is log-normal: one that completes within 200 ms cancels its timer at arrival + completion time,
the others time out and their timer fires. Two cases, as in the design doc: low timeout
(completion p50 20 ms, p75 60 ms) and high timeout (p50 200 ms, p75 400 ms).

Simulated time is walked in steps of ``step_ms`` (a micro-batch). Each step adds the timers of the
requests arriving in it, cancels those of the requests completing in it, then advances the clock
to the step's end and collects what fired. The same workload and steps drive
:class:`state.timing_wheel.TimingWheel` (tick 1 ms, 20 buckets; one batch call of each kind per
step) and :class:`HeapTimer` (the classic lazily-deleting ``heapq`` recipe; one call per timer).
Only the timer operations are timed. A second pass under tracemalloc measures the peak memory
growth during the loop, so its overhead does not distort the timing; the wheel driver's array of
handles by request id (8 bytes a request) is allocated before the loop and reported apart.
Every run checks that both fire exactly the timed-out requests, each once and in the step its
expiration falls in, and samples the entries each holds against the timers truly pending at
every step.

    python bench/timer_wheel.py [--requests 1000000] [--rate 100000] [--steps 1,10,100] [--seed 1]

Results are appended as one JSON line to bench/results/timer_wheel.jsonl.
"""

from __future__ import annotations

import argparse
import heapq
import math
import os
import platform
import statistics
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from statistics import NormalDist
from typing import Any

import numpy as np
import numpy.typing as npt
from results import record  # bench/ is on sys.path when a script in it runs

from state.timing_wheel import Int64Array, TimingWheel

Float64Array = npt.NDArray[np.float64]

TIMEOUT_MS = 200
TICK_MS = 1
WHEEL_SIZE = 20
#: The issue's target: the wheel does at least this many requests/s, and this many times the heap.
TARGET_REQUESTS_PER_S = 1_000_000
TARGET_SPEEDUP = 2.0


# ---------------------------------------------------------------------- the heap timer
_LIVE = 1
_CANCELLED = 0


class HeapTimer:
    """Timers in a binary heap, cancelled lazily: the ``heapq`` documentation's recipe.

    An entry is ``[expiration_ms, request_id, state]``. Cancelling only marks it: removing it from
    the middle of a heap would cost O(n), so it stays until it reaches the top and is skipped.
    The heap therefore holds more entries than there are timers pending. ``request_id`` is unique,
    so two entries never compare their (mutable) state, which keeps the heap ordered.
    """

    def __init__(self) -> None:
        self._heap: list[list[int]] = []
        self._live: dict[int, list[int]] = {}  # request id -> its entry, while pending

    def __len__(self) -> int:
        """Entries held, cancelled ones not yet popped included."""
        return len(self._heap)

    @property
    def pending(self) -> int:
        return len(self._live)

    def add(self, request_id: int, expiration_ms: int) -> None:
        entry = [expiration_ms, request_id, _LIVE]
        self._live[request_id] = entry
        heapq.heappush(self._heap, entry)

    def cancel(self, request_id: int) -> bool:
        """Stop a pending timer; False if it already fired or was cancelled."""
        entry = self._live.pop(request_id, None)
        if entry is None:
            return False
        entry[2] = _CANCELLED
        return True

    def advance(self, now_ms: int) -> list[int]:
        """The request ids whose timers expire by ``now_ms``, in expiration order."""
        fired = []
        heap = self._heap
        while heap and heap[0][0] <= now_ms:
            _, request_id, state = heapq.heappop(heap)
            if state == _LIVE:
                del self._live[request_id]
                fired.append(request_id)
        return fired


# ---------------------------------------------------------------------- the workload
@dataclass(frozen=True)
class Case:
    name: str
    completion_p50_ms: float
    completion_p75_ms: float


CASES = (Case("low_timeout", 20.0, 60.0), Case("high_timeout", 200.0, 400.0))


@dataclass(frozen=True)
class Workload:
    """Requests in arrival order: request id = index. Times are simulated milliseconds from 0."""

    arrival_ms: Int64Array  # non-decreasing
    expiration_ms: Int64Array  # arrival + timeout
    completion_at_ms: Float64Array  # arrival + completion time (a timeout too, where it is later)
    completes: npt.NDArray[np.bool_]  # completion time < timeout: the timer is cancelled
    #: Ids of the completing requests, by completion instant, and those instants.
    completion_order: Int64Array
    completion_order_at_ms: Float64Array
    #: The same as Python lists, the heap's natural input; converting is preparation, untimed.
    arrival_list: list[int]
    completion_order_list: list[int]

    @property
    def requests(self) -> int:
        return len(self.arrival_ms)


def make_workload(case: Case, requests: int, rate_per_s: float, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    gaps_ms = rng.exponential(1000.0 / rate_per_s, size=requests)
    # Arrivals land on the millisecond clock a broker reads (Kafka's time.milliseconds()).
    arrival_ms = np.floor(np.cumsum(gaps_ms)).astype(np.int64)
    # Log-normal with the given median and 75th percentile: mu = ln(p50), and the p75 is
    # z(0.75) standard deviations above it on the log scale.
    mu = math.log(case.completion_p50_ms)
    sigma = math.log(case.completion_p75_ms / case.completion_p50_ms) / NormalDist().inv_cdf(0.75)
    completion_ms = rng.lognormal(mu, sigma, size=requests)
    completion_at_ms = arrival_ms + completion_ms
    completes = completion_ms < TIMEOUT_MS
    completing = np.flatnonzero(completes)
    order = completing[np.argsort(completion_at_ms[completing], kind="stable")]
    return Workload(
        arrival_ms=arrival_ms,
        expiration_ms=arrival_ms + TIMEOUT_MS,
        completion_at_ms=completion_at_ms,
        completes=completes,
        completion_order=order.astype(np.int64),
        completion_order_at_ms=completion_at_ms[order],
        arrival_list=arrival_ms.tolist(),
        completion_order_list=order.tolist(),
    )


@dataclass(frozen=True)
class Schedule:
    """A workload cut into steps: step k covers simulated [k * step_ms, (k + 1) * step_ms)."""

    step_ms: int
    steps: int
    #: Step k adds requests arrival_bounds[k]:arrival_bounds[k + 1] (they arrive in id order) and
    #: cancels completion_order[completion_bounds[k]:completion_bounds[k + 1]].
    arrival_bounds: list[int]
    completion_bounds: list[int]
    #: Timers truly pending after step k: arrived - completed - timed out (expiration <= end).
    pending: Int64Array

    def end_ms(self, step: int) -> int:
        return (step + 1) * self.step_ms


def make_schedule(workload: Workload, step_ms: int) -> Schedule:
    # Enough steps that the last step's end reaches the latest expiration: everything drains.
    steps = -(-int(workload.expiration_ms.max()) // step_ms)
    edges = np.arange(steps + 1, dtype=np.int64) * step_ms
    arrival_bounds = np.searchsorted(workload.arrival_ms, edges, side="left")
    completion_bounds = np.searchsorted(workload.completion_order_at_ms, edges, side="left")
    timeouts = np.sort(workload.expiration_ms[~workload.completes])
    timed_out = np.searchsorted(timeouts, edges[1:], side="right")
    pending = arrival_bounds[1:] - completion_bounds[1:] - timed_out
    return Schedule(
        step_ms=step_ms,
        steps=steps,
        arrival_bounds=arrival_bounds.tolist(),
        completion_bounds=completion_bounds.tolist(),
        pending=pending.astype(np.int64),
    )


# ---------------------------------------------------------------------- driving the timers
class LoopMeter:
    """Times the loop of timer operations and, under tracemalloc, its peak memory growth.

    Memory allocated before the loop (the workload, the wheel driver's handle array) is not
    counted: the peak is measured from the loop's start.
    """

    def __init__(self) -> None:
        self.wall_s = 0.0
        self.cpu_s = 0.0  # this process's CPU time: excludes time the VM's CPU was stolen
        self.peak_bytes = 0
        self._traced_at_start = 0
        self._started_wall = self._started_cpu = 0.0

    def start(self) -> None:
        if tracemalloc.is_tracing():
            self._traced_at_start = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
        self._started_wall, self._started_cpu = time.perf_counter(), time.process_time()

    def stop(self) -> None:
        self.wall_s = time.perf_counter() - self._started_wall
        self.cpu_s = time.process_time() - self._started_cpu
        if tracemalloc.is_tracing():
            self.peak_bytes = tracemalloc.get_traced_memory()[1] - self._traced_at_start


@dataclass
class Run:
    """One pass of one implementation over a schedule."""

    meter: LoopMeter
    held: Int64Array  # entries held after each step
    fired_per_step: Int64Array
    cancelled: int
    #: Request ids in firing order (only when kept; the memory pass does not keep them).
    fired_ids: Int64Array | None = None
    #: The wheel's view: expirations and fired_at of what fired, and its self-consistency.
    fired_expiration_ms: Int64Array | None = None
    fired_at_ms: Int64Array | None = None
    buckets_agree: bool = True


def drive_wheel(workload: Workload, schedule: Schedule, keep_fired: bool) -> Run:
    wheel = TimingWheel(tick_ms=TICK_MS, wheel_size=WHEEL_SIZE, start_ms=0)
    # A cancel needs the handle add returned; request ids are dense, so an array indexes them.
    handles = np.empty(workload.requests, dtype=np.int64)
    held = np.zeros(schedule.steps, dtype=np.int64)
    fired_per_step = np.zeros(schedule.steps, dtype=np.int64)
    fired_handles: list[Int64Array] = []
    fired_expirations: list[Int64Array] = []
    fired_at: list[Int64Array] = []
    arrival_ms, completion_order = workload.arrival_ms, workload.completion_order
    arrival_bounds, completion_bounds = schedule.arrival_bounds, schedule.completion_bounds
    # The held_by_buckets() audit sums every bucket, so it runs once: where the most is pending.
    audit_step = int(np.argmax(schedule.pending))
    buckets_agree = True
    cancelled = 0
    meter = LoopMeter()
    meter.start()
    for step in range(schedule.steps):
        first, last = arrival_bounds[step], arrival_bounds[step + 1]
        if last > first:
            # Deadlines are computed as a broker would, on arrival (the heap does the same).
            expirations = arrival_ms[first:last] + TIMEOUT_MS
            added = wheel.add(expirations)
            handles[first:last] = added.handles
        first, last = completion_bounds[step], completion_bounds[step + 1]
        if last > first:
            cancelled += int(wheel.cancel(handles[completion_order[first:last]]).sum())
        fired = wheel.advance(schedule.end_ms(step))
        fired_per_step[step] = len(fired.handles)
        if keep_fired:
            fired_handles.append(fired.handles)
            fired_expirations.append(fired.expirations)
            fired_at.append(fired.fired_at)
        held[step] = len(wheel)
        if step == audit_step:
            buckets_agree = wheel.held_by_buckets() == len(wheel)
    meter.stop()
    buckets_agree = buckets_agree and wheel.held_by_buckets() == len(wheel) == 0
    assert wheel.cancelled_total == cancelled
    # A timer due when added would fire inside add, unseen by advance: none is (timeout > 0).
    assert wheel.fired_total == int(fired_per_step.sum())
    run = Run(meter, held, fired_per_step, cancelled, buckets_agree=buckets_agree)
    if keep_fired:
        run.fired_ids = request_ids_of(handles, np.concatenate(fired_handles))
        run.fired_expiration_ms = np.concatenate(fired_expirations)
        run.fired_at_ms = np.concatenate(fired_at)
    return run


def request_ids_of(handles: Int64Array, fired_handles: Int64Array) -> Int64Array:
    """Maps handles back to request ids without relying on how the wheel encodes them."""
    order = np.argsort(handles, kind="stable")
    sorted_handles = handles[order]
    assert (np.diff(sorted_handles) > 0).all(), "handles of live timers must be distinct"
    positions = np.searchsorted(sorted_handles, fired_handles)
    assert (positions < len(handles)).all()
    ids = order[positions]
    assert (handles[ids] == fired_handles).all(), "a fired handle that add never returned"
    return ids.astype(np.int64)


def drive_heap(workload: Workload, schedule: Schedule, keep_fired: bool) -> Run:
    timer = HeapTimer()
    held = np.zeros(schedule.steps, dtype=np.int64)
    fired_per_step = np.zeros(schedule.steps, dtype=np.int64)
    fired_ids: list[int] = []
    arrival_ms, completion_order = workload.arrival_list, workload.completion_order_list
    arrival_bounds, completion_bounds = schedule.arrival_bounds, schedule.completion_bounds
    cancelled = 0
    meter = LoopMeter()
    meter.start()
    for step in range(schedule.steps):
        for request_id in range(arrival_bounds[step], arrival_bounds[step + 1]):
            timer.add(request_id, arrival_ms[request_id] + TIMEOUT_MS)
        for position in range(completion_bounds[step], completion_bounds[step + 1]):
            cancelled += timer.cancel(completion_order[position])
        fired = timer.advance(schedule.end_ms(step))
        fired_per_step[step] = len(fired)
        if keep_fired:
            fired_ids += fired
        held[step] = len(timer)
    meter.stop()
    assert len(timer) == timer.pending == 0
    run = Run(meter, held, fired_per_step, cancelled)
    if keep_fired:
        run.fired_ids = np.array(fired_ids, dtype=np.int64)
    return run


Driver = Callable[[Workload, Schedule, bool], Run]
IMPLEMENTATIONS: dict[str, Driver] = {"wheel": drive_wheel, "heap": drive_heap}


def peak_memory(driver: Driver, workload: Workload, schedule: Schedule) -> int:
    """Peak bytes traced during the driver's loop, over what was traced when the loop started."""
    tracemalloc.start()
    try:
        return driver(workload, schedule, False).meter.peak_bytes
    finally:
        tracemalloc.stop()


def check(name: str, run: Run, workload: Workload, schedule: Schedule) -> None:
    """Exactly the timed-out requests fire, each once, in the step its expiration falls in."""
    assert run.fired_ids is not None
    timeouts = np.flatnonzero(~workload.completes)
    assert len(run.fired_ids) == len(np.unique(run.fired_ids)), f"{name}: a timer fired twice"
    assert np.array_equal(np.sort(run.fired_ids), timeouts), f"{name}: fired != timed out"
    assert run.cancelled == int(workload.completes.sum()), f"{name}: a cancel missed its timer"
    fired_step = np.repeat(np.arange(schedule.steps, dtype=np.int64), run.fired_per_step)
    expirations = workload.expiration_ms[run.fired_ids]
    expected_step = -(-expirations // schedule.step_ms) - 1  # k * step < expiration <= (k+1) step
    assert np.array_equal(fired_step, expected_step), f"{name}: fired in the wrong step"
    if run.fired_expiration_ms is not None and run.fired_at_ms is not None:
        assert np.array_equal(run.fired_expiration_ms, expirations), f"{name}: wrong expirations"
        rounded = run.fired_expiration_ms - run.fired_expiration_ms % TICK_MS
        assert np.array_equal(run.fired_at_ms, rounded), f"{name}: fired_at is not the tick"
    assert run.buckets_agree, f"{name}: held_by_buckets() != len()"


# ---------------------------------------------------------------------- the benchmark
def measure(
    workload: Workload, schedule: Schedule, repeat: int
) -> tuple[dict[str, dict[str, Any]], dict[str, Int64Array]]:
    runs: dict[str, list[Run]] = {name: [] for name in IMPLEMENTATIONS}
    # Interleaved, so a slow spell of the VM does not land on one implementation only.
    for _ in range(repeat):
        for name, driver in IMPLEMENTATIONS.items():
            runs[name].append(driver(workload, schedule, True))
    results: dict[str, dict[str, Any]] = {}
    for name, driver in IMPLEMENTATIONS.items():
        for run in runs[name]:
            check(name, run, workload, schedule)
        first = runs[name][0]
        wall_s = statistics.median(run.meter.wall_s for run in runs[name])
        cpu_s = statistics.median(run.meter.cpu_s for run in runs[name])
        peak = peak_memory(driver, workload, schedule)
        results[name] = {
            "requests_per_wall_s": round(workload.requests / wall_s),
            "requests_per_cpu_s": round(workload.requests / cpu_s),
            "median_wall_s": round(wall_s, 3),
            "peak_memory_bytes": peak,
            "peak_bytes_per_max_pending": round(peak / max(int(schedule.pending.max()), 1), 1),
            "max_held": int(first.held.max()),
            "max_pending": int(schedule.pending.max()),
            "held_equals_pending_every_step": bool(np.array_equal(first.held, schedule.pending)),
            "fired": int(first.fired_per_step.sum()),
            "cancelled": first.cancelled,
        }
    fired = {name: runs[name][0].fired_ids for name in IMPLEMENTATIONS}
    return results, {name: ids for name, ids in fired.items() if ids is not None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=100_000, help="requests per simulated s")
    parser.add_argument("--steps", default="1,10,100", help="step sizes in simulated ms")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="timing passes; medians reported")
    args = parser.parse_args()
    step_sizes = [int(step) for step in args.steps.split(",")]

    cases: dict[str, Any] = {}
    rows: list[tuple[str, int, dict[str, Any], dict[str, Any], float, bool]] = []
    for case in CASES:
        workload = make_workload(case, args.requests, args.rate, args.seed)
        timeouts = int((~workload.completes).sum())
        by_step: dict[str, Any] = {}
        for step_ms in step_sizes:
            schedule = make_schedule(workload, step_ms)
            results, fired = measure(workload, schedule, args.repeat)
            assert np.array_equal(fired["wheel"], fired["heap"]), "wheel and heap fired apart"
            wheel, heap = results["wheel"], results["heap"]
            assert wheel["held_equals_pending_every_step"], "the wheel held a cancelled timer"
            speedup = wheel["requests_per_wall_s"] / heap["requests_per_wall_s"]
            meets = wheel["requests_per_wall_s"] >= TARGET_REQUESTS_PER_S and (
                speedup >= TARGET_SPEEDUP
            )
            by_step[str(step_ms)] = {
                "simulated_steps": schedule.steps,
                **results,
                "speedup_wall": round(speedup, 2),
                "speedup_cpu": round(wheel["requests_per_cpu_s"] / heap["requests_per_cpu_s"], 2),
                "meets_target": meets,
            }
            rows.append((case.name, step_ms, wheel, heap, speedup, meets))
        cases[case.name] = {
            "completion_p50_ms": case.completion_p50_ms,
            "completion_p75_ms": case.completion_p75_ms,
            "timeouts": timeouts,
            "timeout_fraction": round(timeouts / args.requests, 4),
            "steps": by_step,
        }

    print_table(rows)
    record(
        "timer_wheel",
        {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()} {os.cpu_count()} cpu, "
            f"python {platform.python_version()}, numpy {np.__version__}",
            "requests": args.requests,
            "rate_per_s": args.rate,
            "seed": args.seed,
            "repeats": args.repeat,
            "timeout_ms": TIMEOUT_MS,
            "tick_ms": TICK_MS,
            "wheel_size": WHEEL_SIZE,
            "memory": "tracemalloc peak growth during the timed loop, measured in a separate pass; "
            "excludes the wheel driver's request -> handle array, allocated before the loop",
            "wheel_handle_array_bytes": args.requests * np.dtype(np.int64).itemsize,
            "target": f"wheel >= {TARGET_REQUESTS_PER_S} requests/s and >= "
            f"{TARGET_SPEEDUP}x heap (wall)",
            "all_meet_target": all(row[5] for row in rows),
            "cases": cases,
        },
    )


def print_table(rows: list[tuple[str, int, dict[str, Any], dict[str, Any], float, bool]]) -> None:
    header = (
        f"{'case':<13}{'step':>5} {'wheel req/s':>12}{'heap req/s':>12}{'speedup':>8}"
        f"{'wheel MiB':>10}{'heap MiB':>9}{'pending':>9}{'wheel held':>11}{'heap held':>10}"
        f"  target"
    )
    print(header)
    for case, step_ms, wheel, heap, speedup, meets in rows:
        print(
            f"{case:<13}{step_ms:>5} {wheel['requests_per_wall_s']:>12,}"
            f"{heap['requests_per_wall_s']:>12,}{speedup:>7.2f}x"
            f"{wheel['peak_memory_bytes'] / 2**20:>10.1f}{heap['peak_memory_bytes'] / 2**20:>9.1f}"
            f"{wheel['max_pending']:>9,}{wheel['max_held']:>11,}{heap['max_held']:>10,}"
            f"  {'met' if meets else 'missed'}"
        )


if __name__ == "__main__":
    main()
