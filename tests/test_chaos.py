"""Chaos: the driver killed with SIGKILL again and again, in every phase of a micro-batch, loses
no byte and counts none twice; every entity's window and decision equal a batch recomputation.

Modelled on PySpark's own stateful chaos test (``test_pandas_grouped_map_with_state.py``): the
query restarts from its checkpoint after each kill, and the end result is checked against the
same events computed in one batch by the replay core. Where each kill landed is read from the
checkpoint and Redis once the driver is dead: the micro-batch it hit, how far that batch got,
and how much input no batch had planned yet.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import redis
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from pyspark.sql import SparkSession

from quotastream.redis_contract import decision_key
from state.config import QuotaConfig, load_quota_config
from state.shard import ShardState
from streaming.engine.decision_values import decision_values
from streaming.engine.offsets import layout_of
from streaming.engine.settings import EngineSettings, load_engine_settings
from streaming.engine.shard_layout import ShardLayout
from streaming.engine.source_records import KafkaRecords
from streaming.engine.stages import DECISION, StageSettings, update_shard
from streaming.services import LocalService
from tests.servers import start_spark_cluster
from tests.support.checkpoint import (
    PlannedBatch,
    committed_batches,
    planned_batches,
    states_written,
)
from tests.support.engine import batches_needed, commits, engine_file, quotastream, stored_decisions
from tests.support.factories import mixed_payloads
from tests.support.queries import assert_matches_batch_recomputation
from tests.support.stage_runs import shard_inputs

KILLS = 10
#: Every fourth kill lands while the driver starts: session, query start, first batch.
START_UP_EVERY = 4
SEED = int(os.environ.get("QUOTASTREAM_CHAOS_SEED", "20261122"))
#: What a micro-batch goes through, in order (see :class:`Landing`).
PHASES = ("planning", "state", "Redis writes", "commit")
#: How often the test looks at the checkpoint and Redis while it waits to kill.
LOOK_EVERY_S = 0.01


def chaos_engine_file(
    tmp_path: Path,
    kafka: LocalService,
    redis_server: LocalService,
    topic: str,
    records_per_batch: int = 200,
    **spark: Any,
) -> Path:
    """``records_per_batch`` records a micro-batch, one every 200 ms: many batches to kill the
    driver in."""
    return engine_file(
        tmp_path,
        topic,
        kafka.address,
        {
            "host": redis_server.host,
            "port": redis_server.port,
            "key_prefix": topic,
            # Decisions outlive the test: one that expired during a restart would look unwritten.
            "keep_ms": 3_600_000,
        },
        kafka={"max_offsets_per_trigger": records_per_batch},
        spark={"trigger_ms": 200, **spark},
    )


def publish(kafka: LocalService, topic: str, values: list[bytes]) -> list[tuple[int, int]]:
    """Publishes ``values`` over three partitions; where each landed: (partition, offset)."""
    admin = KafkaAdminClient(bootstrap_servers=kafka.address)
    admin.create_topics([NewTopic(topic, 3, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=kafka.address, linger_ms=10)
    sent = [producer.send(topic, value, partition=i % 3) for i, value in enumerate(values)]
    producer.flush()
    producer.close()
    return [(future.value.partition, future.value.offset) for future in sent]


def session(leader: int) -> set[int]:
    """The processes of ``leader``'s session (pyspark's worker daemon moves to a process group
    of its own, but not out of the session)."""
    found = subprocess.run(
        ["pgrep", "-s", str(leader)], capture_output=True, text=True, check=False
    )
    return {int(pid) for pid in found.stdout.split()}


def kill_driver(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the driver: its Python process and its JVM at once (the process group of the
    session it was started in); its Python workers follow them down.

    The JVM alone would notice the Python process gone and run its shutdown hooks while the
    query goes on, planning or committing a batch after the kill."""
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)
    deadline = time.monotonic() + 60
    while session(process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    # A survivor writing to the checkpoint would make the restart's result meaningless.
    assert not session(process.pid), f"processes outlived the killed driver: {session(process.pid)}"


class UnkilledRun:
    """The checkpoint's micro-batches run again in this process, in order, without Spark and
    without kills: the engine's two stages per shard (``streaming/engine/stages.py``), each batch at
    its own batch time, and the values its sink writes (``decision_values``). What a query that
    was never killed writes to Redis with the same batches."""

    def __init__(
        self,
        settings: EngineSettings,
        config: QuotaConfig,
        topic: str,
        records: dict[tuple[int, int], bytes],
    ) -> None:
        # As the engine's query builds them (streaming/engine/job.py start_query): one
        # configuration.
        self.stage = StageSettings.of(settings, config)
        self.shards = settings.spark.shards
        self.prefix = settings.redis.key_prefix
        self.topic = topic
        #: The topic's records by (partition, offset).
        self.records = records
        self.states: dict[int, ShardState] = {}
        self.read_to: dict[int, int] = {}
        #: Per batch id, the decisions whose value the batch changes, by key.
        self.writes: list[dict[str, dict[str, Any]]] = []
        #: Every decision after the batches run so far, by key.
        self.stored: dict[str, dict[str, Any]] = {}

    def catch_up(self, planned: list[PlannedBatch]) -> None:
        for batch in planned[len(self.writes) :]:
            self.run(batch)

    def run(self, batch: PlannedBatch) -> None:
        assert batch.batch_id == len(self.writes), "batches run in order, each once"
        reads = []
        for partition, end in sorted(batch.offsets[self.topic].items()):
            start = self.read_to.get(int(partition), 0)
            offsets = list(range(start, int(end)))
            values: list[bytes | None] = [self.records[(int(partition), o)] for o in offsets]
            # The configuration file is version 0: these tests never change it.
            if offsets:
                reads.append(KafkaRecords(self.topic, int(partition), offsets, values, 0))
            self.read_to[int(partition)] = int(end)
        # The layout the batch pinned: the shards spread over the state tasks Spark pinned.
        layout = layout_of(batch.offsets)
        assert layout == ShardLayout(self.shards, batch.state_partitions), layout
        changed: dict[str, dict[str, Any]] = {}
        for shard, given in shard_inputs(reads, self.stage, layout).items():
            update = update_shard(
                self.states.get(shard), given, self.stage, shard, batch.timestamp_ms
            )
            # A pending throttle would wake its shard in later batches without data; the events
            # are from 2023, so every throttle is over by the batch that decides it.
            assert update.wake_at_ms is None, f"batch {batch.batch_id}: a throttle is pending"
            if update.state is not None:
                self.states[shard] = update.state
            for part in update.batches:
                is_decision = pc.equal(part.column("row_type"), DECISION)
                decisions = part.filter(pc.and_kleene(is_decision, part.column("write")))
                for value in map(json.loads, decision_values(decisions)):
                    key = decision_key(self.prefix, value["quota"], value["entity"])
                    if self.stored.get(key) != value:
                        changed[key] = value
        self.stored.update(changed)
        self.writes.append(changed)


@dataclass(frozen=True)
class Landing:
    """Where a kill landed, read from the checkpoint and Redis.

    ``planning``: every planned micro-batch is committed (the trigger's wait, then the source
    plans the next one). ``state``: the batch is planned and none of its decisions is in Redis
    yet (reading Kafka, staging, updating and writing the shards' state). ``Redis writes``: some
    of its decisions are in Redis, not all (each state task writes its own shards'). ``commit``:
    all of them are, and the batch is not committed.
    """

    phase: str
    #: The micro-batch running (planning: the next one).
    batch_id: int
    #: Records the batch reads (planning: not known yet).
    batch_records: int
    #: Records that no planned batch covers yet.
    unread: int
    #: The batch's state partitions written, of all.
    states: tuple[int, int]
    #: Its decisions in Redis, of all it writes.
    decisions: tuple[int, int]

    @property
    def with_data(self) -> bool:
        return self.unread > 0 if self.phase == "planning" else self.batch_records > 0

    def __str__(self) -> str:
        if self.phase == "planning":
            return f"planning batch {self.batch_id} ({self.unread} unread)"
        return (
            f"{self.phase} of batch {self.batch_id} ({self.batch_records} records, "
            f"{self.unread} unread; state {self.states[0]}/{self.states[1]}, "
            f"decisions {self.decisions[0]}/{self.decisions[1]})"
        )


def landing(checkpoint: Path, client: redis.Redis, unkilled: UnkilledRun) -> Landing:
    """Where the query is now; once the driver is dead, where the kill landed."""
    # Running the batches planned since the last look takes a while: before the reads that
    # must be close together (the commit log first, so that "planning" is never stale).
    unkilled.catch_up(planned_batches(checkpoint))
    committed = committed_batches(checkpoint)
    planned = planned_batches(checkpoint)
    assert planned, "no micro-batch planned yet"
    unkilled.catch_up(planned)
    last = planned[-1]
    read = last.read_of(unkilled.topic)
    unread = len(unkilled.records) - read
    if last.batch_id in committed:
        return Landing("planning", last.batch_id + 1, 0, unread, (0, 0), (0, 0))
    before = planned[-2].read_of(unkilled.topic) if len(planned) > 1 else 0
    writes = unkilled.writes[last.batch_id]
    found = client.mget(list(writes)) if writes else []
    assert isinstance(found, list)
    written = sum(
        raw is not None and json.loads(raw) == value
        for raw, value in zip(found, writes.values(), strict=True)
    )
    phase = "state" if written == 0 else "commit" if written == len(writes) else "Redis writes"
    states = (states_written(checkpoint, last), last.state_partitions)
    return Landing(phase, last.batch_id, read - before, unread, states, (written, len(writes)))


@dataclass
class Kill:
    during: str  # "start-up" or "stream"
    #: The phase a kill during the stream was aimed at, and where it landed.
    aimed_at: str | None
    landed: Landing | None
    #: From the restart to its first committed micro-batch (None: killed before one).
    recovery_s: float | None

    def __str__(self) -> str:
        if self.landed is None:
            return self.during
        missed = f" (aimed at {self.aimed_at})" if self.aimed_at != self.landed.phase else ""
        return f"{self.landed}{missed}"


def wait_until(
    done: Callable[[], bool], driver: subprocess.Popen[bytes], what: str, timeout_s: float = 180
) -> None:
    """Waits for ``done()`` while the driver runs; fails the test if it does not come."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert driver.poll() is None, f"the driver exited while waiting for {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f} s"
        time.sleep(LOOK_EVERY_S)


def kill_in_phase(
    phase: str,
    driver: subprocess.Popen[bytes],
    look: Callable[[], Landing],
    rng: random.Random,
) -> Landing:
    """Kills the driver in ``phase`` of the next micro-batch, or of the one after if the first
    got past that phase between two looks; where the kill landed."""
    wanted = PHASES.index(phase)
    first = target = look().batch_id
    # The state phase: a random point of it, at the latest when the first shard state is written.
    kill_at: float | None = None

    def time_to_kill() -> bool:
        nonlocal target, kill_at
        now = look()
        here = (now.batch_id, PHASES.index(now.phase))
        if here > (target, wanted):
            if target > first:
                return True  # missed twice: it lands where it lands
            target, kill_at = target + 1, None
            return False
        if here < (target, wanted):
            return False
        if phase != "state" or now.states[0] > 0:
            return True
        kill_at = kill_at or time.monotonic() + rng.uniform(0.0, 1.0)
        return time.monotonic() >= kill_at

    wait_until(time_to_kill, driver, f"{phase} of micro-batch {first} or {first + 1}")
    kill_driver(driver)
    return look()


def run_with_kills(
    engine: Path, checkpoint: Path, look: Callable[[], Landing], rng: random.Random
) -> list[Kill]:
    kills: list[Kill] = []
    while len(kills) < KILLS:
        before = commits(checkpoint)
        started = time.monotonic()
        driver = subprocess.Popen(
            quotastream("run", "--engine-config", str(engine), "--no-simulate"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        if len(kills) % START_UP_EVERY == START_UP_EVERY - 1:
            time.sleep(rng.uniform(2.0, 12.0))
            assert driver.poll() is None, "the driver ended before it was killed"
            kill_driver(driver)
            assert commits(checkpoint) == before, "the start-up kill came after a micro-batch"
            kills.append(Kill("start-up", None, None, None))
            continue

        def restarted(count: int = before) -> bool:
            return commits(checkpoint) > count

        wait_until(restarted, driver, "micro-batch after a restart")
        recovery = time.monotonic() - started
        # Each phase in turn; one that a kill missed (a look came too late) is tried again.
        landed = [kill.landed.phase for kill in kills if kill.landed is not None]
        phase = min(PHASES, key=landed.count)
        kills.append(Kill("stream", phase, kill_in_phase(phase, driver, look, rng), recovery))
    return kills


def test_ten_sigkills_of_the_driver_lose_nothing_and_count_nothing_twice(
    spark: SparkSession, kafka: LocalService, redis_server: LocalService, tmp_path: Path
) -> None:
    topic = "chaos"
    # All within 5 s of event time, so every byte is still in the final windows.
    values = mixed_payloads(11, 6000, users=20, span_ms=5000)
    placed = publish(kafka, topic, values)
    engine = chaos_engine_file(tmp_path, kafka, redis_server, topic)
    checkpoint = tmp_path / "checkpoint"
    config = load_quota_config(tmp_path / "quotas.yaml")
    records = dict(zip(placed, values, strict=True))
    unkilled = UnkilledRun(load_engine_settings(engine), config, topic, records)
    client = redis.Redis(host=redis_server.host, port=redis_server.port)

    kills = run_with_kills(
        engine, checkpoint, lambda: landing(checkpoint, client, unkilled), random.Random(SEED)
    )
    # The last run reads what is left in one micro-batch, after the killed one again.
    final = subprocess.run(
        quotastream("run", "--engine-config", str(engine), "--available-now"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "QUOTASTREAM_KAFKA__MAX_OFFSETS_PER_TRIGGER": "null"},
    )
    assert final.returncode == 0, final.stderr[-3000:]
    landed = [kill.landed for kill in kills if kill.landed is not None]
    recoveries = [kill.recovery_s for kill in kills if kill.recovery_s is not None]
    report = (
        f"seed {SEED}: {len(kills)} kills: "
        + "; ".join(map(str, kills))
        + f". Recovery to the first batch {min(recoveries):.1f}-{max(recoveries):.1f} s; "
        f"{commits(checkpoint)} batches in all"
    )
    print(report)
    assert len(kills) == KILLS
    assert sum(kill.during == "start-up" for kill in kills) == KILLS // START_UP_EVERY
    assert_matches_batch_recomputation(spark, checkpoint, redis_server, topic, values, config)
    # Every field of every decision, as the same batches write it without kills.
    unkilled.catch_up(planned_batches(checkpoint))
    assert stored_decisions(client, topic) == unkilled.stored
    # Every kill hit a batch with data to lose (or planning one), and each phase was hit.
    assert all(where.with_data for where in landed), report
    assert {where.phase for where in landed} == set(PHASES), report
    # Some kill found the state of a batch written and not committed: the restart ran it again
    # from the state of the last committed batch.
    assert any(where.states[0] > 0 for where in landed), report


def test_a_standalone_cluster_loses_a_worker_mid_stream_and_loses_no_byte(
    spark: SparkSession, kafka: LocalService, redis_server: LocalService, tmp_path: Path
) -> None:
    topic = "cluster"
    values = mixed_payloads(17, 6000, users=20, span_ms=5000)
    publish(kafka, topic, values)
    with start_spark_cluster(workers=2, cores=1, memory="1g") as cluster:
        engine = chaos_engine_file(
            tmp_path,
            kafka,
            redis_server,
            topic,
            # Ten micro-batches: the worker is lost after the fourth (each takes ~2.5 s on a
            # cluster of two one-core executors).
            records_per_batch=600,
            master=cluster.url,
            conf={
                "spark.executor.cores": "1",
                "spark.executor.memory": "512m",
                "spark.cores.max": "2",
                "spark.driver.host": "127.0.0.1",
            },
        )
        checkpoint = tmp_path / "checkpoint"
        log = (tmp_path / "driver.log").open("wb")
        driver = subprocess.Popen(
            quotastream("run", "--engine-config", str(engine), "--no-simulate"),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 300
            while commits(checkpoint) < 4:
                assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "no micro-batches on the cluster"
                time.sleep(0.1)
            # Mid-stream: one Worker (and with it its executor) is gone for good.
            before_kill = commits(checkpoint)
            victim = cluster.workers[0]
            victim.process.kill()
            killed_at = time.monotonic()
            victim.stop()
            while commits(checkpoint) == before_kill:
                assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "no micro-batch after the worker was lost"
                time.sleep(0.05)
            resumed_s = time.monotonic() - killed_at
            while (last := batches_needed(checkpoint, topic, len(values))) is None or commits(
                checkpoint
            ) <= last:
                assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the cluster did not read every record"
                time.sleep(0.1)
        finally:
            driver.send_signal(signal.SIGTERM)
            driver.wait(60)
            log.close()
        assert driver.returncode == 0, (tmp_path / "driver.log").read_text()[-3000:]
    driver_log = (tmp_path / "driver.log").read_text()
    assert "Lost executor" in driver_log  # the kill did take an executor away
    print(f"worker killed after batch {before_kill}; next batch {resumed_s:.1f} s later")
    config = load_quota_config(tmp_path / "quotas.yaml")
    assert_matches_batch_recomputation(spark, checkpoint, redis_server, topic, values, config)
