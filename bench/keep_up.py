"""Keeping up: does a live query over ``--clients`` active clients sustain ``--rate`` events/s?

``bench/pipeline.py``'s ``scale`` measures fixed batches of 100k events; a live query is
different in two ways: its batches grow when it falls behind (it reads whatever has arrived),
and a batch's cost per event falls as it carries more events for the same entities (a shard's
state is restored and encoded once per batch, whatever the batch's size). So this runs the
engine as shipped and offers the load:

1. Apache Kafka, Redis and local Spark (``local[2]``) on this machine; the topic has ``PARTITIONS``
   partitions.
2. Pre-load: each of the ``--clients`` clients sends one event (``pipeline.scale_messages``,
   ``--per-message`` events per message); the query drains them all before the window opens,
   so its state holds every client.
3. The offered window: ``--rate`` events/s for ``--seconds`` (``overload.offer``), each event
   from a client drawn uniformly from the population, ``--per-message`` to a message, with
   ``ts`` the time the message is built. The messages are built as they are sent: formatting
   costs ~0.5 us an event on one core here, so 100k events/s take ~5% of a core. The producer
   and the broker share the machine with the engine, so the producer batches as a
   high-throughput client would (``overload.offer``: up to 1 MiB per partition, 100 ms linger);
   with kafka-python's defaults (16 KiB, so each ~47 KB message a batch of its own) the producer
   and the broker used 0.20 and 0.26 cores at 100k events/s, against 0.125 and 0.155 (measured
   without the engine, 2026-11-29). ``cpu_cores_in_window`` reports what each party used: this
   process (the producer, the sampling, the query's Python driver), the broker, Spark's JVM, its
   Python workers and Redis. What limits the producer is measured, not assumed:
   ``achieved_offered_events_per_s`` is what reached the topic (its end offsets) over the
   window's real length (from the first send to the producer's flush). When it falls short of
   the offered rate, it is the machine's ceiling for this run and the verdict is about it.
4. The query runs with the engine's defaults: a 1 s processing-time trigger and no
   ``maxOffsetsPerTrigger``. The trigger only matters when batches are shorter than it (a
   batch that takes longer is followed at once, as with a 0 trigger), and it is what an
   operator runs. No cap, because keeping up means reading whatever has arrived: a capped
   query's backlog grows by design as soon as the cap is below the rate (``bench/overload.py``
   measures that case).
5. Every 5 s (``--sample-s``; and at the window's end) a sample: the backlog (the topic's end
   minus what the query's completed batches have read, in messages and events), the batches
   completed since the previous sample (each once, by batch id: duration and events), the
   state's size, the memory of the driver JVM and the Python workers, and the machine's load
   average (it may be shared). After the window, until the query has read the whole topic:
   ``catch_up_s`` is from the window's end to the end of the batch that read the topic's last
   offset (0 if nothing was left).

The verdict. Events are counted from the source offsets each batch read (x events per
message); a batch is in the window when it ended in it. The backlog is what no completed batch
has read: the events not yet decided (a running batch's input counts, as its decisions are not
out). A batch reads what arrived while the one before it ran (or during the trigger interval,
when batches are shorter): from an idle start, batches longer than the trigger grow over a few
batches towards the length at which a batch reads what arrives while it runs. So the batches
judged are those that ended in the window's second half, bar the window's first (which read
what arrived while the query idled): ``batch_events_p50``, their median events, is what
arrives in one batch (``batch_ms_p50`` is over the same batches, ``batches_judged`` counts
them). A query that keeps up at a steady batch length holds between one and two batches'
arrivals undecided, depending on where in a batch it is looked at; one that falls behind runs
ever longer batches, and its backlog grows with them. ``kept_up`` is true when both hold:

* ``backlog_end_events`` (at the window's end) <= 2 x ``batch_events_p50``;
* ``backlog_end_events - backlog_mid_events`` <= ``batch_events_p50``, where
  ``backlog_mid_events`` is the sample nearest the window's middle: the backlog did not grow
  over the window's second half by more than the one batch a sample's timing can account for.

With no batch to judge, ``kept_up`` is false: the query did not show it keeps up.

``processed_events_per_s`` is the events read by the batches completed during the window over
the window's length. ``state_bytes_per_client`` is Spark's ``memoryUsedBytes`` of the state
operator after the catch-up over ``--clients``: what the state store holds in memory, which
includes the older versions it retains (``maxBatchesToRetainInMemory``);
``state_current_version_bytes_per_client`` is the latest version alone (its
``stateOnCurrentVersionSizeBytes``), and ``..._after_preload`` the same before the window, when
the state holds each client's one event.

Prints one JSON object and appends it to bench/results/keep_up.jsonl (per-sample lines go to
stderr).

    python bench/keep_up.py [--quick] [--clients 1000000] [--rate 100000] [--seconds 60]
        [--per-message 500] [--sample-s 5]

``--quick``: 100k clients, 20k events/s for 30 s (batches take ~5 s at 100k clients here, and a
verdict needs a few), in about 2 minutes.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from overload import TOPIC, memory, offer, read_so_far
from pipeline import CONFIG, PARTITIONS, create_topic, publish, scale_messages, settings
from processes import cpu_seconds, descendants_by_party
from results import record  # bench/ is on sys.path when a script in it runs

from streaming.engine.job import GracefulStop, local_spark, start_query
from streaming.engine.kafka_clients import end_offsets
from streaming.engine.offsets import records_read
from streaming.kafka_broker import start_kafka
from streaming.services import LocalService, start_redis

#: Seconds between samples (``--sample-s``).
SAMPLE_S = 5.0
#: How long the pre-load and the catch-up may take before the run is reported as stuck.
LIVENESS_S = 900.0


class Population:
    """Events of ``clients`` clients drawn uniformly, shaped as ``pipeline.scale_messages``'
    (user ``u<n>``, so they land on the pre-loaded entities)."""

    def __init__(self, clients: int, seed: int) -> None:
        self.clients = clients
        self.rng = random.Random(seed)

    def messages(self, events: int, per_message: int, now_ms: int) -> Iterator[bytes]:
        draw = self.rng.randrange
        for first in range(0, events, per_message):
            count = min(per_message, events - first)
            yield (
                "["
                + ",".join(
                    f'{{"kind":"produce","user":"u{draw(self.clients)}","client_id":"c",'
                    f'"broker":1,"bytes":100,"ts":{now_ms}}}'
                    for _ in range(count)
                )
                + "]"
            ).encode()


@dataclass(frozen=True)
class Batch:
    id: int
    ended: float  # epoch s
    ms: int
    events: int
    #: The topic's records read up to the end of this batch (all partitions).
    read_to: int


class Watch:
    """A running query's backlog, batches, state and memory. Batches are those that read
    records, each once (``recentProgress`` repeats them across calls and keeps the last 100)."""

    def __init__(
        self, query: Any, kafka: LocalService, per_message: int, sample_s: float = SAMPLE_S
    ) -> None:
        self.query = query
        self.kafka = kafka
        self.per_message = per_message
        self.sample_s = sample_s
        self.origin = time.time()
        self.batches: dict[int, Batch] = {}
        self.consumer = KafkaConsumer(bootstrap_servers=kafka.address, enable_auto_commit=False)

    def topic_end(self) -> int:
        """The topic's records, all partitions."""
        partitions = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        return sum(end_offsets(self.consumer, partitions, timeout_ms=30_000).values())

    def new_batches(self) -> list[Batch]:
        found = []
        for progress in self.query.recentProgress:
            source = progress["sources"][0]
            records = records_read(source["startOffset"], source["endOffset"], [TOPIC])
            if records == 0 or progress["batchId"] in self.batches:
                continue
            ms = progress["durationMs"]["triggerExecution"]
            started = datetime.fromisoformat(progress["timestamp"]).timestamp()
            batch = Batch(
                id=progress["batchId"],
                ended=started + ms / 1000,
                ms=ms,
                events=records * self.per_message,
                read_to=records_read(None, source["endOffset"], [TOPIC]),
            )
            self.batches[batch.id] = batch
            found.append(batch)
        return found

    def state_bytes(self) -> dict[str, int]:
        """The state store's memory, and its latest version's share of it."""
        progress = self.query.lastProgress
        if not progress:
            return {"memory_used": 0, "current_version": 0}
        state = progress["stateOperators"][0]
        return {
            "memory_used": int(state["memoryUsedBytes"]),
            "current_version": int(state["customMetrics"]["stateOnCurrentVersionSizeBytes"]),
        }

    def sample(self, offering: bool) -> dict[str, Any]:
        read = read_so_far(self.query)  # before the end: a backlog is never negative
        backlog = self.topic_end() - read
        new = self.new_batches()
        taken = {
            "t_s": round(time.time() - self.origin, 1),
            "offering": offering,
            "backlog_messages": backlog,
            "backlog_events": backlog * self.per_message,
            "batches_ms": [b.ms for b in new],
            "batches_events": [b.events for b in new],
            "state_bytes": self.state_bytes()["memory_used"],
            # The machine may be shared: its load says how much of it the run had.
            "load_1m": round(os.getloadavg()[0], 1),
            **memory(),
        }
        print(taken, file=sys.stderr, flush=True)
        return taken

    def until_read(self, records: int, samples: list[dict[str, Any]]) -> bool:
        """Samples every ``sample_s`` until the query has read ``records`` records of the
        topic; False when ``LIVENESS_S`` passed first."""
        deadline = time.monotonic() + LIVENESS_S
        while read_so_far(self.query) < records:
            if not self.query.isActive:
                raise RuntimeError(f"the query stopped: {self.query.exception()}")
            if time.monotonic() > deadline:
                return False
            time.sleep(self.sample_s)
            samples.append(self.sample(offering=False))
        return True


