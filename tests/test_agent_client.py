"""The agents' cached client and the Redis ACL users, against a real Redis (no mocks)."""

from __future__ import annotations

import logging
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import redis
from prometheus_client import CollectorRegistry

from quotastream import CachedQuotaClient, CacheSettings, FailurePolicy, QuotaClient, Source
from quotastream.acl import (
    AGENT_USER,
    ENGINE_USER,
    agent_acl,
    engine_acl,
    set_user,
    setuser_command,
)
from quotastream.redis_contract import live_config_key, live_config_version_key, release_channel
from state.live_config import ConfigVersions, LiveConfigs, SetClientQuota, encode_change
from streaming.commands.exit_codes import EXIT_USAGE
from streaming.engine.sinks import SinkSettings, write_batches
from streaming.engine.stages import DECISION_SCHEMA
from streaming.services import LocalService, start_redis
from tests.support.agents import CONFIG, FakeClock
from tests.support.factories import decision_row

PREFIX = "agents"
ENTITY = "user=alice,broker=1"


def write(
    service: LocalService,
    rows: list[dict[str, object]],
    username: str | None = None,
    password: str | None = None,
    configs: ConfigVersions | None = None,
) -> None:
    sink = SinkSettings(
        redis={
            "host": service.host,
            "port": service.port,
            "username": username,
            "password": password,
        },
        key_prefix=PREFIX,
        configs=configs,
    )
    batch = pa.RecordBatch.from_pylist(rows, schema=DECISION_SCHEMA)
    (counts,) = write_batches(iter([batch]), sink)
    assert counts.to_pylist() == [{"decisions": len(rows), "rejects": 0}]


def get_calls(admin: redis.Redis) -> int:
    """How many GETs the server ran (``INFO commandstats``): round trips, counted server-side."""
    stats = admin.info("commandstats")
    assert isinstance(stats, dict)
    return int(stats.get("cmdstat_get", {"calls": 0})["calls"])


def cached(
    service: LocalService,
    clock: FakeClock,
    registry: CollectorRegistry | None = None,
    **settings: Any,
) -> CachedQuotaClient:
    return CachedQuotaClient.connect(
        service.host,
        service.port,
        PREFIX,
        CONFIG,
        CacheSettings(**settings),
        registry=registry,
        clock=clock,
    )


def test_a_client_is_resolved_by_the_quota_rules_alone_without_redis_or_the_engine_core() -> None:
    # Nothing listens on port 1: a round trip would raise ConnectionError.
    client = QuotaClient(redis.Redis(host="127.0.0.1", port=1), PREFIX, CONFIG)
    assert client.entity_of_client("produce", "alice", "app1", 1) == ENTITY
    assert client.entity_of_client("fetch", "bob", "", 7) == "client-id=,broker=7"
    for quota, user, broker, problem in [
        ("remote_copy", "alice", 1, "'remote_copy' is not a client quota"),
        ("produce", "", 1, "user must not be empty"),
        ("produce", "alice", -1, "broker -1 is not a broker id"),
    ]:
        with pytest.raises(ValueError, match=problem):
            client.entity_of_client(quota, user, "app1", broker)
    # An agent resolving one client once ran the whole pandas core on a parsed event (8.8 ms).
    engine = ["state.core", "state.events", "state.resolution"]
    script = f"import sys, quotastream; print([m for m in {engine} if m in sys.modules])"
    loaded = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert loaded.stdout.strip() == "[]"


