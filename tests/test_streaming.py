"""The streaming query end to end: real broker (Apache Kafka), real Redis, real Spark (local)."""

from __future__ import annotations

import itertools
import json
import random
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from quotastream import Decision, QuotaClient
from quotastream.client import decision_keys
from quotastream.redis_contract import release_channel
from state.config import parse_quota_config
from state.events import parse_events
from state.live_config import Change, SetClientQuota, SetEnforcement
from streaming.engine.checkpoint_files import (
    FILE_MANAGER_KEY,
    FILE_SYSTEM_MANAGER,
    choose_file_manager,
)
from streaming.engine.config_log import ConfigLog
from streaming.engine.exporter import EngineMetrics
from streaming.engine.job import start_query
from streaming.engine.metric_names import REDIS_WRITE_FAILURES
from streaming.engine.offsets import records_read
from streaming.engine.source_status import read_status
from streaming.services import LocalService, start_redis
from tests.support.checkpoint import planned_batches
from tests.support.engine import SteadyTraffic, engine_settings, publish
from tests.support.expected import (
    assert_reads_as_unwritten,
    by_key,
    final_decisions,
    must_be_written,
)
from tests.support.factories import (
    BASE,
    MIXED_QUOTAS,
    malformed_payloads,
    mixed_payloads,
    produce,
    remote_segment,
)
from tests.support.prometheus import samples

CONFIG = parse_quota_config(MIXED_QUOTAS, "test config")


def batch_start_ms(progress: dict[str, Any]) -> int:
    return int(datetime.fromisoformat(progress["timestamp"]).timestamp() * 1000)


def dead_letters(kafka: LocalService, topic: str) -> list[dict[str, Any]]:
    consumer = KafkaConsumer(bootstrap_servers=kafka.address, consumer_timeout_ms=3000)
    partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    records = [json.loads(record.value) for record in consumer]
    consumer.close()
    return records


