"""What ``quotastream proxy`` costs a Kafka client: throughput, added latency, requests per core.

One Apache Kafka node, one Redis, and the proxy as its own process (``quotastream proxy
--engine-config``, as it is deployed) in front of that node. Each measurement is taken both
direct to the broker and through the proxy in the same run, interleaved (direct first in even
rounds, proxied first in odd ones), because the machine is shared and noisy: read the ratios and
the added latencies, not the absolute numbers.

* ``produce``: confluent-kafka (librdkafka: a C client that is not the bottleneck, and whose
  Produce v10 and Fetch v16 are versions whose responses the proxy decodes) sends
  ``VALUE_BYTES``-byte values in 64 KiB batches (``batch.size`` 65536, ``linger.ms`` 5,
  ``acks`` 1, librdkafka's default of unlimited requests in flight) to a one-partition topic.
  MB/s: 1e6 bytes of record values per second, from the first ``produce()`` to the end of
  ``flush()``; the broker's end offset confirms that every record was written.
* ``fetch``: a topic prefilled once (direct) is read from offset 0 in large fetches
  (``max.partition.fetch.bytes`` 4 MiB, ``fetch.max.bytes`` 64 MiB), timed from the first
  records received to the last.
* ``*.ratio``: the median over the rounds of each round's proxied / direct MB/s (the drift of a
  shared machine cancels within a round); ``*_runs``: every run, in order;
  ``*.proxy_cpu_share``: the proxy process's CPU seconds per second in each proxied run.
* ``latency``: 100-byte values sent one at a time with kafka-python (``send().get()``,
  ``acks=1``, ``linger_ms=0``), in blocks alternating direct and proxied; ``added_p50_ms`` and
  ``added_p99_ms``: the proxied percentile minus the direct one. ``latency.raw``: the same with a
  bare socket sending a pre-encoded Produce v9 request (kafka-python's version) and waiting for
  its response: the proxy's hop without a client library's thread hand-offs.
* ``requests_per_s``: eight librdkafka producers with ``linger.ms`` 0 and ``batch.num.messages``
  1 (one 100-byte record per Produce request), five requests in flight each, drive the proxy as
  hard as they can; the Produce requests it forwarded (its ``quotastream_proxy_requests_total``)
  over the CPU seconds of its process (``/proc/<pid>/stat`` utime + stime, all threads) in the
  same window: requests per second of one core. ``requests.*_cpu_share``: CPU seconds per second
  of the proxy, the broker and this process in that window (a proxy share near 1: saturated).

Floors (the proxy's issue): proxied >= 0.6x direct for produce and fetch with 64 KiB batches,
added p50 <= 0.5 ms; goals >= 0.9x and <= 0.2 ms. Prints one JSON object and appends it to
bench/results/proxy.jsonl::

    {"kafka_version": ..., "produce.direct_mb_per_s": ..., "produce.proxied_mb_per_s": ...,
     "produce.ratio": ..., "fetch.direct_mb_per_s": ..., "fetch.proxied_mb_per_s": ...,
     "fetch.ratio": ..., "latency.added_p50_ms": ..., "latency.added_p99_ms": ...,
     "requests_per_s": ..., ...}

    python bench/proxy.py [--quick] [--no-closed-loop]

The closed loop (``bench/proxy_closed_loop.py``: the engine holding real clients to their
quotas through the proxy, and Kafka's own quotas holding the same clients in the same run) adds
``closed_loop.<client>.quota_bytes_per_s`` and ``closed_loop.<client>.achieved_bytes_per_s`` for
each client library (``.consumer.`` for its consumer), with ``kafka_achieved_bytes_per_s`` and
``vs_kafka`` beside them, and about ten minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import select
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from types import TracebackType
from typing import Any, Final, Self

import confluent_kafka
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder
from processes import cpu_seconds
from proxy_closed_loop import DURATION_S, closed_loop
from results import record  # bench/ is on sys.path when a script in it runs

from streaming.kafka_broker import kafka_version, start_kafka
from streaming.services import LocalService, start_redis
from tests.client_libraries import LIBRARIES

VALUE_BYTES: Final = 1000
BATCH_BYTES: Final = 65_536
FETCH_PARTITION_BYTES: Final = 4 << 20
SMALL_VALUE: Final = b"s" * 100
#: The node id of start_kafka()'s node: the proxy listens for it on node_port_base + 1.
NODE_ID: Final = 1

EVENTS = "bench.proxy.events"
PRODUCED = "bench.proxy.produce"
PREFILLED = "bench.proxy.fetch"
LATENCY = "bench.proxy.latency"
SMALL = "bench.proxy.small"

_INT32: Final = struct.Struct(">i")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def proxy_ports() -> tuple[int, int]:
    """A free bootstrap port and a node_port_base whose node port (base + 1) is free."""
    while True:
        first, second = free_port(), free_port()
        low, high = sorted((first, second))
        if high - 1 > low:
            return low, high - NODE_ID


class ProxyProcess:
    """``quotastream proxy`` in a process of its own, with its metrics on a free port."""

    def __init__(self, workdir: Path, kafka: LocalService, redis_server: LocalService) -> None:
        self.bootstrap_port, self.node_port_base = proxy_ports()
        self.metrics_port = free_port()
        quotas = workdir / "quotas.yaml"
        quotas.write_text("{}\n")  # no client quota: nobody is held
        config = workdir / "engine.yaml"
        settings = {
            "quotas": str(quotas),
            "kafka": {"bootstrap_servers": kafka.address, "topics": [EVENTS]},
            "redis": {"host": redis_server.host, "port": redis_server.port},
            "proxy": {
                "bootstrap_port": self.bootstrap_port,
                "node_port_base": self.node_port_base,
                "upstream": {"bootstrap_servers": kafka.address},
                "metrics": {"enabled": True, "port": self.metrics_port},
            },
        }
        config.write_text(json.dumps(settings))  # JSON is YAML
        self.log_path = workdir / "proxy.log"
        with self.log_path.open("wb") as log:
            command = ["proxy", "--engine-config", str(config)]
            self.process = subprocess.Popen(
                [sys.executable, "-m", "streaming.commands.cli", *command],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        try:
            self._wait_ready(60.0)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout_s: float) -> None:
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            readable, _, _ = select.select([self.process.stdout], [], [], 0.5)
            if readable:
                line = self.process.stdout.readline()
                if line.startswith("proxy ready on port"):
                    return
        tail = self.log_path.read_text()[-3000:]
        raise RuntimeError(f"the proxy did not start (exit code {self.process.poll()}):\n{tail}")

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.bootstrap_port}"

    @property
    def node_address(self) -> tuple[str, int]:
        return "127.0.0.1", self.node_port_base + NODE_ID

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.process.pid)

    def forwarded(self, api: str = "produce") -> int:
        """The requests of an API the proxy forwarded (its requests_total counter)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        pattern = rf'^quotastream_proxy_requests_total\{{api="{api}"\}} (\S+)$'
        found = re.search(pattern, text, re.MULTILINE)
        return int(float(found.group(1))) if found else 0

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # drains, then exits
            try:
                self.process.wait(40)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self.process.stdout is not None:
            self.process.stdout.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class CpuMeter:
    """The proxy's CPU seconds over a stretch of wall time."""

    def __init__(self, proxy: ProxyProcess | None) -> None:
        self._proxy = proxy
        self._cpu = proxy.cpu_seconds() if proxy else 0.0
        self._wall = time.perf_counter()

    def share(self) -> float | None:
        if self._proxy is None:
            return None
        cpu = self._proxy.cpu_seconds() - self._cpu
        return round(cpu / (time.perf_counter() - self._wall), 2)