def test_a_recent_decision_is_answered_from_the_cache_without_a_round_trip(
    redis_server: LocalService,
) -> None:
    now = int(time.time() * 1000)
    write(redis_server, [decision_row(ENTITY, now, 60_000)])
    admin = redis.Redis(host=redis_server.host, port=redis_server.port)
    clock = FakeClock()
    client = cached(redis_server, clock, max_staleness_ms=500)

    before = get_calls(admin)
    fresh = client.for_client("produce", user="alice", client_id="app1", broker=1)
    assert (fresh.source, fresh.age_ms, fresh.stale) == (Source.FRESH, 0, False)
    assert fresh.decision is not None
    assert fresh.decision.entity == ENTITY
    assert 50_000 < fresh.throttle_ms <= 60_000
    # The decision, and the published configuration's version (at most once per bound).
    assert get_calls(admin) == before + 2

    clock.advance_ms(499)
    hit = client.for_client("produce", user="alice", client_id="other", broker=1)
    assert (hit.source, hit.age_ms, hit.stale, hit.decision) == (
        Source.CACHED,
        499,
        False,
        fresh.decision,
    )
    assert get_calls(admin) == before + 2  # no round trip

    clock.advance_ms(1)  # the bound reached: read again
    again = client.lookup("produce", ENTITY)
    assert again.source is Source.FRESH
    assert get_calls(admin) == before + 3

    # No key is an answer too (not throttled), and is cached like one.
    absent = client.lookup("produce", "user=nobody,broker=1")
    assert (absent.source, absent.decision, absent.throttle_ms) == (Source.FRESH, None, 0)
    assert client.lookup("produce", "user=nobody,broker=1").source is Source.CACHED
    assert get_calls(admin) == before + 4