def test_events_in_kafka_become_decisions_in_redis(
    spark: SparkSession, kafka: LocalService, redis_server: LocalService, tmp_path: Path
) -> None:
    topic = f"events-{uuid.uuid4().hex[:8]}"
    values = mixed_payloads(7, 600, users=5)
    bad = [b"not json", b'{"kind": "produce", "bytes": -1}', b'{"kind": "teleport", "ts": 1}']
    ts = BASE + 5000
    segments = [
        json.dumps(remote_segment("orders", 3, segment_id, size, state, ts, epoch)).encode()
        for segment_id, size, state, epoch in [
            ("a", 100, "copy_finished", 0),
            ("b", 200, "copy_finished", 1),
            ("a", 100, "copy_finished", 0),  # redelivered
            ("c", 400, "delete_finished", 1),  # its copy is later, or was never seen
            ("c", 400, "copy_finished", 1),
        ]
    ]
    # The second half comes batched (docs/events.md): arrays of 50 events, and one array with two
    # bad elements among good ones.
    bad_elements = [b'{"kind": "produce", "bytes": 5}', b"42"]
    mixed_array = b"[" + b",".join([values[300], bad_elements[0], values[301], bad_elements[1]])
    batched = [mixed_array + b"]"] + [
        b"[" + b",".join(values[i : i + 50]) + b"]" for i in range(302, len(values), 50)
    ]
    messages = values[:300] + bad + segments + batched
    publish(kafka, topic, messages)
    settings = engine_settings(kafka, redis_server, tmp_path, topic)

    query = start_query(spark, settings, CONFIG, available_now=True)
    query.awaitTermination(300)
    assert query.exception() is None

    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    expected = by_key(final_decisions(values, CONFIG))
    stored: dict[str, dict[str, Any]] = {}
    for key in decision_keys(client, topic):
        value = client.get(key)
        assert isinstance(value, bytes)
        stored[key.decode()] = json.loads(value)
    assert stored.keys() <= {f"{topic}:{quota}:{entity}" for quota, entity in expected}
    for (quota, entity), want in expected.items():
        if not must_be_written(want):  # docs/redis.md: an agent reads it as a missing key
            assert_reads_as_unwritten(stored.get(f"{topic}:{quota}:{entity}"), want, CONFIG)
            continue
        got = stored[f"{topic}:{quota}:{entity}"]
        assert got["rate"] == pytest.approx(want["rate"])
        assert got["throttle_ms"] == want["throttle_ms"]
        assert got["exceeded"] == want["exceeded"]
        assert got["until"] == int(want["ts"]) + int(want["throttle_ms"])
    assert any(value["exceeded"] for value in stored.values())
    # The events are from 2023: every throttle was over when decided, so none is pending.
    throttled = [value for value in stored.values() if value["throttle_ms"] > 0]
    assert throttled
    assert all(value["released_at"] is not None for value in throttled)
    # What an enforcement point sees, through the lookup client, for each client: the final
    # decision where Redis must hold it, else no throttle (a missing key, or one that reads so).
    agent = QuotaClient.connect(redis_server.host, redis_server.port, prefix=topic, config=CONFIG)
    clients = [(e, w) for (q, e), w in expected.items() if q == "produce"]
    assert clients
    for entity, want in clients:
        user = entity.split(",")[0].removeprefix("user=")
        broker = int(entity.rsplit("=", 1)[1])
        decision = agent.for_client("produce", user=user, client_id="c", broker=broker)
        if must_be_written(want):
            assert decision is not None
            assert (decision.throttle_ms, decision.exceeded) == (
                want["throttle_ms"],
                want["exceeded"],
            )
        else:
            assert decision is None or decision.throttle_ms_now() == 0, entity
    counts = agent.timer_counts()
    assert counts.pending == 0
    assert counts.fired >= len(throttled)

    # Remote log sizes (KIP-852), in one round trip.
    remote_log = agent.remote_log("orders", 3)
    assert (remote_log.total, remote_log.size(0), remote_log.size(1), remote_log.size(7)) == (
        300,
        100,
        200,
        0,
    )
    assert [segment for segment, _, _ in remote_log.segments] == ["a", "b"]

    rejected = dead_letters(kafka, f"{topic}.dead-letter")
    assert sorted(r["reason"] for r in rejected) == [
        "invalid_json",
        "missing_field",
        "missing_field",
        "not_an_object",
        "unknown_kind",
    ]
    assert {r["payload"] for r in rejected} == {b.decode() for b in bad + bad_elements}
    assert all(r["source"]["topic"] == topic for r in rejected)
    # Each reject is found by its coordinates: publish() puts message i on partition i % 3.
    position = messages.index(batched[0])
    where = {r["payload"]: r["source"] for r in rejected}
    for index, element in ((1, bad_elements[0]), (3, bad_elements[1])):
        assert where[element.decode()] == {
            "topic": topic,
            "partition": position % 3,
            "offset": position // 3,
            "index": index,
        }
    assert all(where[b.decode()]["index"] is None for b in bad)


