"""``quotastream replay`` as a user runs it: exit codes, messages, inputs and outputs."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import KafkaConsumer, TopicPartition

from state.events import parse_events
from streaming.commands.cli import main
from streaming.commands.exit_codes import EXIT_FAILURE, EXIT_USAGE
from streaming.services import LocalService
from tests.support.factories import BASE, fetch, produce, remote, replication
from tests.support.replay import ReplayRunner

REPO = Path(__file__).resolve().parent.parent
CONFIG = {
    "clients": [
        {"user": "<default>", "producer_byte_rate": 2000, "consumer_byte_rate": 3000},
        {"user": "u1", "producer_byte_rate": 500},
    ],
    "brokers": {
        "<default>": {
            "remote.log.manager.copy.max.bytes.per.second": 4000,
            "leader.replication.throttled.rate": 1500,
        }
    },
    "topics": {"t": {"leader.replication.throttled.replicas": "*"}},
}


def mixed_events(seed: int, count: int) -> list[dict[str, object]]:
    """``count`` random events, four a second on average: dense enough to throttle."""
    rng = random.Random(seed)
    makers = [
        lambda ts: produce(
            f"u{rng.randrange(3)}",
            f"c{rng.randrange(2)}",
            rng.randrange(3000),
            ts,
            broker=rng.randrange(2),
        ),
        lambda ts: fetch(f"u{rng.randrange(3)}", "c0", rng.randrange(3000), ts),
        lambda ts: remote("remote_copy", rng.randrange(2), rng.randrange(5000), ts),
        lambda ts: replication(
            rng.randrange(2),
            "leader",
            "t",
            rng.randrange(3),
            5,
            rng.random() < 0.5,
            rng.randrange(2000),
            ts,
        ),
    ]
    return [rng.choice(makers)(BASE + rng.randrange(count * 250)) for _ in range(count)]


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 10**6), batch=st.integers(1, 20))
def test_decisions_do_not_depend_on_the_batch_size(
    replay_cli: ReplayRunner, seed: int, batch: int
) -> None:
    events = mixed_events(seed, 48)
    whole = replay_cli(CONFIG, events)
    batched = replay_cli(CONFIG, events, "--batch-size", str(batch))
    assert batched.decisions == whole.decisions
    assert len(whole.decisions) == len(events)


def test_bad_config_exits_2_naming_the_key(replay_cli: ReplayRunner) -> None:
    run = replay_cli("clients: [{user: a, producer_byte_rate: -1}]", [])
    assert run.exit_code == EXIT_USAGE
    assert "clients[0].producer_byte_rate: Input should be greater than 0 (got -1)" in run.stderr
    assert run.decisions == []


def test_unreadable_events_file_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "q.yaml"
    config.write_text("{}")
    code = main(["replay", str(tmp_path / "missing.jsonl"), "--config", str(config)])
    assert code == EXIT_FAILURE
    assert "missing.jsonl" in capsys.readouterr().err


def test_missing_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = tmp_path / "e.jsonl"
    events.write_text("")
    assert main(["replay", str(events), "--config", str(tmp_path / "nope.yaml")]) == EXIT_USAGE
    assert "nope.yaml: file not found" in capsys.readouterr().err


def test_now_applies_the_engine_bounds(replay_cli: ReplayRunner, tmp_path: Path) -> None:
    engine = tmp_path / "engine.yaml"
    engine.write_text("events: {max_past_ms: 1000, max_future_ms: 1000}")
    events = [
        produce("a", "b", 1, BASE - 2000),
        produce("a", "b", 1, BASE),
        produce("a", "b", 1, BASE + 2000),
    ]
    without_clock = replay_cli({}, events, "--engine-config", str(engine))
    assert len(without_clock.decisions) == 3
    with_clock = replay_cli({}, events, "--engine-config", str(engine), "--now", str(BASE))
    assert [d["line"] for d in with_clock.decisions] == [2]
    assert [r["reason"] for r in with_clock.rejected] == ["ts_out_of_bounds"] * 2


def test_environment_overrides_the_engine_file(
    replay_cli: ReplayRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = tmp_path / "engine.yaml"
    engine.write_text("events: {max_past_ms: 1000}")
    monkeypatch.setenv("QUOTASTREAM_EVENTS__MAX_PAST_MS", "5000")
    run = replay_cli(
        {}, [produce("a", "b", 1, BASE - 2000)], "--engine-config", str(engine), "--now", str(BASE)
    )
    assert len(run.decisions) == 1


def test_bad_engine_setting_from_the_environment_is_named(
    replay_cli: ReplayRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUOTASTREAM_EVENTS__MAX_PAYLOAD_BYTES", "tiny")
    run = replay_cli({}, [])
    assert run.exit_code == EXIT_USAGE
    assert "events.max_payload_bytes: Input should be a valid integer" in run.stderr
    assert "(got 'tiny')" in run.stderr


def test_console_script_reads_stdin_and_writes_rejects_to_stderr(tmp_path: Path) -> None:
    config = tmp_path / "q.yaml"
    config.write_text("clients: [{user: a, producer_byte_rate: 100}]")
    lines = [json.dumps(produce("a", "c", 5000, BASE)), "{broken"]
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("quotastream")),
            "replay",
            "-",
            "--config",
            str(config),
        ],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    decision = json.loads(result.stdout)
    assert (decision["line"], decision["throttle_ms"]) == (1, 40_000)  # 500 B/s over 10 s
    *rejects, summary = result.stderr.strip().splitlines()
    assert summary == "quotastream: 2 lines, 1 decided, 1 rejected (invalid_json=1)"
    reject = json.loads(rejects[-1])
    assert (reject["line"], reject["reason"], reject["payload"]) == (2, "invalid_json", "{broken")


def test_shipped_example_replays(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "replay",
            str(REPO / "examples" / "events.jsonl"),
            "--config",
            str(REPO / "conf" / "quotas.yaml"),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0
    decisions = [json.loads(line) for line in captured.out.splitlines()]
    throttled = {d["quota"] for d in decisions if d.get("throttle_ms", 0) > 0}
    assert throttled == {"produce", "fetch", "remote_copy", "leader_replication"}
    assert any(d.get("leave_out") for d in decisions)
    assert "3 rejected" in captured.err
    # Numbers as Python (and the Redis values) write them: no digit past a double's precision.
    lines = captured.out.splitlines()
    assert [json.dumps(d, separators=(",", ":")) for d in decisions] == lines


def console_steps(markdown: str) -> list[tuple[str, list[str]]]:
    """The ```console blocks of ``markdown`` as (command, output lines shown) steps, in page
    order; a command starts with ``$ `` and continues over lines ending in a backslash."""
    steps: list[tuple[str, list[str]]] = []
    for block in re.findall(r"^```console\n(.*?)^```$", markdown, flags=re.MULTILINE | re.DOTALL):
        continued = False
        for line in block.splitlines():
            if continued:
                steps[-1] = (f"{steps[-1][0]}\n{line}", [])
            elif line.startswith("$ "):
                steps.append((line[2:], []))
            else:
                steps[-1][1].append(line)
            continued = line.endswith("\\")
    return steps


def test_replay_doc_examples_are_the_real_output(tmp_path: Path) -> None:
    """docs/replay.md's commands, run top to bottom as a reader would, in a directory that has the
    repository's conf/ and examples/; a trailing ``...`` in the doc shows only the first lines."""
    steps = console_steps((REPO / "docs" / "replay.md").read_text())
    assert len(steps) >= 5
    for name in ("conf", "examples"):
        (tmp_path / name).symlink_to(REPO / name)
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    for command, shown in steps:
        result = subprocess.run(
            ["bash", "-o", "pipefail", "-c", command],
            cwd=tmp_path,
            env={**os.environ, "PATH": path},
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        printed = result.stdout.splitlines()
        elided = shown[-1:] == ["..."]
        expected = shown[:-1] if elided else shown
        assert (printed[: len(expected)] if elided else printed) == expected, command


def test_replay_doc_summary_line_is_the_real_one(capsys: pytest.CaptureFixture[str]) -> None:
    example = [
        str(REPO / "examples" / "events.jsonl"),
        "--config",
        str(REPO / "conf" / "quotas.yaml"),
    ]
    assert main(["replay", *example]) == 0
    summary = capsys.readouterr().err.splitlines()[-1]
    assert f"`{summary}`" in (REPO / "docs" / "replay.md").read_text()


@pytest.mark.parametrize("per_message", [1, 8])
def test_simulate_publishes_valid_traffic_to_the_events_topic(
    kafka: LocalService, tmp_path: Path, capsys: pytest.CaptureFixture[str], per_message: int
) -> None:
    topic = f"simulated.events.{per_message}"
    engine = tmp_path / "engine.yaml"
    engine.write_text(
        yaml.safe_dump({"kafka": {"bootstrap_servers": kafka.address, "topics": [topic]}})
    )
    command = ["simulate", "--engine-config", str(engine), "--duration", "2.5"]
    assert main([*command, "--events-per-message", str(per_message)]) == 0
    assert f"simulating traffic to {topic}" in capsys.readouterr().out
    consumer = KafkaConsumer(bootstrap_servers=kafka.address, consumer_timeout_ms=3000)
    partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    values = [record.value for record in consumer]
    consumer.close()
    parsed = parse_events(values)
    assert len(parsed.accepted) > 20  # a couple of seconds of the scenario
    assert parsed.rejected.empty
    assert set(parsed.accepted["kind"].astype(str)) >= {"produce", "fetch", "remote_copy"}
    batched = [value for value in values if value.startswith(b"[")]
    if per_message == 1:
        assert not batched
    else:
        assert len(batched) == len(values)
        assert max(len(json.loads(value)) for value in values) == per_message
        assert len(values) < len(parsed.accepted)


def test_simulate_refuses_fewer_than_one_event_per_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", "--events-per-message", "0"]) == EXIT_USAGE
    assert "--events-per-message must be >= 1, got 0" in capsys.readouterr().err


def test_simulate_names_a_bad_engine_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = tmp_path / "engine.yaml"
    engine.write_text("kafka: {max_offsets_per_trigger: 0}\n")
    assert main(["simulate", "--engine-config", str(engine)]) == EXIT_USAGE
    assert "kafka.max_offsets_per_trigger" in capsys.readouterr().err


def test_brokers_names_a_missing_schema_jar_and_refuses_to_run_with_nothing_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = tmp_path / "engine.yaml"
    jar = tmp_path / "kafka-storage-4.3.1.jar"
    engine.write_text(
        yaml.safe_dump({"brokers": {"remote_log_metadata": {"kafka_storage_jar": str(jar)}}})
    )
    assert main(["brokers", "--engine-config", str(engine)]) == EXIT_USAGE
    error = capsys.readouterr().err
    assert "brokers.remote_log_metadata" in error
    assert f"kafka_storage_jar {str(jar)!r} is not a file" in error

    engine.write_text(yaml.safe_dump({"brokers": {"remote_log_metadata": {"topic": "x"}}}))
    assert main(["brokers", "--engine-config", str(engine)]) == EXIT_USAGE
    assert "kafka_storage_jar is required while enabled" in capsys.readouterr().err

    engine.write_text("")
    assert main(["brokers", "--engine-config", str(engine)]) == EXIT_USAGE
    assert "nothing to run: none of brokers.remote_log_metadata, brokers.actuator" in (
        capsys.readouterr().err
    )
