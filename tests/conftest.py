from __future__ import annotations

import ast
import functools
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pytest
import yaml
from hypothesis import settings

from streaming.commands.cli import main
from streaming.engine.sinks import close_cached_clients
from streaming.kafka_broker import (
    KafkaCluster,
    KafkaNode,
    start_kafka,
    start_kafka_cluster,
    tiered_storage_properties,
)
from streaming.services import LocalService, start_redis
from tests.servers import wait_until_registered
from tests.support.replay import ReplayRun, ReplayRunner

if TYPE_CHECKING:
    # Imported where the fixture starts Spark: the pure suite (``-m "not spark and not servers"``)
    # loads no pyspark (tests/test_pure_suite.py).
    from pyspark.sql import SparkSession

# CI runs the same examples every time so that a red build always reproduces; locally, hypothesis
# explores new ones on each run, and ``scripts/test --explore`` (nightly-style) draws new ones in
# CI too (ten times as many where a test does not set its own count).
# No per-example deadline in any profile: on two shared cores a wall-clock limit fails a correct
# test whenever the machine is busy (test_remote_segments did, under load); speed lives in bench/.
settings.register_profile("local", deadline=None)
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
settings.register_profile(
    "explore",
    derandomize=False,
    print_blob=True,
    deadline=None,
    max_examples=10 * settings().max_examples,
)
if os.environ.get("QUOTASTREAM_HYPOTHESIS") == "explore":
    settings.load_profile("explore")
elif os.environ.get("CI"):
    settings.load_profile("ci")
else:
    settings.load_profile("local")


#: Each test file's layer, by what it tests (pyproject.toml's markers say what each one holds).
#: A file missing here fails collection, so that every new file is given one.
LAYERS: Final[Mapping[str, str]] = {
    "test_config.py": "core",
    "test_copy_fairness.py": "core",
    "test_core.py": "core",
    "test_events.py": "core",
    "test_leader_epochs.py": "core",
    "test_live_config.py": "core",
    "test_quotas_file.py": "core",
    "test_remote_log.py": "core",
    "test_replay_kafka.py": "core",
    "test_replication_plan.py": "core",
    "test_resolution.py": "core",
    "test_rolling.py": "core",
    "test_throttle.py": "core",
    "test_throttle_timers.py": "core",
    "test_keyed_table.py": "core",
    "test_written_decisions.py": "core",
    "test_throttled_time.py": "core",
    "test_timing_wheel.py": "core",
    "test_agent_client.py": "agent",
    "test_agent_live_config.py": "agent",
    "test_outage_clock.py": "agent",
    "test_proxy_protocol.py": "agent",
    "test_proxy_connection.py": "agent",
    "test_proxy_hold_window.py": "agent",
    "test_import_graph.py": "project",
    "test_proxy_holds.py": "agent",
    "test_remote_segments.py": "agent",
    "test_throttles.py": "agent",
    "test_counters.py": "agent",
    "test_lineage.py": "agent",
    "test_broker_metrics.py": "agent",
    "test_publisher.py": "agent",
    "test_event_contract.py": "agent",
    "test_redis_contract.py": "agent",
    "test_admin_cli.py": "admin",
    "test_cli.py": "admin",
    "test_cli_help.py": "admin",
    "test_failure_line.py": "admin",
    "test_whatif.py": "admin",
    "test_broker_faults.py": "engine",
    "test_kafka_outage.py": "engine",
    "test_kafka_source.py": "engine",
    "test_metrics.py": "engine",
    "test_offsets.py": "engine",
    "test_outages.py": "engine",
    "test_services.py": "engine",
    "test_soak.py": "engine",
    "test_stages.py": "engine",
    "test_shard_layout.py": "engine",
    "test_worker_heap.py": "engine",
    "test_bad_config.py": "scenario",
    "test_producer_close.py": "scenario",
    "test_chaos.py": "scenario",
    "test_kafka_oracle.py": "scenario",
    "test_prometheus.py": "scenario",
    "test_proxy.py": "scenario",
    "test_proxy_faults.py": "scenario",
    "test_remote_log_metadata.py": "scenario",
    "test_remote_log_bridge.py": "scenario",
    "test_actuator.py": "scenario",
    "test_broker_metrics_cluster.py": "scenario",
    "test_run_command.py": "scenario",
    "test_security.py": "scenario",
    "test_streaming.py": "scenario",
    "test_bench_smoke.py": "project",
    "test_compose_topics.py": "project",
    "test_docker_image.py": "project",
    "test_docs_links.py": "project",
    "test_hypothesis_profiles.py": "project",
    "test_rates.py": "project",
    "test_observability_config.py": "project",
    "test_pure_suite.py": "project",
}