@pytest.mark.parametrize("kafka_down", [False, True], ids=["", "while-kafka-hangs"])
def test_a_silent_throttled_client_is_released_on_time(
    spark: SparkSession,
    kafka: LocalService,
    redis_server: LocalService,
    tmp_path: Path,
    kafka_down: bool,
) -> None:
    """Released by the timing wheel with no new event; with ``kafka_down``, the broker hangs
    from the moment the throttle is decided: releases need no Kafka, and wait for none."""
    topic = f"silent-{uuid.uuid4().hex[:8]}"
    publish(kafka, topic, [])
    config = parse_quota_config(
        {"clients": [{"user": "alice", "producer_byte_rate": 1000}]}, "test config"
    )
    settings = engine_settings(kafka, redis_server, tmp_path, topic)
    agent = QuotaClient.connect(redis_server.host, redis_server.port, prefix=topic, config=config)
    entity = agent.entity_of_client("produce", user="alice", client_id="app", broker=1)
    subscriber = redis.Redis(host=redis_server.host, port=redis_server.port)
    listener = subscriber.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    listener.subscribe(release_channel(topic, "produce", entity))

    metrics = EngineMetrics(port=0)
    query = start_query(spark, settings, config, metrics=metrics)  # runs until stopped
    producer = KafkaProducer(bootstrap_servers=kafka.address)
    outage = None
    try:
        # A first micro-batch warms Spark's workers up, so that the throttle below is decided
        # while it is still pending.
        warm_up = produce("bob", "app", 1, int(time.time() * 1000))
        producer.send(topic, json.dumps(warm_up).encode()).get(timeout=30)
        deadline = time.monotonic() + 120
        while not any(p["numInputRows"] for p in query.recentProgress) and query.isActive:
            assert time.monotonic() < deadline, "the warm-up event was not processed in 120 s"
            query.awaitTermination(1)
        # One burst of 18 kB against 1 kB/s: throttled for about 7.6 s, then silence.
        event = produce("alice", "app", 18_000, int(time.time() * 1000))
        producer.send(topic, json.dumps(event).encode()).get(timeout=30)
        if kafka_down:
            wait_for_decision(agent, entity, query, lambda d: d.throttle_ms > 0, 60)
            kafka.pause()
        notice = None
        while notice is None and time.monotonic() < deadline and query.isActive:
            notice = listener.get_message(timeout=1.0)
        heard_at = int(time.time() * 1000)
        assert notice is not None, query.exception() or "no release notice within 120 s"
        outage = read_status(metrics.source_status_file)
    finally:
        kafka.resume()
        producer.close()
        query.stop()
        metrics.close()
        listener.close()

    released = json.loads(notice["data"])
    decision = agent.lookup("produce", entity)
    assert decision is not None
    assert decision.until == event["ts"] + decision.throttle_ms
    assert decision.throttle_ms > 5000  # still pending when the engine decided it
    assert (released["reason"], released["until"]) == ("expired", decision.until)
    assert decision.released_at == released["released_at"]
    assert decision.throttle_ms_now() == 0
    if kafka_down:
        # Released while the source still found the broker unreachable.
        assert outage is not None
        assert outage.since_ms is not None
        assert outage.since_ms < released["released_at"]
    tick, trigger = settings.timers.tick_ms, settings.spark.trigger_ms
    # Released by the first micro-batch at or after the rounded expiration, with no new events:
    # one trigger interval later at most, unless the micro-batch before it ran longer than that.
    assert decision.released_at is not None
    lateness = decision.released_at - decision.until
    before = [p for p in query.recentProgress if batch_start_ms(p) < decision.until]
    longest_gap = max(trigger, before[-1]["durationMs"]["triggerExecution"])
    assert -tick < lateness <= longest_gap + tick
    read = sum(
        records_read(p["sources"][0]["startOffset"], p["sources"][0]["endOffset"], [topic])
        for p in query.recentProgress
    )
    assert read == 2  # no event after the burst
    counts = agent.timer_counts()
    assert (counts.pending, counts.fired, counts.cancelled) == (0, 1, 0)
    print(f"release {lateness} ms after until; notice heard {heard_at - decision.until} ms after")


