"""``quotastream proxy`` end to end: real client libraries through it to Apache Kafka.

* Three client libraries (kafka-python, aiokafka, confluent-kafka) produce to a topic led by the
  three brokers of a cluster and consume it in a group, through the proxy: every record arrives,
  the group's coordinator is reached through the proxy (FindCoordinator rewritten), and the
  usage the proxy published covers what they sent and read. A Metadata or FindCoordinator
  rewrite that failed would be silent (the clients would go straight to the brokers), so each
  test checks that the bytes and the group's requests went through the proxy.
* SCRAM logins over a TLS broker: each user's bytes are published under that user, equal to what
  the broker counts (the frames of a client that builds its own requests,
  ``tests/kafka_quotas.py``); a failed login publishes nothing under its user. The three
  libraries log in over TLS that the proxy terminates.
* Decisions in: a client the engine throttles is held on every connection, including by
  libraries that ignore ``throttle_time_ms``, and its responses say so.
"""

from __future__ import annotations

import socket
import struct
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.errors import KafkaError
from pyspark.sql import SparkSession

from quotastream.client import QuotaClient as DecisionClient
from quotastream.proxy import wire
from quotastream.proxy.usage import INSTANCE_HEADER
from quotastream.redis_contract import Decision
from state.config import QuotaConfig, load_quota_config
from streaming.commands.proxy import RunningProxy
from streaming.engine.job import start_query
from streaming.engine.settings import EngineSettings
from streaming.kafka_broker import (
    KafkaCluster,
    KafkaNode,
    ScramUser,
    Security,
    start_kafka,
    start_kafka_cluster,
)
from streaming.services import LocalService, TlsFiles
from tests.client_libraries import LIBRARIES, Access, Offer
from tests.kafka_quotas import Exchange, QuotaClient, fetch_request, produce_request
from tests.support.certificates import make_certificates
from tests.support.engine import engine_settings, publish
from tests.support.proxy import (
    INSTANCE,
    QUOTAS,
    await_hold,
    create_topic,
    hold,
    proxy_settings,
    write_decision,
)
from tests.support.queries import wait_until_read
from tests.support.rates import achieved_rate


