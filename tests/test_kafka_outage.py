"""Kafka outages against a real broker (Apache Kafka), without Spark: the source's triggers and
reads, the configuration log and the dead-letter producer wait out a broker that does not answer,
and give up only after their limit, naming the bootstrap servers.

A paused broker (SIGSTOP) keeps its connections open and answers nothing, as a hung one does, and
keeps its log; a stopped one refuses connections.
"""

from __future__ import annotations

import json
import logging
import pickle
import threading
from collections.abc import Iterator

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka import errors as kafka_errors
from pyspark.sql.streaming.datasource import ReadAllAvailable

from quotastream.outage import OutageError
from state.live_config import SetEnforcement, encode_change
from streaming.engine.config_log import ConfigLog, ConfigLogError
from streaming.engine.exporter import EngineMetrics
from streaming.engine.kafka_clients import is_outage
from streaming.engine.kafka_source import DataLossError, KafkaStreamReader
from streaming.engine.metric_names import KAFKA_OUTAGE, KAFKA_OUTAGES
from streaming.engine.sinks import SinkSettings, send_dead_letters
from streaming.engine.source_status import read_status
from streaming.kafka_broker import start_kafka
from streaming.services import LocalService
from tests.support.kafka_source import Checkpoint, new_topic, produce, read_all, reader
from tests.support.prometheus import samples

FAST = {"kafkaConsumer.pollTimeoutMs": "300", "startingOffsets": "earliest"}
OUTAGE_LOGGER = "streaming.engine.kafka_clients"


@pytest.fixture(scope="module")
def broker() -> Iterator[LocalService]:
    with start_kafka() as service:
        yield service


def outage_messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == OUTAGE_LOGGER]


def total(offsets: Checkpoint, topic: str) -> int:
    return sum(offsets[topic].values())


def triggers(source: KafkaStreamReader, start: Checkpoint, count: int) -> None:
    """``count`` triggers that each find nothing new (or raise)."""
    for _ in range(count):
        assert source.latestOffset(start, ReadAllAvailable()) == start


def trigger_until_one_raises(source: KafkaStreamReader, start: Checkpoint) -> None:
    """Triggers, each finding nothing new, until one raises (``maxOutageSeconds`` bounds it)."""
    while True:
        triggers(source, start, 1)


def resume_later(broker: LocalService, after_s: float) -> threading.Timer:
    timer = threading.Timer(after_s, broker.resume)
    timer.start()
    return timer


@pytest.mark.parametrize(
    ("error", "outage"),
    [
        # A broker down, hung or restarting, and a partition whose leader is moving.
        (kafka_errors.KafkaConnectionError("111 ECONNREFUSED"), True),
        (kafka_errors.KafkaTimeoutError("Failed to get offsets by timestamps in 2000 ms"), True),
        (kafka_errors.RequestTimedOutError(), True),
        (kafka_errors.LeaderNotAvailableError(), True),
        (kafka_errors.NotLeaderForPartitionError(), True),
        (kafka_errors.NodeNotReadyError(), True),
        # Waiting does not fix these: they fail at once.
        (kafka_errors.TopicAuthorizationFailedError(), False),
        (kafka_errors.SaslAuthenticationFailedError(), False),
        (kafka_errors.OffsetOutOfRangeError(), False),
        (kafka_errors.UnsupportedVersionError(), False),
        (kafka_errors.KafkaConfigurationError(), False),
        (ValueError("not Kafka's"), False),
    ],
)
def test_what_is_waited_out(error: Exception, outage: bool) -> None:
    assert is_outage(error) is outage