def test_live_configuration_changes_apply_from_the_next_micro_batch(
    spark: SparkSession, kafka: LocalService, redis_server: LocalService, tmp_path: Path
) -> None:
    topic = f"live-{uuid.uuid4().hex[:8]}"
    publish(kafka, topic, [], partitions=1)
    config = parse_quota_config(
        {"clients": [{"user": "alice", "producer_byte_rate": 1000}]}, "test config"
    )
    # One stateful task per batch: the shortest micro-batches on two cores.
    settings = engine_settings(kafka, redis_server, tmp_path, topic, shuffle_partitions=1)
    assert settings.kafka.config_topic is not None
    config_log = ConfigLog(kafka.address, settings.kafka.config_topic)
    agent = QuotaClient.connect(redis_server.host, redis_server.port, prefix=topic, config=config)
    entity = agent.entity_of_client("produce", user="alice", client_id="app", broker=1)
    query = start_query(spark, settings, config)
    traffic = SteadyTraffic(kafka, topic, produce("alice", "app", 400, 0))
    traffic.start()
    try:
        # 400 B every 100 ms against 1000 B/s: throttled under the YAML quota (version 0).
        first = wait_for_decision(agent, entity, query, lambda d: d.config_version == 0, 120)
        assert (first.limit, first.mode, first.enforced) == (1000.0, "enforced", True)
        changes: list[tuple[Change, Callable[[Decision], bool]]] = [
            (
                SetClientQuota(user="alice", values={"producer_byte_rate": 50_000.0}),
                lambda d: d.limit == 50_000.0 and d.throttle_ms == 0 and d.enforced,
            ),
            (
                SetClientQuota(user="alice", values={"producer_byte_rate": 500.0}),
                lambda d: d.limit == 500.0 and d.throttle_ms > 0 and d.enforced,
            ),
            (
                SetEnforcement(shadow={"produce": True}),
                lambda d: d.mode == "shadow" and d.throttle_ms > 0 and d.throttle_ms_now() == 0,
            ),
            (SetEnforcement(enabled=False), lambda d: d.mode == "disabled"),
            (SetEnforcement(enabled=True, shadow={"produce": False}), lambda d: d.enforced),
            (SetClientQuota(user="alice", values={"exempt": True}), lambda d: d.mode == "exempt"),
        ]
        latencies = []
        appended: list[tuple[int, int]] = []  # (wall ms once appended, version)
        for change, follows in changes:
            version = config_log.append(change)
            appended_ms = int(time.time() * 1000)
            appended.append((appended_ms, version))
            changed_at = time.monotonic()
            seen: list[Decision] = []
            decision = wait_for_decision(agent, entity, query, decided_with(version), 30, seen)
            latencies.append(time.monotonic() - changed_at)
            assert follows(decision), (change, decision)
            # An event stamped after the append was read by a batch planned after it: no
            # decision that counts one may be made with an older version.
            stale = [d for d in seen if d.decided_at >= appended_ms and d.config_version < version]
            assert not stale, (version, stale[0])
    finally:
        traffic.stop()
        query.stop()
        config_log.close()
    # Each micro-batch pins the configuration log's end in its offsets as it is planned. Spark
    # stamps a batch's time once it has read its sources' ends, so a batch stamped after an
    # append may have read the log just before it; the batch after that one was planned wholly
    # after the append, and it and every later batch decide with that version or a newer one.
    # A claim about batches, not seconds: it holds on a loaded machine too.
    batches = planned_batches(Path(settings.spark.checkpoint))
    pinned = [(b.timestamp_ms, b.end_of(settings.kafka.config_topic)) for b in batches]
    followed = 0
    for appended_ms, version in appended:
        planned_after = [v for (at, _), (_, v) in itertools.pairwise(pinned) if at >= appended_ms]
        assert all(pinned_version >= version for pinned_version in planned_after), (version, pinned)
        followed += bool(planned_after)
    # Every change but the last was followed by batches planned after it: at least the one that
    # decided with the next change. The query may stop before one follows the last.
    assert followed >= len(appended) - 1, pinned
    # The wall time is the machine's (docs/redis.md gives a quiet machine's figure).
    print(f"config change to decision: {', '.join(f'{s * 1000:.0f} ms' for s in latencies)}")


def decided_with(version: int) -> Callable[[Decision], bool]:
    def check(decision: Decision) -> bool:
        return decision.config_version == version

    return check


