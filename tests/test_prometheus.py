"""A real Prometheus scrapes the engine's exporter while a client is throttled.

Needs the ``prometheus`` binary (Debian package ``prometheus``: ``/usr/bin/prometheus``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from quotastream import QuotaClient
from state.config import parse_quota_config
from streaming.engine.exporter import EngineMetrics
from streaming.engine.job import start_query
from streaming.engine.metric_names import (
    INPUT_BACKLOG,
    QUOTA_REQUESTS,
    QUOTA_UTILISATION,
    THROTTLE_TIME,
    THROTTLED_ENTITIES,
)
from streaming.engine.settings import EngineSettings
from streaming.services import LocalService, free_port
from tests.support.engine import SteadyTraffic, engine_settings, publish
from tests.support.factories import produce

# The test command's bootstrap installs it (Debian package prometheus); missing is a failure.
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


class Prometheus:
    """A Prometheus server scraping one target every second, in its own process group."""

    def __init__(self, target: str, workdir: Path) -> None:
        self.port = free_port()
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  evaluation_interval: 1s\n"
            "scrape_configs:\n"
            "  - job_name: quotastream\n"
            "    scrape_interval: 1s\n"
            "    scrape_timeout: 1s\n"
            f"    static_configs: [{{targets: ['{target}']}}]\n"
        )
        self._log = (workdir / "prometheus.log").open("wb")
        self.process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "prometheus exited"
            try:
                with urllib.request.urlopen(self.url("/-/ready"), timeout=1) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.1)
        raise AssertionError(f"prometheus not ready within {timeout_s} s")

    def query(self, expression: str) -> list[dict[str, Any]]:
        address = self.url("/api/v1/query?" + urllib.parse.urlencode({"query": expression}))
        with urllib.request.urlopen(address, timeout=5) as reply:
            answer = json.loads(reply.read())
        assert answer["status"] == "success", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=15)
        self._log.close()


def first_value(prometheus: Prometheus, expression: str) -> float | None:
    result = prometheus.query(expression)
    return float(result[0]["value"][1]) if result else None


def test_prometheus_sees_a_throttled_client(
    spark: SparkSession, kafka: LocalService, redis_server: LocalService, tmp_path: Path
) -> None:
    topic = f"metrics-{uuid.uuid4().hex[:8]}"
    publish(kafka, topic, [], partitions=1)
    config = parse_quota_config(
        {"clients": [{"user": "alice", "producer_byte_rate": 1000}]}, "test config"
    )
    settings = engine_settings(kafka, redis_server, tmp_path, topic, shuffle_partitions=1)
    # The exporter binds loopback unless told otherwise; the test only picks a free port.
    assert settings.metrics.host == EngineSettings().metrics.host == "127.0.0.1"
    assert settings.metrics.enabled
    settings = settings.model_copy(
        update={"metrics": settings.metrics.model_copy(update={"port": 0})}
    )
    # As `quotastream run` makes it: with the Kafka settings, for the input backlog.
    metrics = EngineMetrics.from_settings(
        settings.metrics, keep_ms=settings.redis.keep_ms, kafka=settings.kafka
    )
    port = metrics.serve()
    assert metrics.bound_address == ("127.0.0.1", port)
    agent = QuotaClient.connect(redis_server.host, redis_server.port, prefix=topic, config=config)
    entity = agent.entity_of_client("produce", user="alice", client_id="app", broker=1)
    selector = f'{{quota="produce",entity="{entity}"}}'

    prometheus = Prometheus(f"127.0.0.1:{port}", tmp_path)
    query = None
    traffic = None
    try:
        prometheus.wait_ready(30)
        query = start_query(spark, settings, config, metrics=metrics)
        # 400 B every 100 ms against 1000 B/s: throttled while the traffic lasts. Each event
        # stands for 3 requests.
        traffic = SteadyTraffic(kafka, topic, {**produce("alice", "app", 400, 0), "count": 3})
        traffic.start()
        deadline = time.monotonic() + 75
        throttle = utilisation = throttled = input_events = None
        # The decisions' series come with the batch's write, the input count with Spark's
        # progress event after it: a scrape can fall between the two, so each is waited for.
        while time.monotonic() < deadline:
            assert query.isActive, query.exception()
            throttle = first_value(prometheus, f"{THROTTLE_TIME}{selector}")
            utilisation = first_value(prometheus, f"{QUOTA_UTILISATION}{selector}")
            throttled = first_value(prometheus, f'{THROTTLED_ENTITIES}{{quota="produce"}}')
            input_events = first_value(prometheus, "quotastream_input_events_total")
            seen = (throttle or 0) > 0 and (utilisation or 0) > 1 and (throttled or 0) >= 1
            if seen and (input_events or 0) > 0:
                break
            time.sleep(0.25)
        found_at = deadline - time.monotonic()
        assert (throttle or 0) > 0, (throttle, utilisation)
        assert (utilisation or 0) > 1, (throttle, utilisation)
        assert (throttled or 0) >= 1
        # Spark's progress reaches Prometheus too.
        assert (input_events or 0) > 0
        up = first_value(prometheus, 'up{job="quotastream"}')
        assert up == 1.0
        # Kafka's own label names aggregate as in Kafka's metrics: by user.
        by_user = prometheus.query(f'sum by (user) ({QUOTA_UTILISATION}{{quota="produce"}})')
        assert [sample["metric"] for sample in by_user] == [{"user": "alice"}]
        # The backlog is asked of Kafka at each scrape: once the traffic stops and the query has
        # read everything, it is 0 (an idle cluster, which the stalled-engine alert ignores).
        traffic.stop()
        sent_requests = 3 * traffic.acked
        traffic = None
        backlog_deadline = time.monotonic() + 90
        backlog = first_value(prometheus, INPUT_BACKLOG)
        while backlog != 0 and time.monotonic() < backlog_deadline:
            assert query.isActive, query.exception()
            time.sleep(0.5)
            backlog = first_value(prometheus, INPUT_BACKLOG)
        assert backlog == 0

        def produce_requests() -> float:
            value = metrics.registry.get_sample_value(QUOTA_REQUESTS, {"quota": "produce"})
            return value or 0.0

        # Every event read counts its requests once. The exporter is read directly: a scraped
        # backlog of 0 may predate the last events.
        requests_deadline = time.monotonic() + 60
        while produce_requests() < sent_requests and time.monotonic() < requests_deadline:
            assert query.isActive, query.exception()
            time.sleep(0.25)
        assert produce_requests() == sent_requests
        print(
            f"prometheus saw throttle {throttle} s, utilisation {utilisation} "
            f"({75 - found_at:.1f} s after the query started)"
        )
    finally:
        if traffic is not None:
            traffic.stop()
        if query is not None:
            query.stop()
        prometheus.stop()
        metrics.close()
    assert prometheus.process.returncode is not None
