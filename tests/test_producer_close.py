"""Closing a producer that Kafka holds (``quotastream/producer_close.py``), against Apache Kafka
through the proxy: a producer the engine holds at its close closes in the time given, dropping
what it held, and leaves nothing running to complain as the servers go down. The simulated
clients of ``quotastream run``, the proxy's usage publisher and the remote-log bridge close
their producers so."""

from __future__ import annotations

import gc
import logging
import sys
import threading
import time
from typing import Any

import pytest
from kafka import KafkaProducer

from quotastream.producer_close import close_producer
from state.config import load_quota_config
from streaming.commands.proxy import RunningProxy
from streaming.kafka_broker import KafkaNode
from streaming.services import LocalService
from tests.support.proxy import QUOTAS, await_hold, create_topic, hold, proxy_settings

#: Far longer than the test: the held record can only end by the close dropping it.
HOLD_MS = 600_000


def test_a_producer_held_at_the_stop_drops_what_it_holds_and_closes_quietly(
    kafka: KafkaNode,
    redis_server: LocalService,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = client_id = "held-at-the-stop"
    create_topic(kafka.address, topic, partitions=1)
    settings = proxy_settings(kafka.address, kafka.address, redis_server, f"usage-{topic}")
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    caplog.set_level(logging.INFO)
    with RunningProxy(settings) as proxy:
        producer = KafkaProducer(bootstrap_servers=proxy.bootstrap_servers, client_id=client_id)
        producer.send(topic, b"sent").get(timeout=30)
        config = load_quota_config(QUOTAS)
        hold(redis_server, settings.redis.key_prefix, config, client_id, HOLD_MS)
        await_hold(proxy, ("produce", "ANONYMOUS", client_id, 1))
        held = producer.send(topic, b"held")
        started = time.monotonic()
        sent_all = close_producer(producer, timeout_s=1.0)
        closing_s = time.monotonic() - started
    # The proxy has closed its connections: a producer left open would log it, or raise on
    # collection.
    del producer
    gc.collect()
    assert sent_all is False
    assert held.failed()
    assert closing_s < HOLD_MS / 1000 / 10
    assert [thread.name for thread in threading.enumerate() if client_id in thread.name] == []
    assert [
        record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING
    ] == []
    assert unraisable == []
