"""Every benchmark in ``bench/`` runs: a benchmark no test runs rots (``bench/agent_lookup.py``
failed at its first lookup for days once only changed decisions were written to Redis).

Each script runs as an operator runs it, in its own process with its own servers, on its
smallest settings, and must exit 0 having appended one result to its file. The result goes to a
temporary directory (``QUOTASTREAM_BENCH_RESULTS``, ``bench/results.py``), never to
``bench/results/``, and so do its temporary files (checkpoints, brokers' logs): the figures of
such a run mean nothing. Spark's scripts take ``--smoke``, the others their size options.

``bench/proxy.py`` runs its closed loop (``bench/proxy_closed_loop.py``) with Kafka's Java
clients alone, for a few seconds. A script without a smoke run here, and not said why in
``NOT_HERE``, fails :func:`test_every_benchmark_has_a_smoke_run`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"

#: Script -> its smallest run's arguments, and fields its result must have.
PURE: Final = {
    "core_throughput.py": (
        "--events 5000 --batch 1000 --clients 100 --repeat 1",
        ["decide_events_per_wall_s", "parse_events_per_s"],
    ),
    "timer_wheel.py": ("--requests 5000 --steps 10 --repeat 1", ["cases"]),
}
WITH_SERVERS: Final = {
    "agent_lookup.py": (
        "--lookups 300 --users 10",
        ["uncached.p50_us", "ceiling.redis_get_p50_us", "cached.p50_us"],
    ),
    "kafka_broker.py": (
        "--runs 1 --records 1000",
        ["single.start_s_median", "cluster.start_s_median"],
    ),
}
WITH_SPARK: Final = {
    "pipeline.py": ("--smoke --rate 500", ["fixed_cost", "single", "latency", "scale"]),
    "state_store.py": ("--smoke", ["variants"]),
    "kafka_source.py": ("--smoke", ["ceiling", "single", "batched"]),
    "keep_up.py": (
        "--clients 1000 --rate 1000 --seconds 2 --per-message 100 --sample-s 1",
        ["processed_events_per_s", "kept_up"],
    ),
    "overload.py": (
        "--cap 10 --events-per-message 10 --seconds 2 --sample-s 1",
        ["peak_backlog_messages", "samples"],
    ),
    "soak.py": (
        "--minutes 0.1 --rate 100 --active 10 --churn-s 3 --sample-s 2",
        ["summary", "samples"],
    ),
    "proxy.py": (
        "--smoke --closed-loop-libraries java --closed-loop-duration-s 3",
        ["produce.ratio", "latency.added_p50_ms", "closed_loop.java.ratio"],
    ),
}
#: Scripts with no smoke run here, and why.
NOT_HERE: Final = {
    "proxy_closed_loop.py": "proxy.py's smoke run runs its closed loop",
}
#: A smoke run that takes longer than this is stuck (they take 1-90 s on two busy cores).
TIMEOUT_S: Final = 600


def test_every_benchmark_has_a_smoke_run() -> None:
    scripts = {
        path.name for path in BENCH.glob("*.py") if 'if __name__ == "__main__":' in path.read_text()
    }
    assert scripts == {*PURE, *WITH_SERVERS, *WITH_SPARK, *NOT_HERE}


def run_smoke(script: str, arguments: str, fields: list[str], tmp_path: Path) -> None:
    """Runs ``bench/<script>`` and checks the one result it appended."""
    results, scratch = tmp_path / "results", tmp_path / "tmp"
    scratch.mkdir()
    environment = os.environ | {"QUOTASTREAM_BENCH_RESULTS": str(results), "TMPDIR": str(scratch)}
    run = subprocess.run(
        [sys.executable, str(BENCH / script), *arguments.split()],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    output = (run.stdout + run.stderr)[-4000:]
    assert run.returncode == 0, output
    (written,) = results.glob("*.jsonl")
    assert written.name == script.replace(".py", ".jsonl")
    (line,) = written.read_text().splitlines()
    result = json.loads(line)
    assert [field for field in fields if field not in result] == [], result


@pytest.mark.parametrize("script", sorted(PURE))
def test_a_pure_benchmark_runs(script: str, tmp_path: Path) -> None:
    run_smoke(script, *PURE[script], tmp_path)


@pytest.mark.parametrize("script", sorted(WITH_SERVERS))
def test_a_benchmark_with_servers_runs(script: str, tmp_path: Path) -> None:
    run_smoke(script, *WITH_SERVERS[script], tmp_path)


@pytest.mark.parametrize("script", sorted(WITH_SPARK))
def test_a_benchmark_on_spark_runs(script: str, tmp_path: Path) -> None:
    run_smoke(script, *WITH_SPARK[script], tmp_path)