def published_usage(address: str, topic: str) -> list[dict[str, Any]]:
    """Every usage event in ``topic`` (read to its end), each message's instance header checked."""
    consumer = KafkaConsumer(bootstrap_servers=address, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(partitions)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(partitions)
        events: list[dict[str, Any]] = []
        while any(consumer.position(p) < ends[p] for p in partitions):
            for records in consumer.poll(timeout_ms=1000).values():
                for record in records:
                    assert dict(record.headers)[INSTANCE_HEADER] == INSTANCE.encode()
                    events.extend(msgspec.json.decode(record.value))
        return events
    finally:
        consumer.close()


def usage_by(events: list[dict[str, Any]], kind: str) -> dict[tuple[str, str], int]:
    """Bytes per (user, client-id) of one kind."""
    totals: dict[tuple[str, str], int] = defaultdict(int)
    for event in events:
        if event["kind"] == kind:
            totals[event["user"], event["client_id"]] += event["bytes"]
    return dict(totals)


def requests_of(proxy: RunningProxy, api: str) -> float:
    value = proxy.registry.get_sample_value("quotastream_proxy_requests_total", {"api": api})
    return value or 0.0


def leaders(address: str, topic: str) -> set[int]:
    admin = KafkaAdminClient(bootstrap_servers=address)
    try:
        [described] = admin.describe_topics([topic])
    finally:
        admin.close()
    return {partition["leader_id"] for partition in described["partitions"]}


@pytest.mark.parametrize("library", sorted(LIBRARIES))
def test_a_client_library_produces_and_consumes_in_a_group_through_the_proxy(
    library: str, kafka_cluster: KafkaCluster, kafka: KafkaNode, redis_server: LocalService
) -> None:
    client = LIBRARIES[library]
    topic, events = f"proxied-{library}", f"usage-{library}"
    create_topic(kafka_cluster.address, topic)
    assert leaders(kafka_cluster.address, topic) == {1, 2, 3}
    values = [f"{library}-{i:05d}-".encode() + b"v" * 1000 for i in range(600)]
    settings = proxy_settings(kafka_cluster.address, kafka.address, redis_server, events)
    with RunningProxy(settings) as proxy:
        access = Access(proxy.bootstrap_servers)
        client.produce(access, topic, values, client_id=f"{library}-producer")
        consumed = client.consume(
            access, topic, f"{library}-group", f"{library}-consumer", len(values)
        )
        group_requests = {
            api: requests_of(proxy, api)
            for api in ("find_coordinator", "join_group", "consumer_group_heartbeat")
        }
        committed = requests_of(proxy, "offset_commit")
        request_bytes = proxy.registry.get_sample_value(
            "quotastream_proxy_bytes_total", {"api": "produce", "direction": "request"}
        )
        assert request_bytes is not None
        produce_requests = requests_of(proxy, "produce")
    # Stopped: every sum it counted is published.
    assert Counter(consumed) == Counter(values)
    assert group_requests["find_coordinator"] >= 1
    assert group_requests["join_group"] + group_requests["consumer_group_heartbeat"] >= 1
    assert committed >= 1
    usage = published_usage(kafka.address, events)
    producer = ("ANONYMOUS", f"{library}-producer")
    sent = sum(len(value) for value in values)
    produced = usage_by(usage, "produce")
    assert set(produced) == {producer}
    # A produce event counts the request's frame without its 4-byte length prefix.
    assert produced[producer] == request_bytes - 4 * produce_requests
    assert produced[producer] > sent
    assert {e["broker"] for e in usage if e["kind"] == "produce"} == {1, 2, 3}
    assert sum(e["count"] for e in usage if e["kind"] == "produce") == produce_requests
    fetched = usage_by(usage, "fetch")
    assert fetched[("ANONYMOUS", f"{library}-consumer")] > sent


# --- SASL/SCRAM and TLS -----------------------------------------------------------------------

PROXY_USER, PROXY_PASSWORD = "proxy", "proxy-secret"
USERS = {"alice": "alice-secret", "bob": "bob-secret"}


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_certificates(tmp_path_factory.mktemp("tls"))


SCRAM_USERS = (
    ScramUser(PROXY_USER, PROXY_PASSWORD),
    *(ScramUser(name, password) for name, password in USERS.items()),
)


@pytest.fixture(scope="module")
def scram_broker(tls: TlsFiles) -> Iterator[KafkaNode]:
    """One node whose only client listener is SASL_SSL with SCRAM-SHA-512 users (the raw
    client of ``tests/kafka_quotas.py`` talks to a single broker)."""
    with start_kafka(security=Security(tls=tls, scram_users=SCRAM_USERS)) as broker:
        yield broker


@pytest.fixture(scope="module")
def scram_cluster(tls: TlsFiles) -> Iterator[KafkaCluster]:
    """Three such nodes."""
    with start_kafka_cluster(3, security=Security(tls=tls, scram_users=SCRAM_USERS)) as cluster:
        yield cluster


def scram_client(tls: TlsFiles) -> dict[str, str]:
    """The proxy's own login to the broker (it reads the cluster's brokers with it)."""
    return {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": PROXY_USER,
        "sasl_plain_password": PROXY_PASSWORD,
        "ssl_cafile": str(tls.ca),
    }


def test_scram_logins_publish_each_users_bytes_exactly_as_the_broker_counts_them(
    scram_broker: KafkaNode, tls: TlsFiles, kafka: KafkaNode, redis_server: LocalService
) -> None:
    """Clients log in through a plaintext proxy port; the proxy talks TLS to the broker."""
    topic, events = "scram-counted", "usage-scram-counted"
    create_topic(scram_broker.address, topic, partitions=1, **scram_client(tls))
    settings = proxy_settings(
        scram_broker.address, kafka.address, redis_server, events, upstream_client=scram_client(tls)
    )
    exchanges: list[Exchange] = []
    with RunningProxy(settings) as proxy:
        for user, password in USERS.items():
            client = QuotaClient(proxy.bootstrap_servers, user, password, f"{user}-raw")
            try:
                exchanges.extend(client.produce(topic, size) for size in (100, 5_000, 70_000))
                # Up to the log's end: the last fetch is answered empty, and counted too.
                offset = 0
                while (fetched := client.fetch(topic, offset)).served:
                    exchanges.append(fetched)
                    offset += 1
                exchanges.append(fetched)
            finally:
                client.close()
        # kafka-python reports the broker's refusal as a bootstrap that never completes.
        with pytest.raises(KafkaError):
            QuotaClient(proxy.bootstrap_servers, "alice", "wrong-password", "impostor")
    usage = published_usage(kafka.address, events)
    for kind in ("produce", "fetch"):
        expected: dict[tuple[str, str], int] = defaultdict(int)
        for exchange in exchanges:
            if exchange.kind == kind:
                expected[exchange.user, exchange.client_id] += exchange.counted_bytes
        assert usage_by(usage, kind) == expected, kind
    assert "impostor" not in {event["client_id"] for event in usage}


@pytest.mark.parametrize("library", sorted(LIBRARIES))
def test_a_client_library_logs_in_with_scram_over_tls_the_proxy_terminates(
    library: str,
    scram_cluster: KafkaCluster,
    tls: TlsFiles,
    kafka: KafkaNode,
    redis_server: LocalService,
) -> None:
    topic, events = f"scram-tls-{library}", f"usage-scram-tls-{library}"
    create_topic(scram_cluster.address, topic, partitions=3, **scram_client(tls))
    settings = proxy_settings(
        scram_cluster.address,
        kafka.address,
        redis_server,
        events,
        upstream_client=scram_client(tls),
        tls={"cert_file": str(tls.cert), "key_file": str(tls.key)},
    )
    values = [f"{library}-{i}".encode() * 50 for i in range(50)]
    with RunningProxy(settings) as proxy:
        access = Access(proxy.bootstrap_servers, scram=("bob", USERS["bob"]), ca_file=str(tls.ca))
        LIBRARIES[library].produce(access, topic, values, client_id=f"{library}-tls")
        consumed = LIBRARIES[library].consume(
            access, topic, f"{library}-tls-group", f"{library}-tls", len(values)
        )
    assert Counter(consumed) == Counter(values)
    usage = published_usage(kafka.address, events)
    assert set(usage_by(usage, "produce")) == {("bob", f"{library}-tls")}
    assert {e["broker"] for e in usage if e["kind"] == "produce"} == {1, 2, 3}
    assert ("bob", f"{library}-tls") in usage_by(usage, "fetch")


# --- Decisions in -----------------------------------------------------------------------------


# Timed from the call: the libraries whose calls are their requests (a JVM's start would use up the
# hold before Java's first request; its holds are measured by bench/proxy_closed_loop.py).
@pytest.mark.parametrize("library", sorted(n for n, lib in LIBRARIES.items() if lib.in_process))
def test_a_client_the_engine_throttles_is_held_even_when_it_ignores_throttle_time(
    library: str, kafka: KafkaNode, redis_server: LocalService
) -> None:
    topic = events = f"held-{library}"
    create_topic(kafka.address, topic, partitions=1)
    settings = proxy_settings(kafka.address, kafka.address, redis_server, f"usage-{events}")
    config = load_quota_config(QUOTAS)
    client_id = f"{library}-held"
    with RunningProxy(settings) as proxy:
        access = Access(proxy.bootstrap_servers)
        LIBRARIES[library].produce(access, topic, [b"first"], client_id=client_id)
        hold(redis_server, settings.redis.key_prefix, config, client_id, 2_000)
        await_hold(proxy, ("produce", "ANONYMOUS", client_id, 1))
        started = time.monotonic()
        LIBRARIES[library].produce(access, topic, [b"x" * 100] * 20, client_id=client_id)
        elapsed = time.monotonic() - started
        held = proxy.registry.get_sample_value("quotastream_proxy_held_seconds_total")
    assert elapsed >= 1.5, f"{library} produced in {elapsed:.2f} s despite a 2 s hold"
    assert held is not None
    assert held >= 1.5


# --- The closed loop: the engine decides, the proxy holds ---------------------------------------

QUOTA_BYTES_PER_S = 300_000
CLUSTER_QUOTAS = f"""
quota_types:
  produce: {{samples: 11, window_ms: 1000, scope: cluster}}
clients:
  - user: <default>
    producer_byte_rate: {QUOTA_BYTES_PER_S}
"""


def test_the_engine_holds_a_producer_spread_over_three_brokers_near_its_cluster_quota(
    spark: SparkSession,
    kafka_cluster: KafkaCluster,
    kafka: KafkaNode,
    redis_server: LocalService,
    tmp_path: Path,
) -> None:
    """aiokafka ignores throttle_time_ms: only the proxy's muting holds it. It offers 3x its
    cluster-wide quota to partitions led by three brokers; the engine sums its usage over them.
    Kafka's rate starts padded to ten windows, so the quota is what it achieves on average from
    the first window on. The engine's decisions come a second or more after the bytes; the proxy
    holds the client for what it forwarded since each one, so that latency is not let through."""
    topic, events = "closed-loop", "usage-closed-loop"
    create_topic(kafka_cluster.address, topic)
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(CLUSTER_QUOTAS)
    base = engine_settings(kafka, redis_server, tmp_path, events)
    settings = EngineSettings.model_validate(
        {
            **base.model_dump(),
            "quotas": str(quotas),
            "events": {},  # live traffic: the default bounds around the engine's clock
            "kafka": {**base.model_dump()["kafka"], "client": {}},
            "proxy": proxy_settings(
                kafka_cluster.address, kafka.address, redis_server, events
            ).proxy.model_dump(),
        }
    )
    config = load_quota_config(quotas)
    warm_up = {"kind": "produce", "ts": int(time.time() * 1000), "bytes": 1, "user": "warm-up"}
    publish(kafka, events, [msgspec.json.encode({**warm_up, "client_id": "", "broker": 1})])
    query = start_query(spark, settings, config)
    try:
        wait_until_read(query, events, 1)  # the query runs: its first batch is behind it
        with RunningProxy(settings, config) as proxy:
            offer = Offer(bytes_per_s=3 * QUOTA_BYTES_PER_S, duration_s=20)
            acks = LIBRARIES["aiokafka"].offer(
                Access(proxy.bootstrap_servers), topic, "bursting", offer
            )
            held = proxy.registry.get_sample_value("quotastream_proxy_held_seconds_total")
    finally:
        query.stop()
    # Over spans of the quota's 11 windows of 1 s, from the first window on.
    achieved = achieved_rate(acks, span_s=11, after_s=1)
    assert held is not None
    assert held > 1
    # Unheld it would achieve 3x; held only to each decision's end, 1.1-1.8x, as the engine's
    # batches came later on a loaded machine. Counting the bytes forwarded since each decision,
    # 0.9-1.15x (bench/proxy.py measures it against Kafka's own quota).
    assert 0.6 * QUOTA_BYTES_PER_S < achieved < 1.5 * QUOTA_BYTES_PER_S, achieved


def fetch_once(address: tuple[str, int], topic: str, max_bytes: int) -> tuple[int, int]:
    """One Fetch v12 of partition 0 from offset 0 asking for ``max_bytes``, over a raw socket:
    the record bytes of its response, and its ``throttle_time_ms``."""
    request = fetch_request(topic, 0, partition_max_bytes=max_bytes, max_bytes=max_bytes)
    request.API_VERSION = 12
    request.with_header(correlation_id=1, client_id="greedy")
    with socket.create_connection(address, timeout=30) as connection:
        connection.sendall(request.encode(header=True, framed=True))
        reader = connection.makefile("rb")
        size = struct.unpack(">i", reader.read(4))[0]
        payload = memoryview(reader.read(size))
    response = wire.decode_response(wire.FETCH, 12, payload)
    records = sum(len(p.records or b"") for t in response.responses for p in t.partitions)
    return records, response.throttle_time_ms


GREEDY_QUOTA_BYTES_PER_S = 20_000


def greedy_consumer_settings(
    kafka: KafkaNode, redis_server: LocalService, tmp_path: Path, topic: str
) -> EngineSettings:
    """A proxy in front of ``kafka``, where a topic of 3 MB of records waits, and a fetch quota
    of 20 kB/s per user."""
    create_topic(kafka.address, topic, partitions=1)
    LIBRARIES["kafka-python"].produce(
        Access(kafka.address), topic, [f"{i:04d}".encode() * 2_500 for i in range(300)], "filler"
    )
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(
        f"clients:\n  - user: <default>\n    consumer_byte_rate: {GREEDY_QUOTA_BYTES_PER_S}\n"
    )
    base = proxy_settings(kafka.address, kafka.address, redis_server, f"usage-{topic}")
    return EngineSettings.model_validate({**base.model_dump(), "quotas": str(quotas)})


def decide_headroom(
    redis_server: LocalService,
    settings: EngineSettings,
    config: QuotaConfig,
    key: tuple[str, str, str, int],
) -> None:
    """Writes the engine's decision for ``key`` under a quota of 20 kB/s: 150 kB in its window,
    measured over 10-11 s (Kafka's default samples), 50-70 kB of headroom."""
    entity = DecisionClient.connect(
        redis_server.host, redis_server.port, settings.redis.key_prefix, config
    ).entity_of_client(*key)
    now = int(time.time() * 1000)
    window_ms = 10_000 + now % 1000
    write_decision(
        redis_server,
        settings.redis.key_prefix,
        Decision(
            quota=key[0],
            entity=entity,
            throttle_ms=0,
            until=now,
            rate=150_000 * 1000 / window_ms,
            limit=float(GREEDY_QUOTA_BYTES_PER_S),
            exceeded=False,
            window_ms=window_ms,
            decided_at=now,
        ),
    )


def await_decision(proxy: RunningProxy, key: tuple[str, str, str, int]) -> None:
    """Until the proxy measures ``key`` by its decision: a refresh pass reads it from Redis."""
    holds = proxy.proxy.holds
    holds.remaining_ms(key)  # seen, as its first request would make it
    deadline = time.monotonic() + 5
    while holds.over_quota_with(key, 10**6) == 0:
        assert time.monotonic() < deadline, "the proxy never read the decision"
        holds.refresh()


def test_a_fetch_response_over_the_quota_is_answered_empty_and_published_as_zero_bytes(
    kafka: KafkaNode, redis_server: LocalService, tmp_path: Path
) -> None:
    """As a broker answers a fetch that would break its quota: empty, with the throttle, and not
    counted; the engine is told of the attempt with 0 bytes (docs/events.md). A fetch that fits
    is served."""
    topic = "emptied-fetch"
    settings = greedy_consumer_settings(kafka, redis_server, tmp_path, topic)
    config = load_quota_config(Path(settings.quotas))
    key = ("fetch", "ANONYMOUS", "greedy", 1)
    decide_headroom(redis_server, settings, config, key)
    with RunningProxy(settings, config) as proxy:
        broker = (settings.proxy.client_host, proxy.proxy.node_ports()[1])
        await_decision(proxy, key)
        emptied = fetch_once(broker, topic, 100_000)
        served = fetch_once(broker, topic, 20_000)
        count = proxy.registry.get_sample_value("quotastream_proxy_emptied_fetches_total")
    records, throttle_ms = emptied
    assert records == 0
    # About 100 kB over 50-70 kB of headroom at 20 kB/s: 1.5-2.5 s from the decision, less the
    # time since it was made.
    assert 1_000 < throttle_ms <= 2_600, throttle_ms
    assert served[0] > 0
    assert count == 1
    fetched = [e for e in published_usage(kafka.address, f"usage-{topic}") if e["kind"] == "fetch"]
    # Both fetches counted, the emptied one with 0 bytes: only the served response's bytes
    # (its records and a few dozen bytes of headers).
    assert sum(e["count"] for e in fetched) == 2
    assert served[0] < sum(e["bytes"] for e in fetched) < served[0] + 500, fetched


def test_the_produce_request_that_breaks_the_quota_holds_its_client_at_once(
    kafka: KafkaNode, redis_server: LocalService, tmp_path: Path
) -> None:
    """As a broker records each request and then checks it: the request that puts the client
    over its quota gets the throttle in its own response and holds the connection from then on,
    without waiting for the next refresh of the decisions (none comes in this test). A client
    with a backlog (Kafka's Java producer buffers 32 MB) otherwise sent at wire speed until the
    next refresh, and was held for seconds then: 1.1-1.3x its quota in bursts."""
    topic = "checked-produce"
    create_topic(kafka.address, topic, partitions=1)
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(
        f"clients:\n  - user: <default>\n    producer_byte_rate: {GREEDY_QUOTA_BYTES_PER_S}\n"
    )
    base = proxy_settings(
        kafka.address,
        kafka.address,
        redis_server,
        f"usage-{topic}",
        decisions={"refresh_ms": 600_000},
    )
    settings = EngineSettings.model_validate({**base.model_dump(), "quotas": str(quotas)})
    config = load_quota_config(quotas)
    key = ("produce", "ANONYMOUS", "steady", 1)
    decide_headroom(redis_server, settings, config, key)
    request_bytes = 10_000
    with RunningProxy(settings, config) as proxy:
        broker = (settings.proxy.client_host, proxy.proxy.node_ports()[1])
        await_decision(proxy, key)
        exchanges = []  # (throttle_time_ms, round trip ms) per request, on one connection
        with socket.create_connection(broker, timeout=30) as connection:
            reader = connection.makefile("rb")
            for correlation_id in range(10):
                request = produce_request(topic, request_bytes)
                request.API_VERSION = 9
                request.with_header(correlation_id=correlation_id, client_id="steady")
                started = time.monotonic()
                connection.sendall(request.encode(header=True, framed=True))
                size = struct.unpack(">i", reader.read(4))[0]
                response = wire.decode_response(wire.PRODUCE, 9, memoryview(reader.read(size)))
                exchanges.append((response.throttle_time_ms, (time.monotonic() - started) * 1e3))
    throttles = [throttle for throttle, _ in exchanges]
    first = next((i for i, throttle in enumerate(throttles) if throttle > 0), None)
    assert first is not None, f"no request was held: {throttles}"
    # The request that crossed 50-70 kB of headroom: the fifth to the eighth of 10 kB.
    assert 4 <= first <= 7, throttles
    assert throttles[:first] == [0] * first
    # Over by less than a request: held for less than a request's worth of quota (0.5 s).
    assert 0 < throttles[first] <= 500 + 10, throttles
    # The next request waited out that hold in the proxy before the broker saw it.
    assert exchanges[first + 1][1] >= throttles[first] - 10, exchanges
    # From then on each request is over as it arrives: held for its own bytes (0.5 s), and up
    # to a second more where a sample's start shortens the window (Kafka's Rate).
    assert all(0 < throttle <= 1_510 for throttle in throttles[first + 1 :]), throttles


def test_a_fetch_asks_for_no_more_than_the_clients_fetch_quota_allows_in_its_window(
    kafka: KafkaNode, redis_server: LocalService, tmp_path: Path
) -> None:
    """As a broker caps ``max_bytes`` at limit x (samples - 1) x window: 20 kB/s -> 200 kB."""
    topic = "capped-fetch"
    settings = greedy_consumer_settings(kafka, redis_server, tmp_path, topic)
    uncapped, _ = fetch_once((kafka.host, kafka.port), topic, 50 << 20)
    with RunningProxy(settings) as proxy:
        broker = (settings.proxy.client_host, proxy.proxy.node_ports()[1])
        capped, _ = fetch_once(broker, topic, 50 << 20)
    assert uncapped > 300 * 10_000  # every record
    # The broker returns whole batches up to max_bytes (kafka-python's are 16 kB at most).
    assert 0 < capped <= 200_000 + 16_384