def wait_for_decision(
    agent: QuotaClient,
    entity: str,
    query: StreamingQuery,
    wanted: Callable[[Decision], bool],
    timeout_s: float,
    seen: list[Decision] | None = None,
) -> Decision:
    """Polls the entity's decision every 20 ms until ``wanted`` holds (or fails the test);
    each decision read goes to ``seen``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert query.isActive, query.exception()
        decision = agent.lookup("produce", entity)
        if decision is not None and seen is not None:
            seen.append(decision)
        if decision is not None and wanted(decision):
            return decision
        time.sleep(0.02)
    raise AssertionError(f"no such decision within {timeout_s} s; last: {decision}")


def test_ten_thousand_malformed_messages_go_to_the_dead_letter_and_valid_ones_are_decided(
    spark: SparkSession, kafka: LocalService, redis_server: LocalService, tmp_path: Path
) -> None:
    topic = f"bad-{uuid.uuid4().hex[:8]}"
    valid = mixed_payloads(11, 2000, users=6)
    bad = malformed_payloads(12, 10_000)
    rng = random.Random(13)
    mixed = [(payload, True) for payload in valid] + [(payload, False) for payload in bad]
    rng.shuffle(mixed)
    publish(kafka, topic, [payload for payload, _ in mixed])
    settings = engine_settings(kafka, redis_server, tmp_path, topic)

    query = start_query(spark, settings, CONFIG, available_now=True)
    query.awaitTermination(600)
    assert query.exception() is None
    assert not query.isActive

    # Every bad message is in the dead letter once, with the validator's reason, found by its
    # source coordinates (publish() puts message i on partition i % 3).
    judged = parse_events(bad).rejected.sort_values("position")
    assert len(judged) == len(bad)
    reason_of = dict(zip(bad, judged["reason"].astype(str), strict=True))
    bad_at = {
        (i % 3, i // 3): reason_of[payload]
        for i, (payload, is_valid) in enumerate(mixed)
        if not is_valid
    }
    rejected = dead_letters(kafka, f"{topic}.dead-letter")
    got = {(r["source"]["partition"], r["source"]["offset"]): r["reason"] for r in rejected}
    assert len(rejected) == len(got)  # no duplicates without a replay
    assert got == bad_at
    assert set(got.values()) >= {"invalid_utf8", "too_deep", "too_large", "ts_out_of_bounds"}

    # Every valid message is decided: the final decisions are the replay core's.
    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    expected = by_key(final_decisions(valid, CONFIG))
    stored = {}
    for key in decision_keys(client, topic):
        value = client.get(key)
        assert isinstance(value, bytes)
        stored[key.decode().removeprefix(f"{topic}:")] = json.loads(value)
    assert stored.keys() <= {f"{quota}:{entity}" for quota, entity in expected}
    for (quota, entity), want in expected.items():
        if not must_be_written(want):  # docs/redis.md: an agent reads it as a missing key
            assert_reads_as_unwritten(stored.get(f"{quota}:{entity}"), want, CONFIG)
            continue
        got_value = stored[f"{quota}:{entity}"]
        assert got_value["rate"] == pytest.approx(want["rate"])
        assert got_value["throttle_ms"] == want["throttle_ms"]


#: A produce window that holds every event of an outage test (Kafka's Rate: 2 samples of 10
#: minutes): the decision's rate times its window is then every byte the engine counted. alice is
#: throttled after 6 kB.
WHOLE_TEST_CONFIG = parse_quota_config(
    {
        "quota_types": {"produce": {"samples": 2, "window_ms": 600_000}},
        "clients": [{"user": "alice", "producer_byte_rate": 10}],
    },
    "test config",
)


def counted_bytes(decision: Decision) -> int:
    """The bytes in the decision's window (its rate over its window size)."""
    return round(decision.rate * decision.window_ms / 1000)


def wait_until_every_event_is_counted(
    agent: QuotaClient, entity: str, query: StreamingQuery, traffic: SteadyTraffic, nbytes: int
) -> Decision:
    """Once ``traffic`` has stopped: the decision that counts all it published, no more."""
    published = traffic.acked * nbytes
    decision = wait_for_decision(agent, entity, query, lambda d: counted_bytes(d) >= published, 60)
    assert counted_bytes(decision) == published, (traffic.acked, decision)
    return decision


def test_a_redis_outage_stalls_the_query_and_every_event_is_decided_after_it(
    spark: SparkSession, kafka: LocalService, tmp_path: Path
) -> None:
    topic = f"outage-{uuid.uuid4().hex[:8]}"
    publish(kafka, topic, [], partitions=1)
    config = WHOLE_TEST_CONFIG
    own_redis = start_redis()
    port = own_redis.port
    settings = engine_settings(kafka, own_redis, tmp_path, topic, shuffle_partitions=1)
    metrics = EngineMetrics(port=0)
    query = start_query(spark, settings, config, metrics=metrics)
    traffic = SteadyTraffic(kafka, topic, produce("alice", "app", 400, 0))
    traffic.start()
    returned: LocalService | None = None
    try:
        agent = QuotaClient.connect("127.0.0.1", port, prefix=topic, config=config, timeout_s=1)
        entity = agent.entity_of_client("produce", user="alice", client_id="app", broker=1)
        wait_for_decision(agent, entity, query, lambda d: d.throttle_ms > 0, 120)
        batches_before = len(query.recentProgress)

        own_redis.stop()
        outage_end = time.monotonic() + OUTAGE_S
        while time.monotonic() < outage_end:
            assert query.isActive, query.exception()  # waits, does not fail or restart
            time.sleep(1)
        returned = start_redis(port=port)
        back_at, back_ms = time.monotonic(), int(time.time() * 1000)

        # Caught up: a decision that counts the events published while Redis was down.
        caught_up = wait_for_decision(
            agent, entity, query, lambda d: d.decided_at >= back_ms - 1000, 30
        )
        seen_ms = int(time.time() * 1000)
        print(f"decisions caught up {time.monotonic() - back_at:.2f} s after Redis returned")
        assert caught_up.throttle_ms > 0
        # Counted in batches, not seconds: the stalled batch's write goes through, and the next
        # batch, planned after Redis returned, decides the events of the outage (one more may
        # be planned while the decision is looked up).
        planned = planned_batches(Path(settings.spark.checkpoint))
        after = [b.batch_id for b in planned if back_ms <= b.timestamp_ms <= seen_ms]
        assert 1 <= len(after) <= 2, (back_ms, seen_ms, planned)
        # Stalled, not failing: few batches ran during the outage, and none was retried.
        assert len(query.recentProgress) - batches_before <= 3
        # Every event, those of the outage too, counted once: the rate alone would not tell (it
        # saturates), the bytes in the window do.
        traffic.stop()
        wait_until_every_event_is_counted(agent, entity, query, traffic, 400)
        failures = samples(metrics.scrape(), REDIS_WRITE_FAILURES)[""]
        # Retried all along (an attempt every max_backoff_ms, 0.5 s, once the backoff has grown),
        # not given up after a few attempts.
        assert failures >= OUTAGE_S
    finally:
        traffic.stop()
        query.stop()
        metrics.close()
        if returned is not None:
            returned.stop()


