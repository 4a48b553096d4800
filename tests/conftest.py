from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import settings
from pyspark.sql import SparkSession

from streaming.cli import main
from streaming.job import local_spark
from streaming.services import LocalService, start_kafka, start_redis
from streaming.settings import EngineSettings

# CI runs the same examples every time so that a red build always reproduces; locally, hypothesis
# explores new ones on each run, and ``scripts/test --explore`` (nightly-style) draws new ones in
# CI too (ten times as many where a test does not set its own count).
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile(
    "explore", derandomize=False, print_blob=True, max_examples=10 * settings().max_examples
)
if os.environ.get("QUOTASTREAM_HYPOTHESIS") == "explore":
    settings.load_profile("explore")
elif os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local Spark for every test that runs queries in this process (it starts in ~10 s)."""
    session = local_spark(EngineSettings())
    yield session
    session.stop()


@pytest.fixture(scope="module")
def kafka() -> Iterator[LocalService]:
    """A Kafka-compatible broker (tansu) on a free loopback port, one per test module."""
    with start_kafka() as service:
        yield service


@pytest.fixture(scope="module")
def redis_server() -> Iterator[LocalService]:
    """A real Redis (or Valkey) server on a free loopback port, one per test module."""
    with start_redis() as service:
        yield service


@dataclass
class ReplayRun:
    exit_code: int
    decisions: list[dict[str, Any]]
    rejected: list[dict[str, Any]]
    stderr: str


ReplayRunner = Callable[..., ReplayRun]


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