#: What a test file exercises besides its layer, by the packages it imports (pyproject.toml's
#: markers): ``pytest -m proxy`` runs every test of the proxy, whatever its layer.
COMPONENTS: Final[Mapping[str, tuple[str, ...]]] = {
    "proxy": ("quotastream.proxy", "streaming.commands.proxy"),
    "brokers": ("quotastream.brokers", "streaming.commands.brokers"),
}

SPARK: Final = "spark"
SERVERS: Final = "servers"

#: Fixtures that start Spark or server processes, by module and name (modules reuse names such
#: as ``broker``): a test that uses one, directly or through another fixture, is marked.
STARTED_BY_FIXTURE: Final[Mapping[str, str]] = {
    "tests.conftest.spark": SPARK,
    "tests.conftest.kafka": SERVERS,
    "tests.conftest.kafka_cluster": SERVERS,
    "tests.conftest.redis_server": SERVERS,
    "tests.conftest.tiered_cluster": SERVERS,
    "tests.test_agent_client.acl_server": SERVERS,
    "tests.test_kafka_outage.broker": SERVERS,
    "tests.test_kafka_oracle.broker": SERVERS,
    "tests.test_outages.secured_redis": SERVERS,
    "tests.test_proxy.scram_broker": SERVERS,
    "tests.test_proxy.scram_cluster": SERVERS,
    "tests.test_redis_contract.server": SERVERS,
    "tests.test_security.servers": SERVERS,
}