def end_offset(kafka: LocalService, topic: str) -> int:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": kafka.address, "group.id": "bench"})
    try:
        _, high = consumer.get_watermark_offsets(
            confluent_kafka.TopicPartition(topic, 0), timeout=30
        )
        return int(high)
    finally:
        consumer.close()


def produce(bootstrap: str, topic: str, records: int, label: str) -> float:
    """MB/s of record values: ``records`` values in 64 KiB batches, acks=1."""
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": f"bench-produce-{label}",
            "acks": 1,
            "linger.ms": 5,
            "batch.size": BATCH_BYTES,
            "compression.type": "none",
        }
    )
    producer.produce(topic, b"warm-up", partition=0)  # metadata and connections
    if producer.flush(60) != 0:
        raise RuntimeError(f"{label}: the warm-up record was not delivered")
    value = b"p" * VALUE_BYTES
    send, poll = producer.produce, producer.poll
    began = time.perf_counter()
    for _ in range(records):
        while True:
            try:
                send(topic, value, partition=0)
                break
            except BufferError:  # librdkafka's queue is full: let it drain
                poll(0.0005)
    remaining = producer.flush(300)
    elapsed = time.perf_counter() - began
    if remaining:
        raise RuntimeError(f"{label}: {remaining} records undelivered")
    return records * VALUE_BYTES / 1e6 / elapsed