def test_a_stopped_redis_fails_open_at_once_logs_once_and_recovers_on_the_same_port(
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = start_redis()
    clock = FakeClock()
    registry = CollectorRegistry()
    timeout_ms, backoff_ms = 200, 1_000
    client = cached(
        service,
        clock,
        registry,
        max_staleness_ms=100,
        fail_open_staleness_ms=5_000,
        timeout_ms=timeout_ms,
        backoff_ms=backoff_ms,
    )
    now = int(time.time() * 1000)
    write(service, [decision_row(ENTITY, now, 60_000)])
    assert client.lookup("produce", ENTITY).source is Source.FRESH
    port = service.port
    service.stop()
    caplog.set_level(logging.WARNING, logger="quotastream.cache")

    # A cached decision past max_staleness but within the fail-open bound: answered, flagged stale.
    clock.advance_ms(1_000)
    began = time.monotonic()
    stale = client.lookup("produce", ENTITY)
    assert time.monotonic() - began < timeout_ms / 1000 + 0.5
    assert (stale.source, stale.age_ms, stale.stale) == (Source.STALE, 1_000, True)
    assert 50_000 < stale.throttle_ms <= 60_000
    assert (client.errors, client.redis_up) == (1, False)

    # Nothing cached: fail open, without trying Redis again within the backoff. Counted, not
    # timed: no attempt means no error added and each lookup skipped (a timing bound flakes on a
    # loaded machine; docs/agents.md gives the measured figures).
    for _ in range(100):
        answer = client.lookup("produce", "user=bob,broker=1")
        assert (answer.source, answer.throttle_ms, answer.decision) == (Source.FAIL_OPEN, 0, None)
    assert (client.errors, client.skipped) == (1, 100)

    # The cached entry beyond the fail-open bound: the policy answers.
    clock.advance_ms(5_000)
    began = time.monotonic()
    assert client.lookup("produce", ENTITY).source is Source.FAIL_OPEN  # one retry, refused
    assert time.monotonic() - began < timeout_ms / 1000 + 0.5
    assert client.errors == 2
    assert registry.get_sample_value("quotastream_agent_redis_errors_total") == 2
    assert registry.get_sample_value("quotastream_agent_redis_up") == 0

    # Back where clients expect it; a port that cannot be reused fails the test.
    with start_redis(port=port):
        write(service, [decision_row(ENTITY, now, 30_000)])
        assert client.lookup("produce", ENTITY).source is Source.FAIL_OPEN  # still backing off
        clock.advance_ms(backoff_ms)
        recovered = client.lookup("produce", ENTITY)
        assert (recovered.source, client.redis_up) == (Source.FRESH, True)
        assert recovered.decision is not None
        assert recovered.decision.throttle_ms == 30_000
        assert registry.get_sample_value("quotastream_agent_redis_up") == 1
        assert registry.get_sample_value("quotastream_agent_answers_total", {"source": "fresh"})

    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2, messages  # one line when Redis went down, one when it came back
    assert "unreachable" in messages[0]
    assert "failing open" in messages[0]
    assert "reachable again" in messages[1]


def test_a_hung_redis_answers_within_the_timeout_and_fail_closed_delays() -> None:
    with start_redis() as service:
        clock = FakeClock()
        timeout_ms = 150
        client = cached(
            service,
            clock,
            timeout_ms=timeout_ms,
            failure_policy=FailurePolicy.CLOSED,
            fail_closed_delay_ms=750,
        )
        assert client.lookup("produce", ENTITY).source is Source.FRESH
        service.process.send_signal(signal.SIGSTOP)  # accepts connections, never answers
        try:
            began = time.monotonic()
            answer = client.lookup("produce", "user=bob,broker=1")
            elapsed = time.monotonic() - began
            assert (answer.source, answer.throttle_ms, answer.stale) == (
                Source.FAIL_CLOSED,
                750,
                True,
            )
            assert timeout_ms / 1000 * 0.9 <= elapsed < timeout_ms / 1000 + 0.5
        finally:
            service.process.send_signal(signal.SIGCONT)
        clock.advance_ms(client.settings.backoff_ms)
        assert client.lookup("produce", "user=bob,broker=1").source is Source.FRESH


@pytest.mark.parametrize("policy", [FailurePolicy.OPEN, FailurePolicy.CLOSED])
def test_a_value_that_is_not_a_decision_is_a_failed_read_counted_and_logged_once_per_key(
    redis_server: LocalService, caplog: pytest.LogCaptureFixture, policy: FailurePolicy
) -> None:
    admin = redis.Redis(host=redis_server.host, port=redis_server.port)
    clock, registry = FakeClock(), CollectorRegistry()
    client = cached(
        redis_server,
        clock,
        registry,
        max_staleness_ms=100,
        fail_open_staleness_ms=1_000,
        failure_policy=policy,
        fail_closed_delay_ms=750,
    )
    now = int(time.time() * 1000)
    write(redis_server, [decision_row(ENTITY, now, 60_000)])
    first = client.lookup("produce", ENTITY)
    assert first.source is Source.FRESH
    caplog.set_level(logging.WARNING, logger="quotastream.cache")
    key = f"{PREFIX}:produce:{ENTITY}"
    # Another program's value, then one cut short, then a decision of another entity.
    foreign = [b"OK", b'{"quota": "produce", "entity": "user=alice,br', b'{"a": [1, 2]}']
    write(redis_server, [decision_row("user=bob,broker=1", now, 1)])
    bob = admin.get(f"{PREFIX}:produce:user=bob,broker=1")
    assert isinstance(bob, bytes)
    policy_answer = Source.FAIL_OPEN if policy is FailurePolicy.OPEN else Source.FAIL_CLOSED
    for value in [*foreign, bob]:
        admin.set(key, value)
        clock.advance_ms(100)  # past max_staleness, within fail_open_staleness: the cache answers
        stale = client.lookup("produce", ENTITY)
        assert (stale.source, stale.decision) == (Source.STALE, first.decision)
    clock.advance_ms(1_000)  # and now nothing recent is cached: the policy answers
    answer = client.lookup("produce", ENTITY)
    assert (answer.source, answer.decision) == (policy_answer, None)
    assert answer.throttle_ms == (0 if policy is FailurePolicy.OPEN else 750)
    assert client.corrupt_values == 5
    assert registry.get_sample_value("quotastream_agent_corrupt_values_total") == 5
    assert (client.errors, client.redis_up) == (0, True)  # Redis itself answered every time
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 1, messages
    assert messages[0].startswith(f"{key} does not hold a quotastream value: ")

    # A decision again: answered, and a later corruption of the key is logged again.
    write(redis_server, [decision_row(ENTITY, now, 30_000)])
    clock.advance_ms(100)
    fresh = client.lookup("produce", ENTITY)
    assert fresh.source is Source.FRESH
    assert fresh.decision is not None
    assert fresh.decision.throttle_ms == 30_000
    admin.set(key, b"garbage")
    clock.advance_ms(100)
    assert client.lookup("produce", ENTITY).source is Source.STALE
    assert len(caplog.records) == 2


@pytest.fixture
def acl_server() -> Iterator[tuple[LocalService, redis.Redis]]:
    """A dedicated Redis with an admin user, the engine user and an agent user."""
    with start_redis() as service:
        bootstrap = redis.Redis(host=service.host, port=service.port)
        set_user(bootstrap, "admin", ["on", ">admin", "~*", "&*", "+@all"])
        admin = redis.Redis(
            host=service.host, port=service.port, username="admin", password="admin"
        )
        set_user(admin, ENGINE_USER, engine_acl(PREFIX, "engine-pw"))
        set_user(admin, AGENT_USER, agent_acl(PREFIX, "agent-pw"))
        # Nobody else: the default user is switched off.
        set_user(admin, "default", ["off"])
        yield service, admin


def test_the_agent_user_reads_and_subscribes_but_cannot_write(
    acl_server: tuple[LocalService, redis.Redis],
) -> None:
    service, admin = acl_server
    admin.set(f"{PREFIX}:produce:{ENTITY}", "{}")
    agent = redis.Redis(
        host=service.host, port=service.port, username=AGENT_USER, password="agent-pw"
    )
    assert agent.get(f"{PREFIX}:produce:{ENTITY}") == b"{}"
    assert agent.mget([f"{PREFIX}:produce:{ENTITY}", f"{PREFIX}:x"]) == [b"{}", None]
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.set(f"{PREFIX}:produce:{ENTITY}", "forged")
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.delete(f"{PREFIX}:produce:{ENTITY}")
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.get("elsewhere:key")  # outside the prefix, not even readable
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.publish(release_channel(PREFIX, "produce", ENTITY), "forged notice")

    pubsub = agent.pubsub(ignore_subscribe_messages=False)  # type: ignore[no-untyped-call]
    pubsub.subscribe(release_channel(PREFIX, "produce", ENTITY))
    confirmation = pubsub.get_message(timeout=5)
    assert confirmation is not None
    assert confirmation["type"] == "subscribe"
    pubsub.close()
    refused = agent.pubsub()  # type: ignore[no-untyped-call]
    refused.subscribe("elsewhere:released:produce:x")
    with pytest.raises(redis.exceptions.NoPermissionError):
        refused.get_message(timeout=5)
    refused.close()


def test_the_engine_writes_its_prefix_only_and_the_agent_client_reads_it(
    acl_server: tuple[LocalService, redis.Redis],
) -> None:
    service, admin = acl_server
    engine = redis.Redis(
        host=service.host, port=service.port, username=ENGINE_USER, password="engine-pw"
    )
    assert engine.set(f"{PREFIX}:produce:probe", "1")
    assert engine.publish(release_channel(PREFIX, "produce", "probe"), "{}") == 0
    with pytest.raises(redis.exceptions.NoPermissionError):
        engine.set("elsewhere:produce:probe", "1")
    with pytest.raises(redis.exceptions.NoPermissionError):
        engine.publish("elsewhere:released:produce:probe", "{}")
    with pytest.raises(redis.exceptions.NoPermissionError):
        engine.flushall()
    with pytest.raises(redis.exceptions.NoPermissionError):
        engine.keys("*")

    # The engine's own sink, as the engine user (redis.username / redis.password).
    now = int(time.time() * 1000)
    released = decision_row(ENTITY, now, 60_000) | {"released_at": now + 5, "notice": "released"}
    write(
        service,
        [decision_row("user=bob,broker=1", now, 60_000), released],
        username=ENGINE_USER,
        password="engine-pw",
    )
    assert admin.get(f"{PREFIX}:produce:user=bob,broker=1") is not None

    # The lookup client, as the agent user.
    client = QuotaClient.connect(
        service.host, service.port, PREFIX, CONFIG, username=AGENT_USER, password="agent-pw"
    )
    decision = client.for_client("produce", user="alice", client_id="app1", broker=1)
    assert decision is not None
    assert decision.released_at == now + 5
    waited = client.wait_until_released("produce", "user=bob,broker=1", timeout_s=0.2)
    assert waited is not None
    assert waited.throttle_ms_now() > 0
    cached_client = CachedQuotaClient.connect(
        service.host, service.port, PREFIX, CONFIG, username=AGENT_USER, password="agent-pw"
    )
    answer = cached_client.lookup("produce", "user=bob,broker=1")
    assert answer.source is Source.FRESH
    assert answer.throttle_ms > 50_000


def test_the_engine_user_publishes_the_live_configuration_and_the_agent_user_follows_it(
    acl_server: tuple[LocalService, redis.Redis],
) -> None:
    service, _ = acl_server
    own = SetClientQuota(user="alice", client_id="app1", values={"producer_byte_rate": 50.0})
    records = [encode_change(own)]
    versions = LiveConfigs(CONFIG, lambda start, end: records[start:end])
    own_entity = "user=alice,client-id=app1,broker=1"
    now = int(time.time() * 1000)
    row = decision_row(own_entity, now, 60_000, config_version=1)
    write(service, [row], username=ENGINE_USER, password="engine-pw", configs=versions)

    client = QuotaClient.connect(
        service.host, service.port, PREFIX, CONFIG, username=AGENT_USER, password="agent-pw"
    )
    decision = client.for_client("produce", user="alice", client_id="app1", broker=1)
    assert decision is not None
    assert (decision.entity, client.config_version) == (own_entity, 1)
    agent = redis.Redis(
        host=service.host, port=service.port, username=AGENT_USER, password="agent-pw"
    )
    for key in (live_config_version_key(PREFIX), live_config_key(PREFIX)):
        with pytest.raises(redis.exceptions.NoPermissionError):
            agent.set(key, "forged")


def test_the_documented_acl_lines_are_the_ones_tested() -> None:
    docs = (Path(__file__).parents[1] / "docs" / "agents.md").read_text()
    assert setuser_command(ENGINE_USER, engine_acl("quotastream", "engine-secret")) in docs
    assert setuser_command(AGENT_USER, agent_acl("quotastream", "agent-secret")) in docs


# What an agent's base install lacks (the engine extra in pyproject.toml), by import name.
ENGINE_ONLY_MODULES = (
    "pyspark",
    "kafka",
    "crc32c",
    "numpy",
    "pandas",
    "pyarrow",
    "pydantic_settings",
    "rich",
    "matplotlib",
)


def python(script: str) -> subprocess.CompletedProcess[str]:
    """``script`` in a fresh interpreter at the project root: nothing imported by the tests."""
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parent.parent,
    )


