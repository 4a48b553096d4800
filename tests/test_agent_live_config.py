"""Agents resolve clients with the live configuration the engine publishes, without a restart:
the publication (``quotastream/published_config.py``) against a real Redis, then a running
engine (real Apache Kafka, Redis and Spark) and a live ``quota set``."""

from __future__ import annotations

import json
import logging
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
import redis
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from quotastream import Answer, CachedQuotaClient, CacheSettings, Decision, QuotaClient, Source
from quotastream.published_config import publish
from quotastream.redis_contract import live_config_key, live_config_version_key
from state.config import parse_quota_config
from state.live_config import (
    LiveConfig,
    LiveConfigs,
    SetClientQuota,
    apply_change,
    config_document,
    encode_change,
)
from streaming.commands.cli import main
from streaming.engine.job import start_query
from streaming.engine.sinks import SinkSettings, write_batches
from streaming.engine.stages import DECISION_SCHEMA
from streaming.services import LocalService
from tests.support.admin import write_settings
from tests.support.agents import FakeClock
from tests.support.engine import SteadyTraffic, engine_settings
from tests.support.engine import publish as publish_events
from tests.support.factories import decision_row, produce

#: alice's clients share one counter (a user quota) in the static file.
STATIC = parse_quota_config(
    {"clients": [{"user": "alice", "producer_byte_rate": 1000}]}, "static quota file"
)
#: The live change: app1 gets a quota of its own, so it counts on a counter of its own.
OWN_QUOTA = SetClientQuota(user="alice", client_id="app1", values={"producer_byte_rate": 500.0})
SHARED = "user=alice,broker=1"
OWN = "user=alice,client-id=app1,broker=1"


def new_prefix() -> str:
    return f"live-{uuid.uuid4().hex[:8]}"


def write(
    service: LocalService, prefix: str, rows: list[dict[str, object]], **sink: object
) -> SinkSettings:
    settings = SinkSettings.local(service.host, service.port, key_prefix=prefix, **sink)
    batch = pa.RecordBatch.from_pylist(rows, schema=DECISION_SCHEMA)
    (counts,) = write_batches(iter([batch]), settings)
    assert counts.to_pylist()[0]["decisions"] == len(rows)
    return settings


def published(admin: redis.Redis, prefix: str) -> tuple[dict[str, object], dict[str, object]]:
    """The published version and document, as Redis holds them."""
    version, document = (
        admin.get(live_config_version_key(prefix)),
        admin.get(live_config_key(prefix)),
    )
    assert isinstance(version, bytes)
    assert isinstance(document, bytes)
    return json.loads(version), json.loads(document)


def test_the_sink_publishes_the_newest_version_its_decisions_were_made_with(
    redis_server: LocalService,
) -> None:
    prefix = new_prefix()
    admin = redis.Redis(host=redis_server.host, port=redis_server.port)
    records = [encode_change(OWN_QUOTA)]
    versions = LiveConfigs(STATIC, lambda start, end: records[start:end])
    now = int(time.time() * 1000)

    sink = write(
        redis_server, prefix, [decision_row(SHARED, now, 0, config_version=0)], configs=versions
    )
    version, document = published(admin, prefix)
    assert version == {"run": sink.run, "version": 0}
    assert document == {"run": sink.run, "version": 0, "config": config_document(STATIC)}

    settings = {"configs": versions, "run": sink.run}
    write(redis_server, prefix, [decision_row(OWN, now, 0, config_version=1)], **settings)
    version, document = published(admin, prefix)
    assert version == {"run": sink.run, "version": 1}
    assert parse_quota_config(document["config"], "published") == versions.at(1).config  # type: ignore[arg-type]

    # A throttle released by a timer set under version 0: the newer version stays.
    released = decision_row(SHARED, now, 0, config_version=0) | {
        "released_at": now,
        "notice": "expired",
    }
    write(redis_server, prefix, [released], **settings)
    assert published(admin, prefix)[0] == {"run": sink.run, "version": 1}

    # A new run (a restart, perhaps with another quota file) replaces it, whatever its version.
    restarted = write(
        redis_server, prefix, [decision_row(SHARED, now, 0, config_version=0)], configs=versions
    )
    assert published(admin, prefix)[0] == {"run": restarted.run, "version": 0}

    # Without configuration versions (tests, benchmarks) nothing is published.
    other = new_prefix()
    write(redis_server, other, [decision_row(SHARED, now, 0, config_version=0)])
    assert admin.exists(live_config_version_key(other), live_config_key(other)) == 0