def fetch(bootstrap: str, topic: str, records: int, label: str) -> float:
    """MB/s of record values: the first ``records`` records of ``topic`` read from offset 0,
    timed from the first records received to the last."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": f"bench-fetch-{label}",
            "group.id": f"bench-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "max.partition.fetch.bytes": FETCH_PARTITION_BYTES,
            "fetch.max.bytes": 64 << 20,
            # librdkafka stops fetching for fetch.queue.backoff.ms (1 s) whenever its queue is
            # over queued.min.messages: a stall that would fall on the faster side.
            "fetch.queue.backoff.ms": 5,
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        read = first = 0
        began = 0.0
        deadline = time.monotonic() + 300
        while read < records:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{label}: read {read} of {records} records in 300 s")
            # Never more than remain: consume() waits out its timeout for a batch it asked for.
            batch = consumer.consume(min(10_000, records - read), 1.0)
            for message in batch:
                if message.error() is not None:
                    raise RuntimeError(f"{label}: {message.error()}")
            if batch and not began:
                began, first = time.perf_counter(), len(batch)
            read += len(batch)
        elapsed = time.perf_counter() - began
    finally:
        consumer.close()
    return (read - first) * VALUE_BYTES / 1e6 / elapsed


def throughput(
    name: str,
    rounds: int,
    direct: Callable[[], float],
    proxied: Callable[[], float],
    proxy: ProxyProcess,
) -> dict[str, Any]:
    """MB/s direct and proxied, ``rounds`` times each, direct first in even rounds and proxied
    first in odd ones; the ratio is the median of each round's proxied / direct."""
    direct_runs: list[float] = []
    proxied_runs: list[float] = []
    shares: list[float | None] = []
    for turn in range(rounds):
        for side in ("direct", "proxied") if turn % 2 == 0 else ("proxied", "direct"):
            if side == "direct":
                direct_runs.append(round(direct(), 1))
            else:
                meter = CpuMeter(proxy)
                proxied_runs.append(round(proxied(), 1))
                shares.append(meter.share())
    ratios = [p / d for p, d in zip(proxied_runs, direct_runs, strict=True)]
    return {
        f"{name}.direct_mb_per_s": statistics.median(direct_runs),
        f"{name}.proxied_mb_per_s": statistics.median(proxied_runs),
        f"{name}.ratio": round(statistics.median(ratios), 3),
        f"{name}.direct_runs": direct_runs,
        f"{name}.proxied_runs": proxied_runs,
        f"{name}.proxy_cpu_share": shares,
    }


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def latencies(
    blocks: int, per_block: int, senders: dict[str, Callable[[], None]]
) -> dict[str, list[float]]:
    """Milliseconds per synchronous send, in blocks alternating between the senders."""
    for send in senders.values():  # connections, metadata, warm code paths
        for _ in range(50):
            send()
    samples: dict[str, list[float]] = {name: [] for name in senders}
    names = list(senders)
    for block in range(blocks):
        for name in names if block % 2 == 0 else reversed(names):
            send, out = senders[name], samples[name]
            for _ in range(per_block):
                began = time.perf_counter()
                send()
                out.append((time.perf_counter() - began) * 1000)
    return samples


def added(samples: dict[str, list[float]], prefix: str) -> dict[str, float]:
    result: dict[str, float] = {}
    for name, fraction in (("p50", 0.5), ("p99", 0.99)):
        direct = percentile(samples["direct"], fraction)
        proxied = percentile(samples["proxied"], fraction)
        result[f"{prefix}.direct_{name}_ms"] = round(direct, 3)
        result[f"{prefix}.proxied_{name}_ms"] = round(proxied, 3)
        result[f"{prefix}.added_{name}_ms"] = round(proxied - direct, 3)
    return result


def kafka_python_sender(bootstrap: str, label: str) -> tuple[Callable[[], None], KafkaProducer]:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, client_id=f"bench-latency-{label}", acks=1, linger_ms=0
    )

    def send() -> None:
        producer.send(LATENCY, SMALL_VALUE, partition=0).get(timeout=30)

    return send, producer