def cpu_by_party() -> dict[str, float]:
    """CPU seconds used so far by each party on the machine: this process (the producer, the
    sampling, the query's Python driver), the broker, Spark's JVM, its Python workers, Redis."""
    return {
        "bench_process": cpu_seconds(os.getpid()),
        **{
            party: sum(cpu_seconds(pid) for pid in pids)
            for party, pids in descendants_by_party().items()
        },
    }


@dataclass(frozen=True)
class Window:
    start: float  # epoch s
    end: float  # the producer's flush
    #: The topic's records read by the query's completed batches at the end, and the topic's end.
    read_at_end: int
    topic_end: int
    caught_up: bool
    samples: list[dict[str, Any]]
    #: Cores each party used over the window (CPU seconds over its length).
    cpu_cores: dict[str, float]


def offered_window(watch: Watch, traffic: Population, rate: int, seconds: int) -> Window:
    """Offers ``rate`` events/s for ``seconds``, sampling, then waits for the catch-up."""
    per_message = watch.per_message
    watch.new_batches()  # the batches before are not the window's
    start = watch.origin = time.time()
    cpu_at_start = cpu_by_party()
    load = offer(watch.kafka, rate // per_message, per_message, seconds, traffic.messages)
    samples: list[dict[str, Any]] = []
    next_sample = start + watch.sample_s
    while load.is_alive():
        load.join(timeout=max(0.0, next_sample - time.time()))
        if load.is_alive():
            samples.append(watch.sample(offering=True))
            next_sample += watch.sample_s
    end = time.time()
    cpu_cores = {
        party: round((used - cpu_at_start[party]) / (end - start), 2)
        for party, used in cpu_by_party().items()
    }
    read_at_end = read_so_far(watch.query)
    end_offset = watch.topic_end()
    samples.append(watch.sample(offering=False))
    caught_up = watch.until_read(end_offset, samples)
    watch.new_batches()
    return Window(start, end, read_at_end, end_offset, caught_up, samples, cpu_cores)


def verdict(window: Window, watch: Watch, preloaded: int) -> dict[str, Any]:
    """The window's figures and ``kept_up``, as the module's docstring defines them."""
    per_message = watch.per_message
    length = window.end - window.start
    in_window = [b for b in watch.batches.values() if window.start <= b.ended <= window.end]
    backlog_end = (window.topic_end - window.read_at_end) * per_message
    middle = min(window.samples, key=lambda s: abs(s["t_s"] - length / 2))
    backlog_mid = middle["backlog_events"]
    middle_time = window.start + length / 2
    steady = [b for b in sorted(in_window, key=lambda b: b.id)[1:] if b.ended >= middle_time]
    batch_events_p50 = statistics.median(b.events for b in steady) if steady else None
    kept_up = (
        batch_events_p50 is not None
        and backlog_end <= 2 * batch_events_p50
        and backlog_end - backlog_mid <= batch_events_p50
    )
    catch_up_s = None
    if window.caught_up and backlog_end == 0:
        catch_up_s = 0.0
    elif window.caught_up:
        last = min(
            (b for b in watch.batches.values() if b.read_to >= window.topic_end),
            key=lambda b: b.id,
        )
        catch_up_s = round(max(0.0, last.ended - window.end), 1)
    return {
        "window_s": round(length, 1),
        "achieved_offered_events_per_s": round(
            (window.topic_end - preloaded) * per_message / length
        ),
        "processed_events_per_s": round((window.read_at_end - preloaded) * per_message / length),
        "kept_up": kept_up,
        "backlog_mid_events": backlog_mid,
        "backlog_end_events": backlog_end,
        "catch_up_s": catch_up_s,
        "batches_in_window": len(in_window),
        "batches_judged": len(steady),
        "batch_ms_p50": statistics.median(b.ms for b in steady) if steady else None,
        "batch_ms_max": max((b.ms for b in in_window), default=None),
        "batch_events_p50": batch_events_p50,
        "batch_events_max": max((b.events for b in in_window), default=None),
        "cpu_cores_in_window": window.cpu_cores,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k clients, 20k/s, 30 s")
    parser.add_argument("--clients", type=int, help="active clients (default 1M, quick 100k)")
    parser.add_argument("--rate", type=int, help="events/s offered (default 100k, quick 20k)")
    parser.add_argument("--seconds", type=int, help="offered window (default 60, quick 30)")
    parser.add_argument("--per-message", type=int, default=500, help="events per message")
    parser.add_argument(
        "--sample-s", type=float, default=SAMPLE_S, help="seconds between samples (default 5)"
    )
    args = parser.parse_args()
    clients = args.clients or (100_000 if args.quick else 1_000_000)
    rate = args.rate or (20_000 if args.quick else 100_000)
    seconds = args.seconds or (30 if args.quick else 60)
    per_message = args.per_message
    with start_kafka() as kafka, start_redis() as redis_server:
        create_topic(kafka, TOPIC)
        everyone, _ = scale_messages(clients, per_message, int(time.time() * 1000), 0, 0)
        preloaded = publish(kafka, TOPIC, everyone)
        engine = settings(kafka, redis_server, TOPIC)
        spark = local_spark(engine)
        # Stopped between batches: stopping inside one makes Spark log broadcast errors.
        stopper = GracefulStop()
        query = start_query(spark, engine, CONFIG, graceful_stop=stopper)
        watch = Watch(query, kafka, per_message, args.sample_s)
        try:
            preload_samples: list[dict[str, Any]] = []
            if not watch.until_read(preloaded, preload_samples):
                raise TimeoutError(f"the pre-load was not read in {LIVENESS_S} s")
            preload_s = time.time() - watch.origin
            after_preload = watch.state_bytes()
            window = offered_window(watch, Population(clients, seed=14), rate, seconds)
            final_state = watch.state_bytes()
        finally:
            watch.consumer.close()
            stopper.stop(query)
            spark.stop()
    record(
        "keep_up",
        {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()} {os.cpu_count()} cpu, local[2]",
            "quick": args.quick,
            "active_clients": clients,
            "events_per_message": per_message,
            "trigger_ms": engine.spark.trigger_ms,
            "max_offsets_per_trigger": engine.kafka.max_offsets_per_trigger,
            "preload_s": round(preload_s, 1),
            "offered_events_per_s": rate // per_message * per_message,
            "offered_seconds": seconds,
            **verdict(window, watch, preloaded),
            "state_bytes": final_state["memory_used"],
            "state_bytes_per_client": round(final_state["memory_used"] / clients, 1),
            "state_current_version_bytes_per_client": round(
                final_state["current_version"] / clients, 1
            ),
            "state_current_version_bytes_per_client_after_preload": round(
                after_preload["current_version"] / clients, 1
            ),
            "preload_samples": preload_samples,
            "samples": window.samples,
        },
    )


if __name__ == "__main__":
    main()