def test_triggers_plan_nothing_new_while_the_broker_hangs_and_the_rest_after_it(
    broker: LocalService, caplog: pytest.LogCaptureFixture
) -> None:
    topic = new_topic(broker, 2)
    produce(broker, topic, 100, 2)
    # The source reports its outage clock where the engine's metrics read it.
    metrics = EngineMetrics(port=0)
    status = metrics.source_status_file
    source = reader(broker, topic, statusFile=str(status), **FAST)
    first = source.latestOffset(source.initialOffset(), ReadAllAvailable())
    assert total(first, topic) == 100
    with caplog.at_level(logging.WARNING, logger=OUTAGE_LOGGER):
        broker.pause()
        try:
            for _ in range(3):
                assert source.latestOffset(first, ReadAllAvailable()) == first
            during = read_status(status)
            scraped_during = metrics.scrape()
        finally:
            broker.resume()
        produce(broker, topic, 50, 2, first=100)
        after = source.latestOffset(first, ReadAllAvailable())
    scraped_after, recovered = metrics.scrape(), read_status(status)
    metrics.close()
    assert total(after, topic) == 150
    assert during is not None
    assert during.since_ms is not None
    assert (during.outages, during.failures) == (1, 3)
    assert recovered == type(during)(since_ms=None, outages=1, failures=3)
    assert samples(scraped_during, KAFKA_OUTAGE)[""] > 0
    assert samples(scraped_after, KAFKA_OUTAGE)[""] == 0
    assert (
        samples(scraped_during, KAFKA_OUTAGES)[""] == samples(scraped_after, KAFKA_OUTAGES)[""] == 1
    )
    messages = outage_messages(caplog)
    assert len(messages) == 2, messages
    assert messages[0].startswith(f"Kafka at {broker.address} unreachable (")
    assert messages[1].startswith(f"Kafka at {broker.address} reachable again after ")
    source.stop()


def test_an_outage_is_never_taken_for_lost_offsets_but_a_log_lost_with_it_is_caught() -> None:
    broker = start_kafka()
    try:
        topic = new_topic(broker, 3)
        produce(broker, topic, 300, 3)
        # Far longer than a broker takes to start: only a source that never reaches it fails so.
        source = reader(broker, topic, maxOutageSeconds="120", **FAST)
        try:
            first = source.latestOffset(source.initialOffset(), ReadAllAvailable())
            assert total(first, topic) == 300
            port = broker.port
            broker.stop()
            # Refused connections for several triggers: nothing new, and no loss claimed.
            triggers(source, first, 4)
            # The broker returns without its log (started anew): that loss is still caught. The
            # client reconnects with backoff, so the first triggers may still find it
            # unreachable: each of those finds nothing new, and the first to reach it names it.
            broker = start_kafka(port=port)
            new_topic(broker, 3, topic)  # created again, as an operator would
            produce(broker, topic, 6, 3)
            with pytest.raises(DataLossError, match=rf"{topic}-\d: the .*failOnDataLoss=true"):
                trigger_until_one_raises(source, first)
        finally:
            source.stop()
    finally:
        broker.stop()


def test_a_trigger_fails_after_max_outage_naming_the_bootstrap_servers(
    broker: LocalService,
) -> None:
    topic = new_topic(broker, 1)
    produce(broker, topic, 10, 1)
    source = reader(broker, topic, maxOutageSeconds="1", **FAST)
    first = source.latestOffset(source.initialOffset(), ReadAllAvailable())
    broker.pause()
    try:
        with pytest.raises(OutageError) as failed:
            triggers(source, first, 20)
    finally:
        broker.resume()
    assert str(failed.value).startswith(
        f"Kafka at {broker.address} unreachable for more than 1 s ("
    )
    source.stop()


def planned(source: KafkaStreamReader, start: Checkpoint, end: Checkpoint) -> list[object]:
    return list(source.partitions(start, end))