#: How long the test above keeps Redis down.
OUTAGE_S = 15


def test_a_redis_outage_past_max_outage_fails_the_query_and_a_restart_resumes_exactly(
    spark: SparkSession, kafka: LocalService, tmp_path: Path
) -> None:
    topic = f"outage-exit-{uuid.uuid4().hex[:8]}"
    publish(kafka, topic, [], partitions=1)
    config = WHOLE_TEST_CONFIG
    own_redis = start_redis()
    port = own_redis.port
    settings = engine_settings(kafka, own_redis, tmp_path, topic, shuffle_partitions=1)
    settings = settings.model_copy(
        update={"redis": settings.redis.model_copy(update={"max_outage_s": 3.0})}
    )
    query = start_query(spark, settings, config)
    traffic = SteadyTraffic(kafka, topic, produce("alice", "app", 400, 0))
    traffic.start()
    returned: LocalService | None = None
    try:
        agent = QuotaClient.connect("127.0.0.1", port, prefix=topic, config=config, timeout_s=1)
        entity = agent.entity_of_client("produce", user="alice", client_id="app", broker=1)
        wait_for_decision(agent, entity, query, lambda d: d.throttle_ms > 0, 120)

        own_redis.stop()
        # The batch that cannot write gives up after max_outage_s: the query fails (what makes
        # `quotastream run` exit 1), naming Redis and the limit.
        with pytest.raises(StreamingQueryException) as failed:
            query.awaitTermination(120)
        reason = f"Redis 127.0.0.1:{port} unreachable for more than 3 s"
        assert reason in str(failed.value), failed.value

        # Restarted from its checkpoint against a Redis that lost everything: every event,
        # before, during and after the outage, counted once.
        returned = start_redis(port=port)
        query = start_query(spark, settings, config)
        traffic.stop()
        wait_until_every_event_is_counted(agent, entity, query, traffic, 400)
    finally:
        traffic.stop()
        query.stop()
        if returned is not None:
            returned.stop()


def test_a_local_checkpoint_is_written_through_hadoops_file_system_api(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Spark's default file manager runs ``readlink`` and ``chmod`` processes for each local
    checkpoint file (streaming/engine/checkpoint_files.py); other file systems keep it."""
    local = str(tmp_path / "checkpoint")
    assert choose_file_manager(spark, local, {}) == FILE_SYSTEM_MANAGER
    assert spark.conf.get(FILE_MANAGER_KEY) == FILE_SYSTEM_MANAGER
    assert choose_file_manager(spark, (tmp_path / "elsewhere").as_uri(), {}) == FILE_SYSTEM_MANAGER
    # A query on HDFS after a local one in the same session gets Spark's own choice back.
    assert choose_file_manager(spark, "hdfs://namenode:8020/checkpoint", {}) is None
    assert spark.conf.get(FILE_MANAGER_KEY, None) is None
    operators = {FILE_MANAGER_KEY: "com.example.TheirManager"}
    assert choose_file_manager(spark, local, operators) == "com.example.TheirManager"
    assert spark.conf.get(FILE_MANAGER_KEY, None) is None