def small_produce_request(topic: str, client_id: str) -> bytes:
    """A framed Produce v9 request (the version kafka-python sends): one 100-byte record."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    builder.append(0, timestamp=int(time.time() * 1000), key=None, value=SMALL_VALUE, headers=[])
    topic_data = ProduceRequest.TopicProduceData
    partition = topic_data.PartitionProduceData(index=0, records=bytes(builder.build()))
    request = ProduceRequest(
        version=9,
        transactional_id=None,
        acks=1,
        timeout_ms=30_000,
        topic_data=[topic_data(name=topic, partition_data=[partition])],
    )
    request.with_header(correlation_id=1, client_id=client_id)
    return bytes(request.encode(header=True, framed=True))


class RawSender:
    """One connection sending the same Produce request and waiting for each response."""

    def __init__(self, address: tuple[str, int], frame: bytes) -> None:
        self._sock = socket.create_connection(address, timeout=30)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._frame = frame
        self._buffer = bytearray(1 << 16)
        response = self.roundtrip()
        decoded = ProduceResponse.decode(response[5:], version=9)  # correlation id, tags
        errors = [p.error_code for t in decoded.responses for p in t.partition_responses]
        if errors != [0]:
            raise RuntimeError(f"the raw Produce request failed: error codes {errors}")

    def roundtrip(self) -> bytes:
        self._sock.sendall(self._frame)
        size = _INT32.unpack(self._read(4))[0]
        return self._read(size)

    def _read(self, size: int) -> bytes:
        view = memoryview(self._buffer)
        got = 0
        while got < size:
            count = self._sock.recv_into(view[got:size])
            if not count:
                raise ConnectionError("connection closed mid-response")
            got += count
        return bytes(view[:size])

    def send(self) -> None:
        self.roundtrip()

    def close(self) -> None:
        self._sock.close()


def forwarded_per_cpu_second(
    proxy: ProxyProcess, broker_pid: int, producers: int, warm_up_s: float, seconds: float
) -> dict[str, Any]:
    """Small Produce requests, as many as the producers get through, through the proxy."""
    clients = [
        confluent_kafka.Producer(
            {
                "bootstrap.servers": proxy.bootstrap_servers,
                "client.id": f"bench-small-{index}",
                "acks": 1,
                "linger.ms": 0,
                "batch.num.messages": 1,
                "max.in.flight": 5,
                "queue.buffering.max.messages": 1000,
            }
        )
        for index in range(producers)
    ]
    for client in clients:
        client.produce(SMALL, SMALL_VALUE, partition=0)
        if client.flush(60) != 0:
            raise RuntimeError("a small-request producer did not connect")
    began = time.perf_counter()
    end = began + warm_up_s + seconds
    measuring = False
    cpu = requests = broker_cpu = client_cpu = 0.0
    window_began = 0.0
    while True:
        full = 0
        for client in clients:
            for _ in range(100):
                try:
                    client.produce(SMALL, SMALL_VALUE, partition=0)
                except BufferError:  # its queue is full: serve its delivery reports
                    full += 1
                    client.poll(0)
                    break
        if full == len(clients):
            clients[0].poll(0.001)  # all full: wait for a response rather than spin
        now = time.perf_counter()
        if not measuring and now - began >= warm_up_s:
            measuring = True
            cpu, requests, window_began = proxy.cpu_seconds(), proxy.forwarded(), now
            broker_cpu, client_cpu = cpu_seconds(broker_pid), time.process_time()
        elif now >= end:
            break
    cpu = proxy.cpu_seconds() - cpu
    broker_cpu = cpu_seconds(broker_pid) - broker_cpu
    client_cpu = time.process_time() - client_cpu
    requests = proxy.forwarded() - requests
    wall = time.perf_counter() - window_began
    for client in clients:
        client.flush(60)
    return {
        "requests_per_s": round(requests / cpu),
        "requests.forwarded_per_wall_s": round(requests / wall),
        "requests.proxy_cpu_share": round(cpu / wall, 2),
        "requests.broker_cpu_share": round(broker_cpu / wall, 2),
        "requests.client_cpu_share": round(client_cpu / wall, 2),
        "requests.producers": producers,
    }


def create_topics(kafka: LocalService) -> None:
    admin = KafkaAdminClient(bootstrap_servers=kafka.address)
    try:
        admin.create_topics(
            [NewTopic(name, 1, 1) for name in (EVENTS, PRODUCED, PREFILLED, LATENCY, SMALL)]
        )
    finally:
        admin.close()


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a run of about a minute")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the smallest run that goes through every step (its figures mean nothing)",
    )
    parser.add_argument(
        "--no-closed-loop",
        action="store_true",
        help="leave out the closed loop with the engine (bench/proxy_closed_loop.py, ~15 min)",
    )
    parser.add_argument(
        "--closed-loop-libraries",
        nargs="+",
        default=list(LIBRARIES),
        help="the client libraries of the closed loop (default: all)",
    )
    parser.add_argument(
        "--closed-loop-duration-s", type=float, default=DURATION_S, help="each client's offer"
    )
    return parser.parse_args()


@dataclass(frozen=True)
class Sizes:
    """How much each step measures: a full run, ``--quick`` or ``--smoke``."""

    rounds: int
    produce_records: int
    fetch_records: int
    warm_up_records: int
    blocks: int
    per_block: int
    rps_seconds: float

    @staticmethod
    def of(quick: bool, smoke: bool) -> Sizes:
        def records(megabytes: int) -> int:
            return megabytes * 1_000_000 // VALUE_BYTES

        if smoke:
            # A fetch is timed from its first batch of up to 10,000 records: several of them.
            return Sizes(1, records(10), records(30), records(1), 2, 10, 1.0)
        if quick:
            return Sizes(2, records(100), records(200), records(50), 6, 100, 4.0)
        return Sizes(5, records(150), records(300), records(50), 20, 200, 8.0)


def main() -> None:
    args = arguments()
    quick: bool = args.quick
    size = Sizes.of(quick, args.smoke)
    rounds, produce_records, fetch_records = size.rounds, size.produce_records, size.fetch_records
    warm_up_records, blocks, per_block = size.warm_up_records, size.blocks, size.per_block
    rps_seconds = size.rps_seconds

    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": f"{platform.machine()} {os.cpu_count()} cpu",
        "kafka_version": kafka_version(),
        "librdkafka_version": confluent_kafka.libversion()[0],
        "quick": quick,
        "value_bytes": VALUE_BYTES,
        "batch_bytes": BATCH_BYTES,
        "rounds": rounds,
    }
    with (
        start_kafka() as kafka,
        start_redis() as redis_server,
        TemporaryDirectory(prefix="bench-proxy-") as workdir,
    ):
        create_topics(kafka)
        with ProxyProcess(Path(workdir), kafka, redis_server) as proxy:
            # Produce: 64 KiB batches, direct and proxied in turn, after runs that warm up the
            # broker's JIT (50 MB left its first rounds at half speed) and the proxy.
            produce(kafka.address, PRODUCED, 3 * warm_up_records, "warm-up")
            produce(proxy.bootstrap_servers, PRODUCED, warm_up_records, "warm-up")
            before = end_offset(kafka, PRODUCED)
            result.update(
                throughput(
                    "produce",
                    rounds,
                    lambda: produce(kafka.address, PRODUCED, produce_records, "direct"),
                    lambda: produce(proxy.bootstrap_servers, PRODUCED, produce_records, "proxied"),
                    proxy,
                )
            )
            written = end_offset(kafka, PRODUCED) - before
            if written != 2 * rounds * (produce_records + 1):  # each run's warm-up record too
                raise RuntimeError(f"{written} records written, not {2 * rounds} runs' worth")
            # Fetch: a topic prefilled once, read from the start each time.
            produce(kafka.address, PREFILLED, fetch_records, "prefill")
            fetch(kafka.address, PREFILLED, warm_up_records, "warm-up")
            fetch(proxy.bootstrap_servers, PREFILLED, warm_up_records, "warm-up")
            result.update(
                throughput(
                    "fetch",
                    rounds,
                    lambda: fetch(kafka.address, PREFILLED, fetch_records, "direct"),
                    lambda: fetch(proxy.bootstrap_servers, PREFILLED, fetch_records, "proxied"),
                    proxy,
                )
            )
            # Latency: synchronous small sends, blocks alternating direct and proxied.
            direct_send, direct_producer = kafka_python_sender(kafka.address, "direct")
            proxied_send, proxied_producer = kafka_python_sender(proxy.bootstrap_servers, "proxied")
            try:
                samples = latencies(
                    blocks, per_block, {"direct": direct_send, "proxied": proxied_send}
                )
            finally:
                direct_producer.close()
                proxied_producer.close()
            result.update(added(samples, "latency"))
            frame = small_produce_request(LATENCY, "bench-latency-raw")
            raw = {
                "direct": RawSender((kafka.host, kafka.port), frame),
                "proxied": RawSender(proxy.node_address, frame),
            }
            try:
                samples = latencies(
                    blocks, per_block * 2, {name: s.send for name, s in raw.items()}
                )
            finally:
                for sender in raw.values():
                    sender.close()
            result.update(added(samples, "latency.raw"))
            result["latency.samples"] = blocks * per_block
            result["latency.raw.samples"] = blocks * per_block * 2
            # Requests per CPU second of the proxy process.
            result.update(forwarded_per_cpu_second(proxy, kafka.process.pid, 8, 1.0, rps_seconds))
    if not args.no_closed_loop:
        result.update(closed_loop(args.closed_loop_libraries, args.closed_loop_duration_s))
    record("proxy", result)


if __name__ == "__main__":
    main()