def test_a_read_waits_for_a_hung_broker_and_returns_every_record(
    broker: LocalService, caplog: pytest.LogCaptureFixture
) -> None:
    topic = new_topic(broker, 1)
    produce(broker, topic, 100, 1)
    source = reader(broker, topic, **FAST)
    start = source.initialOffset()
    # The worker's consumer is connected (a first range read) before the broker hangs; the
    # rest is published after it, so that read cannot have fetched any of it ahead.
    half = source.latestOffset(start, ReadAllAvailable())
    assert [offset for _, offset, _ in read_all(source, start, half)] == list(range(100))
    produce(broker, topic, 100, 1)
    end = source.latestOffset(half, ReadAllAvailable())
    worker: KafkaStreamReader = pickle.loads(pickle.dumps(source))
    (rest,) = planned(source, half, end)
    with caplog.at_level(logging.WARNING, logger=OUTAGE_LOGGER):
        broker.pause()
        timer = resume_later(broker, 3.0)
        try:
            chunks = list(worker.records(rest.value))  # type: ignore[attr-defined]
        finally:
            timer.join()
    offsets = [offset for records in chunks for offset in records.offsets]
    assert offsets == list(range(100, 200))
    messages = outage_messages(caplog)
    assert len(messages) == 2, messages
    assert "unreachable" in messages[0]
    assert "reachable again" in messages[1]
    source.stop()


def test_a_read_fails_after_max_outage_naming_the_bootstrap_servers(broker: LocalService) -> None:
    topic = new_topic(broker, 1)
    produce(broker, topic, 10, 1)
    source = reader(broker, topic, maxOutageSeconds="1", **FAST)
    start = source.initialOffset()
    half = source.latestOffset(start, ReadAllAvailable())
    assert len(read_all(source, start, half)) == 10
    produce(broker, topic, 10, 1)
    end = source.latestOffset(half, ReadAllAvailable())
    worker: KafkaStreamReader = pickle.loads(pickle.dumps(source))
    (rest,) = planned(source, half, end)
    broker.pause()
    try:
        with pytest.raises(OutageError, match=rf"Kafka at {broker.address} unreachable for more"):
            list(worker.records(rest.value))  # type: ignore[attr-defined]
    finally:
        broker.resume()
    source.stop()


def test_the_configuration_log_is_read_across_an_outage(broker: LocalService) -> None:
    topic = new_topic(broker, 1)
    writer = ConfigLog(broker.address, topic)
    for enabled in (False, True, False):
        writer.append(SetEnforcement(enabled=enabled))
    writer.close()
    executor_log = ConfigLog(broker.address, topic, timeout_ms=300, max_outage_s=30)
    assert executor_log.end() == 3  # connected
    broker.pause()
    timer = resume_later(broker, 2.0)
    try:
        records = executor_log.read(0, 3)
    finally:
        timer.join()
    assert records == [encode_change(SetEnforcement(enabled=e)) for e in (False, True, False)]
    executor_log.close()

    # A command does not wait: the first timeout is its answer.
    command_log = ConfigLog(broker.address, topic, timeout_ms=300)
    assert command_log.end() == 3
    broker.pause()
    try:
        with pytest.raises(ConfigLogError, match="not received within 300 ms"):
            command_log.read(0, 3)
    finally:
        broker.resume()
    command_log.close()


def test_dead_letters_wait_for_a_hung_broker_and_all_arrive(
    broker: LocalService, caplog: pytest.LogCaptureFixture
) -> None:
    topic = new_topic(broker, 1)
    settings = SinkSettings.local(
        "127.0.0.1", 1, dead_letter_topic=topic, kafka_bootstrap=broker.address
    )
    send_dead_letters([b'{"n": -1}'], settings)  # the producer is connected
    values = [json.dumps({"n": n}).encode() for n in range(50)]
    with caplog.at_level(logging.WARNING, logger=OUTAGE_LOGGER):
        broker.pause()
        timer = resume_later(broker, 3.0)
        try:
            send_dead_letters(values, settings)
        finally:
            timer.join()
    consumer = KafkaConsumer(bootstrap_servers=broker.address, auto_offset_reset="earliest")
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    received: list[bytes] = []
    while len(received) < 51:
        batch = consumer.poll(timeout_ms=5000).get(tp, [])
        assert batch, received
        received += [r.value for r in batch]
    consumer.close()
    assert received == [b'{"n": -1}', *values]
    messages = outage_messages(caplog)
    assert len(messages) == 2, messages