def test_a_run_never_replaces_its_own_newer_version(redis_server: LocalService) -> None:
    prefix = new_prefix()
    admin = redis.Redis(host=redis_server.host, port=redis_server.port)
    live = LiveConfig(0, STATIC).advanced([encode_change(OWN_QUOTA)])
    assert publish(admin, prefix, live, "run-a")
    assert not publish(admin, prefix, LiveConfig(0, STATIC), "run-a")
    assert published(admin, prefix)[0] == {"run": "run-a", "version": 1}
    admin.set(live_config_version_key(prefix), "not a version")  # another program's value
    assert publish(admin, prefix, LiveConfig(0, STATIC), "run-a")
    assert published(admin, prefix)[0] == {"run": "run-a", "version": 0}


def test_a_running_agent_follows_each_published_version_and_the_static_file_without_one(
    redis_server: LocalService,
) -> None:
    prefix = new_prefix()
    admin = redis.Redis(host=redis_server.host, port=redis_server.port)
    now = int(time.time() * 1000)
    write(redis_server, prefix, [decision_row(SHARED, now, 60_000), decision_row(OWN, now, 0)])
    clock = FakeClock()
    agent = CachedQuotaClient.connect(
        redis_server.host,
        redis_server.port,
        prefix,
        STATIC,
        CacheSettings(max_staleness_ms=1_000),
        clock=clock,
    )
    plain = QuotaClient.connect(redis_server.host, redis_server.port, prefix, STATIC)

    def answered() -> str | None:
        answer = agent.for_client("produce", user="alice", client_id="app1", broker=1)
        return None if answer.decision is None else answer.decision.entity

    # Nothing published: the static file.
    assert (answered(), agent.client.config_version) == (SHARED, None)
    decision = plain.for_client("produce", user="alice", client_id="app1", broker=1)
    assert decision is not None
    assert (decision.entity, plain.config_version) == (SHARED, None)

    publish(admin, prefix, LiveConfig(0, STATIC).advanced([encode_change(OWN_QUOTA)]), "run")
    # The plain client follows on its next lookup; the cached one within max_staleness_ms.
    decision = plain.for_client("produce", user="alice", client_id="app1", broker=1)
    assert decision is not None
    assert (decision.entity, plain.config_version) == (OWN, 1)
    clock.advance_ms(999)
    assert answered() == SHARED  # its entity and decision, from memory
    clock.advance_ms(1)
    assert (answered(), agent.client.config_version) == (OWN, 1)
    assert agent.for_client("produce", "alice", "app2", 1).decision is not None  # still SHARED

    # Back to one counter per user (version 2), then app1's own again (version 3).
    publish(admin, prefix, LiveConfig(2, STATIC), "run")
    clock.advance_ms(1_000)
    assert (answered(), agent.client.config_version) == (SHARED, 2)
    publish(admin, prefix, LiveConfig(3, apply_change(STATIC, OWN_QUOTA)), "run")
    clock.advance_ms(1_000)
    assert (answered(), agent.client.config_version) == (OWN, 3)

    # Nothing published any more (a flushed Redis): the static file again.
    admin.delete(live_config_version_key(prefix), live_config_key(prefix))
    clock.advance_ms(1_000)
    assert (answered(), agent.client.config_version) == (SHARED, None)