#: Tests that start servers or Spark themselves (``start_*`` in their body, or a ``quotastream``
#: command run in a subprocess), which their fixtures cannot show: file -> tests.
STARTS_SERVERS_ITSELF: Final[Mapping[str, tuple[str, ...]]] = {
    "test_bench_smoke.py": (
        "test_a_benchmark_with_servers_runs",
        "test_a_benchmark_on_spark_runs",
    ),
    "test_agent_client.py": (
        "test_a_stopped_redis_fails_open_at_once_logs_once_and_recovers_on_the_same_port",
        "test_a_hung_redis_answers_within_the_timeout_and_fail_closed_delays",
    ),
    "test_broker_faults.py": (
        "test_offsets_lost_with_the_broker_fail_the_query_naming_them",
        "test_offsets_lost_with_the_broker_are_counted_and_the_new_log_read_when_tolerated",
        "test_a_source_that_never_met_the_broker_waits_one_request_timeout_per_trigger",
        "test_a_broker_back_after_a_long_outage_is_noticed_within_a_second_or_two",
        "test_a_durable_broker_killed_mid_stream_is_waited_out_and_every_record_decided_once",
        "test_an_outage_longer_than_the_limit_fails_the_run_with_one_line",
    ),
    "test_chaos.py": (
        "test_ten_sigkills_of_the_driver_lose_nothing_and_count_nothing_twice",
        "test_a_standalone_cluster_loses_a_worker_mid_stream_and_loses_no_byte",
    ),
    "test_kafka_outage.py": (
        "test_an_outage_is_never_taken_for_lost_offsets_but_a_log_lost_with_it_is_caught",
    ),
    "test_outages.py": (
        "test_a_write_waits_out_an_outage_and_lands_soon_after_redis_returns",
        "test_a_refused_login_is_not_retried",
    ),
    "test_prometheus.py": ("test_prometheus_sees_a_throttled_client",),
    "test_run_command.py": (
        "test_embedded_default_decides_throttles_quietly_and_cleans_up",
        "test_live_view_in_a_terminal_and_ctrl_c_stops_cleanly",
    ),
    "test_actuator.py": (
        "test_an_actuator_killed_mid_move_and_started_again_leaves_nothing_behind",
    ),
    "test_remote_log_bridge.py": (
        "test_the_bridge_resumes_from_its_position_and_dead_letters_what_it_cannot_follow",
    ),
    "test_proxy_faults.py": (
        "test_clients_reconnect_through_the_proxy_after_a_broker_restart",
        "test_with_redis_down_the_failure_policy_decides",
        "test_traffic_flows_while_the_events_topic_is_unreachable_and_drops_are_counted",
        "test_clients_reconnect_after_the_proxy_restarts",
    ),
    "test_services.py": (
        "test_redis_starts_serves_and_stops",
        "test_two_servers_get_different_ports",
        "test_free_ports_are_outside_the_range_outgoing_connections_take",
        "test_an_apache_kafka_broker_starts_takes_records_and_keeps_them_across_a_restart",
        "test_a_broker_started_anew_on_a_port_has_an_empty_log",
    ),
    "test_streaming.py": (
        "test_a_redis_outage_stalls_the_query_and_every_event_is_decided_after_it",
        "test_a_redis_outage_past_max_outage_fails_the_query_and_a_restart_resumes_exactly",
    ),
}
STARTS_SPARK_ITSELF: Final[Mapping[str, tuple[str, ...]]] = {
    "test_bench_smoke.py": ("test_a_benchmark_on_spark_runs",),
    "test_broker_faults.py": ("test_an_outage_longer_than_the_limit_fails_the_run_with_one_line",),
    "test_chaos.py": (
        "test_ten_sigkills_of_the_driver_lose_nothing_and_count_nothing_twice",
        "test_a_standalone_cluster_loses_a_worker_mid_stream_and_loses_no_byte",
    ),
    "test_run_command.py": (
        "test_embedded_default_decides_throttles_quietly_and_cleans_up",
        "test_live_view_in_a_terminal_and_ctrl_c_stops_cleanly",
    ),
    "test_security.py": ("test_a_run_over_tls_as_the_engine_user_decides_and_writes_no_secret",),
}
STARTED_BY_TEST: Final = {SERVERS: STARTS_SERVERS_ITSELF, SPARK: STARTS_SPARK_ITSELF}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks each test with its file's layer, and with ``spark``/``servers`` if it starts them."""
    tests = Path(__file__).parent
    gone = sorted(name for name in LAYERS if not (tests / name).is_file())
    if gone:
        raise pytest.UsageError(f"tests/conftest.py LAYERS names files that do not exist: {gone}")
    unplaced = sorted({item.path.name for item in items if item.path.name not in LAYERS})
    if unplaced:
        raise pytest.UsageError(
            f"no layer for {', '.join(unplaced)}: add each to LAYERS in tests/conftest.py "
            f"(one of {', '.join(sorted(set(LAYERS.values())))}; see the README's testing section)"
        )
    functions = [item for item in items if isinstance(item, pytest.Function)]
    # A renamed test or fixture must not lose its marker unnoticed.
    modules = {function.module.__name__: function.module for function in functions}
    modules[__name__] = sys.modules[__name__]
    named = [*STARTED_BY_FIXTURE] + [
        f"tests.{file.removesuffix('.py')}.{test}"
        for by_file in STARTED_BY_TEST.values()
        for file, names in by_file.items()
        for test in names
    ]
    stale = sorted(
        name
        for name in named
        if name.rpartition(".")[0] in modules
        and not hasattr(modules[name.rpartition(".")[0]], name.rpartition(".")[2])
    )
    if stale:
        raise pytest.UsageError(
            f"tests/conftest.py names tests or fixtures that do not exist: {stale}"
        )
    for item in items:
        item.add_marker(LAYERS[item.path.name])
        for component in _components(item.path):
            item.add_marker(component)
    for function in functions:
        for started in _started(function):
            function.add_marker(started)


@functools.cache
def _components(path: Path) -> frozenset[str]:
    """The :data:`COMPONENTS` whose packages the test file at ``path`` imports."""
    tree = ast.parse(path.read_bytes())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)} | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    return frozenset(
        component
        for component, packages in COMPONENTS.items()
        for module in imported
        if module is not None
        and any(module == package or module.startswith(f"{package}.") for package in packages)
    )