def test_importing_the_agent_package_loads_no_engine_package() -> None:
    # pandas, numpy, pyarrow and pyspark above all: they made an agent's install ~960 MiB.
    imported = python(
        "import sys, quotastream\n"
        f"print(sorted({{m.partition('.')[0] for m in sys.modules}} & {set(ENGINE_ONLY_MODULES)}))"
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "absent",
    [
        pytest.param(ENGINE_ONLY_MODULES, id="base-install"),
        pytest.param(("pyspark",), id="no-spark"),
    ],
)
def test_quotastream_run_without_the_engine_extra_says_what_to_install_in_one_line(
    absent: tuple[str, ...],
) -> None:
    # None in sys.modules makes an import fail as if the package were not installed.
    ran = python(
        f"import sys; sys.modules.update(dict.fromkeys({absent!r}))\n"
        "from streaming.commands.cli import main\n"
        "sys.exit(main(['run']))"
    )
    assert ran.returncode == EXIT_USAGE, ran.stderr
    assert ran.stdout == ""
    [line] = ran.stderr.splitlines()
    missing = re.fullmatch(
        r"quotastream: error: the engine is not installed \(no module '([\w.]+)'\): "
        r"pip install 'quotastream\[engine\]'",
        line,
    )
    assert missing, line
    assert missing.group(1).partition(".")[0] in absent