def test_a_published_configuration_that_is_not_one_is_counted_logged_once_and_ignored(
    redis_server: LocalService, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = new_prefix()
    admin = redis.Redis(host=redis_server.host, port=redis_server.port)
    now = int(time.time() * 1000)
    write(redis_server, prefix, [decision_row(SHARED, now, 0), decision_row(OWN, now, 0)])
    clock = FakeClock()
    agent = CachedQuotaClient.connect(
        redis_server.host, redis_server.port, prefix, STATIC, clock=clock
    )
    publish(admin, prefix, LiveConfig(0, STATIC).advanced([encode_change(OWN_QUOTA)]), "run")
    answer = agent.for_client("produce", "alice", "app1", 1)
    assert answer.decision is not None
    assert answer.decision.entity == OWN
    caplog.set_level(logging.WARNING, logger="quotastream.cache")

    document = {"run": "run", "version": 2, "config": {"clients": [{"user": ""}]}}
    admin.set(live_config_version_key(prefix), json.dumps({"run": "run", "version": 2}))
    admin.set(live_config_key(prefix), json.dumps(document))
    for _ in range(2):
        clock.advance_ms(1_000)
        answer = agent.for_client("produce", "alice", "app1", 1)
        # Resolved as before, answered from Redis (which itself answered).
        assert (answer.source, agent.client.config_version, agent.redis_up) == (
            Source.FRESH,
            1,
            True,
        )
        assert answer.decision is not None
        assert answer.decision.entity == OWN
    admin.set(live_config_version_key(prefix), b"\x00garbage")
    clock.advance_ms(1_000)
    assert agent.for_client("produce", "alice", "app1", 1).decision is not None
    assert agent.corrupt_values == 3
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 1, messages
    assert messages[0].startswith(f"{live_config_key(prefix)} does not hold a quotastream value")
    assert "resolving clients as before" in messages[0]


def test_a_running_agent_follows_a_live_quota_set_without_a_restart(
    spark: SparkSession, kafka: LocalService, redis_server: LocalService, tmp_path: Path
) -> None:
    topic = new_prefix()
    publish_events(kafka, topic, [], partitions=1)
    # One stateful task per batch: the shortest micro-batches on two cores.
    settings = engine_settings(kafka, redis_server, tmp_path, topic, shuffle_partitions=1)
    config_topic = settings.kafka.config_topic
    # The operator's command line, on the engine's configuration topic and Redis prefix.
    engine_file, _ = write_settings(
        tmp_path,
        kafka.address,
        (redis_server.host, redis_server.port),
        config_topic,
        quotas=config_document(STATIC),
        redis={"key_prefix": topic},
    )
    cache = CacheSettings()  # what an agent runs with: max_staleness_ms 1000
    agent = CachedQuotaClient.connect(redis_server.host, redis_server.port, topic, STATIC, cache)
    admin = redis.Redis(host=redis_server.host, port=redis_server.port)
    query = start_query(spark, settings, STATIC)
    traffic = SteadyTraffic(kafka, topic, produce("alice", "app1", 400, 0))
    traffic.start()
    try:
        before = wait_for_answer(agent, query, 120)
        assert (before.entity, before.config_version) == (SHARED, 0)
        argv = ["quota", "set", "--user", "alice", "--client-id", "app1", "producer_byte_rate=500"]
        assert main([*argv, "--engine-config", str(engine_file)]) == 0
        changed_at = time.monotonic()
        # When the engine's first decision under version 1 is in Redis, and when the agent
        # answers with it.
        written_at = None
        answer: Answer | None = None
        deadline = changed_at + 30
        while True:
            assert time.monotonic() < deadline, f"the agent still answers {answer} after 30 s"
            assert query.isActive, query.exception()
            if written_at is None and admin.exists(f"{topic}:produce:{OWN}"):
                written_at = time.monotonic()
            answer = agent.for_client("produce", user="alice", client_id="app1", broker=1)
            if answer.decision is not None and answer.decision.entity == OWN:
                break
            time.sleep(0.02)
        followed_at = time.monotonic()
        if written_at is None:  # written between the two reads
            written_at = followed_at
    finally:
        traffic.stop()
        query.stop()
    assert (answer.decision.config_version, answer.decision.limit) == (1, 500.0)
    assert agent.client.config_version == 1
    engine_s, agent_s = written_at - changed_at, followed_at - written_at
    print(
        f"quota set -> the engine wrote the new key in {engine_s * 1000:.0f} ms, "
        f"the agent read it {agent_s * 1000:.0f} ms later"
    )
    # As late as it sees any decision the engine writes: its staleness bound (and polling).
    assert agent_s <= cache.max_staleness_ms / 1000 + 0.3


def wait_for_answer(agent: CachedQuotaClient, query: StreamingQuery, timeout_s: float) -> Decision:
    """The first decision the agent answers for alice's app1."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert query.isActive, query.exception()
        answer = agent.for_client("produce", user="alice", client_id="app1", broker=1)
        if answer.decision is not None:
            return answer.decision
        time.sleep(0.02)
    raise AssertionError(f"no decision within {timeout_s} s")