def _started(test: pytest.Function) -> set[str]:
    """What ``test`` starts itself or through its fixtures: ``spark`` and/or ``servers``."""
    started = {
        marker
        for marker, by_file in STARTED_BY_TEST.items()
        if test.originalname in by_file.get(test.path.name, ())
    }
    # The definition a test gets is the last one: a module's own fixture overrides conftest's.
    fixtures = {
        f"{definitions[-1].func.__module__}.{definitions[-1].func.__qualname__}"
        for name, definitions in test._fixtureinfo.name2fixturedefs.items()
        if name in test.fixturenames
    }
    return started | {
        STARTED_BY_FIXTURE[fixture] for fixture in fixtures & STARTED_BY_FIXTURE.keys()
    }


@pytest.fixture(scope="module", autouse=True)
def _cached_clients_closed() -> Iterator[None]:
    """After each module, the clients that in-process reads and writes cached are closed: one
    left connected to a broker the module stopped reconnects in kafka-python's background thread
    with the global ``random``'s jitter, under the hypothesis tests of later modules."""
    yield
    # The Kafka source imports pyspark: a module that never imported it has no consumers cached.
    kafka_source = sys.modules.get("streaming.engine.kafka_source")
    if kafka_source is not None:
        kafka_source.close_worker_consumers()
    close_cached_clients()


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local Spark for every test that runs queries in this process (it starts in ~10 s)."""
    from streaming.engine.job import local_spark  # noqa: PLC0415 (pyspark: only with Spark)
    from streaming.engine.settings import EngineSettings  # noqa: PLC0415

    session = local_spark(EngineSettings())
    yield session
    session.stop()


@pytest.fixture(scope="session")
def kafka() -> Iterator[KafkaNode]:
    """An Apache Kafka broker on a free loopback port, shared by the whole session: each test
    uses topics of its own. A test that stops, pauses or restarts a broker starts its own."""
    with start_kafka() as service:
        yield service


@pytest.fixture(scope="module")
def kafka_cluster() -> Iterator[KafkaCluster]:
    """Three Apache Kafka nodes forming one cluster (node ids 1-3, each a broker and a voter),
    for what needs replicas: leader moves, restarts. One per test module: a test that stops a
    node starts it again before it ends (``KafkaNode.restart``)."""
    with start_kafka_cluster(3) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def tiered_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """Three Apache Kafka nodes with tiered storage on Kafka's own ``LocalTieredStorage`` (one
    store for all), each exporting its metrics through the Prometheus JMX exporter, registered
    and unfenced. One per test module."""
    store = tmp_path_factory.mktemp("remote-store")
    with start_kafka_cluster(
        3, properties=tiered_storage_properties(store), metrics_exporter=True
    ) as cluster:
        wait_until_registered(cluster.address, 3)
        yield cluster


@pytest.fixture(scope="module")
def redis_server() -> Iterator[LocalService]:
    """A real Redis (or Valkey) server on a free loopback port, one per test module."""
    with start_redis() as service:
        yield service


@pytest.fixture
def replay_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> ReplayRunner:
    """Runs ``quotastream replay`` in-process on events and a quota config given as Python data."""

    def run(
        config: dict[str, Any] | str,
        events: Sequence[dict[str, Any] | str | bytes],
        *extra: str,
    ) -> ReplayRun:
        config_path = tmp_path / "quotas.yaml"
        config_path.write_text(config if isinstance(config, str) else yaml.safe_dump(config))
        events_path = tmp_path / "events.jsonl"
        with events_path.open("wb") as out:
            for event in events:
                line = (
                    event
                    if isinstance(event, bytes)
                    else (event.encode() if isinstance(event, str) else json.dumps(event).encode())
                )
                out.write(line + b"\n")
        dead_letter = tmp_path / "dead-letter.jsonl"
        code = main(
            [
                "replay",
                str(events_path),
                "--config",
                str(config_path),
                "--dead-letter",
                str(dead_letter),
                *extra,
            ]
        )
        captured = capsys.readouterr()
        decisions = [json.loads(line) for line in captured.out.splitlines()]
        rejected = (
            [json.loads(line) for line in dead_letter.read_text().splitlines()]
            if dead_letter.exists()
            else []
        )
        return ReplayRun(code, decisions, rejected, captured.err)

    return run
