"""The sink's writes across a Redis outage, and the engine's checks before it starts anything."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pyarrow as pa
import pytest
import redis

from quotastream.outage import OutageError
from streaming.commands.preflight import UnreachableError, check_kafka, check_redis
from streaming.engine.batch_summary import BatchReport, SummaryRequest
from streaming.engine.settings import KafkaSettings, RedisSettings
from streaming.engine.sinks import (
    SinkSettings,
    execute_with_retry,
    redis_client,
    write_batches,
)
from streaming.engine.stages import DECISION_SCHEMA
from streaming.services import LocalService, free_port, start_redis
from tests.support.factories import decision_row

PASSWORD = "s3cret-engine-pass"


class RestartLater(threading.Thread):
    """Stops a server now and starts it again on its port ``after_s`` later."""

    def __init__(self, service: LocalService, after_s: float) -> None:
        super().__init__()
        self.port, self.after_s = service.port, after_s
        self.restarted: LocalService | None = None
        self.restarted_at = 0.0
        service.stop()
        self.start()

    def run(self) -> None:
        time.sleep(self.after_s)
        self.restarted = start_redis(port=self.port)
        self.restarted_at = time.monotonic()


def test_a_write_waits_out_an_outage_and_lands_soon_after_redis_returns() -> None:
    service = start_redis()
    settings = SinkSettings.local(service.host, service.port, key_prefix="qs", max_backoff_ms=300)
    batch = pa.RecordBatch.from_pylist([decision_row("user=a", 1000, 0)], schema=DECISION_SCHEMA)
    outage = RestartLater(service, after_s=2.0)
    written = list(write_batches(iter([batch]), settings, SummaryRequest(top_k=5)))
    written_at = time.monotonic()
    outage.join()
    assert outage.restarted is not None
    try:
        report = BatchReport.from_rows(row for part in written for row in part.to_pylist())
        # Attempts back off 50, 100, 200, then every 300 ms: several failed in 2 s.
        assert report.redis_failures >= 4
        # So the write goes through within one backoff (plus a round trip) of the restart.
        assert written_at - outage.restarted_at < 0.3 + 0.5
        assert redis.Redis(host="127.0.0.1", port=outage.port).get("qs:produce:user=a") is not None
    finally:
        outage.restarted.stop()


def test_a_write_gives_up_after_max_outage_naming_the_endpoint() -> None:
    port = free_port()
    settings = SinkSettings.local("127.0.0.1", port, max_outage_s=0.5, max_backoff_ms=100)
    client = redis_client(settings)
    began = time.monotonic()
    with pytest.raises(
        OutageError,
        match=rf"Redis 127\.0\.0\.1:{port} unreachable for more "
        r"than 0\.5 s \(\d+ failed attempts\)",
    ):
        execute_with_retry(client, [("set", ("k", "v"), {})], settings)
    assert 0.5 <= time.monotonic() - began < 2.0


def test_a_refused_login_is_not_retried() -> None:
    with start_redis(password=PASSWORD) as service:
        settings = SinkSettings(
            redis={"host": service.host, "port": service.port, "password": "wrong-pass"},
            max_outage_s=30,
        )
        client = redis_client(settings)
        began = time.monotonic()
        with pytest.raises(redis.AuthenticationError):
            execute_with_retry(client, [("set", ("k", "v"), {})], settings)
        assert time.monotonic() - began < 5


# --- before the engine starts ---------------------------------------------------------------
def test_an_unreachable_kafka_is_named() -> None:
    port = free_port()
    with pytest.raises(UnreachableError, match=rf"Kafka at 127\.0\.0\.1:{port}: "):
        check_kafka(KafkaSettings(bootstrap_servers=f"127.0.0.1:{port}"), timeout_s=1)


def test_an_unreachable_redis_is_named() -> None:
    port = free_port()
    with pytest.raises(UnreachableError, match=rf"Redis at redis://127\.0\.0\.1:{port}: "):
        check_redis(RedisSettings(port=port), timeout_s=1)


@pytest.fixture(scope="module")
def secured_redis() -> Iterator[LocalService]:
    with start_redis(password=PASSWORD) as service:
        admin = redis.Redis(host="127.0.0.1", port=service.port, password=PASSWORD)
        admin.acl_setuser(
            "reader", enabled=True, passwords=[f"+{PASSWORD}"], keys=["*"], commands=["+get"]
        )
        yield service


def test_a_refused_login_is_named_without_the_password(secured_redis: LocalService) -> None:
    settings = RedisSettings(port=secured_redis.port, password="not-the-password")
    with pytest.raises(UnreachableError) as caught:
        check_redis(settings, timeout_s=2)
    message = str(caught.value)
    assert f"Redis at redis://127.0.0.1:{secured_redis.port}: login refused" in message
    assert "not-the-password" not in message


def test_a_user_that_may_not_write_is_refused(secured_redis: LocalService) -> None:
    settings = RedisSettings(port=secured_redis.port, username="reader", password=PASSWORD)
    with pytest.raises(
        UnreachableError, match=r"may not write under quotastream: .*no permissions"
    ):
        check_redis(settings, timeout_s=2)


def test_a_reachable_redis_passes_and_keeps_no_key(secured_redis: LocalService) -> None:
    check_redis(RedisSettings(port=secured_redis.port, password=PASSWORD), timeout_s=2)
    admin = redis.Redis(host="127.0.0.1", port=secured_redis.port, password=PASSWORD)
    ttl = admin.pttl("quotastream:engine:started")
    assert isinstance(ttl, int)
    # Gone (-2), or going within a second; never kept (-1: a key without expiry).
    assert ttl == -2 or 0 < ttl <= 1000, ttl
