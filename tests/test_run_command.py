"""``quotastream run`` and ``simulate`` as a user runs them: embedded servers, simulated traffic,
the live view in a real terminal (tmux), and a stop that leaves nothing behind and prints no
stack trace, error or progress bar."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

import pytest
import yaml
from kafka import KafkaConsumer, TopicPartition

from streaming.commands.exit_codes import EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE
from streaming.kafka_broker import FETCH_KAFKA, LIBS_VARIABLE, kafka_version
from streaming.services import LocalService, free_port

REPO = Path(__file__).resolve().parent.parent
QUOTASTREAM = str(Path(sys.executable).with_name("quotastream"))
#: What a clean run never prints: a Java or Python stack trace, an error line, a pandas
#: deprecation from the workers, Spark's console progress bar.
NOISE = ("Exception", "Traceback", "ERROR", "FutureWarning", "[Stage")


def servers_left(output: str) -> list[str]:
    """The servers the run said it started (its "embedded:" line) that still listen."""
    started = re.search(r"broker (127\.0\.0\.1:\d+), Redis (127\.0\.0\.1:\d+)", output)
    assert started is not None, output
    listening = []
    for address in started.groups():
        host, port = address.rsplit(":", 1)
        try:
            with socket.create_connection((host, int(port)), timeout=5):
                listening.append(address)
        except OSError:
            pass
    return listening


def embedded_line(output: str) -> str:
    """The run's line that names the servers it started: among its first lines."""
    first = output.splitlines()[:3]
    [line] = [line for line in first if line.startswith("embedded:")] or [repr(first)]
    return line


def noise_in(output: str) -> list[str]:
    return [line for line in output.splitlines() if any(word in line for word in NOISE)]


def test_embedded_default_decides_throttles_quietly_and_cleans_up(tmp_path: Path) -> None:
    errors = tmp_path / "stderr"
    with errors.open("w") as stderr:
        run = subprocess.Popen(
            [QUOTASTREAM, "run"], cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
        try:
            # Spark's start and first batches take half a minute on a quiet 2-core machine,
            # far more on a busy one: the run is watched until it has decided, then stopped as
            # a service manager stops it.
            summaries = Summaries(run, 600)
            summaries.wait_until(decided_a_cluster)
            run.send_signal(signal.SIGTERM)
            assert run.wait(timeout=120) == EXIT_OK, errors.read_text()[-3000:]
        finally:
            run.kill()
    output = summaries.to_the_end() + errors.read_text()
    assert noise_in(output) == [], output
    assert summaries.lines[-1].startswith("quotastream: final: "), summaries.lines[-3:]
    assert embedded_line(errors.read_text()).startswith(
        f"embedded: Apache Kafka {kafka_version()} broker 127.0.0.1:"
    )
    assert servers_left(errors.read_text()) == []
    checkpoint = re.search(r"checkpoint (\S+)", errors.read_text())
    assert checkpoint is not None
    assert not Path(checkpoint.group(1)).exists()


def decided_a_cluster(summaries: list[str]) -> bool:
    """A cluster, not a toy: of ~300 clients under two dozen users on five brokers, a score are
    near or over their limits at once (the entities Redis holds: docs/redis.md), and the
    simulated tiered-storage backlog (3 x 8 MiB/s against 20 MiB/s for 40 s of each minute)
    has gone over its limit."""
    written = [re.search(r"(\d+) entities written", line) for line in summaries]
    return any(int(found.group(1)) >= 10 for found in written if found) and any(
        "remote_copy=" in line.partition("over limit:")[2] for line in summaries
    )


class Summaries:
    """What a run prints to a pipe (a summary line a second once it runs), read as it comes by
    a thread of its own, so that a run that prints nothing cannot hold the test past its
    deadline."""

    def __init__(self, run: subprocess.Popen[str], timeout_s: float) -> None:
        self.lines: list[str] = []
        self._deadline = time.monotonic() + timeout_s
        self._printed: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, args=(run.stdout,), daemon=True).start()

    def _pump(self, stdout: TextIO) -> None:
        for line in stdout:
            self._printed.put(line)
        self._printed.put("")  # the end

    def wait_until(self, done: Callable[[list[str]], bool]) -> None:
        """Reads lines until ``done`` says so; fails past the deadline or if the run ends."""
        while not done(self.lines):
            left = self._deadline - time.monotonic()
            assert left > 0, f"not there in time: {self.lines[-3:]}"
            try:
                line = self._printed.get(timeout=left)
            except queue.Empty:
                continue
            assert line, f"the run ended first: {self.lines[-3:]}"
            self.lines.append(line.rstrip("\n"))

    def to_the_end(self) -> str:
        """Everything the run printed, once it has ended."""
        while line := self._printed.get(timeout=60):
            self.lines.append(line.rstrip("\n"))
        return "".join(line + "\n" for line in self.lines)


class Terminal:
    """A tmux server of this test's own: one window of a fixed size, kept after its command
    exits so that its status and screen can be read."""

    def __init__(self, command: str, width: int = 160, height: int = 48) -> None:
        self._tmux = ["tmux", "-L", f"quotastream-test-{uuid.uuid4().hex[:8]}", "-f", "/dev/null"]
        self._call("new-session", "-d", "-s", "run", "-x", str(width), "-y", str(height))
        self._call("set-option", "-g", "history-limit", "100000")
        self._call("set-option", "-g", "remain-on-exit", "on")
        self._call("respawn-pane", "-k", "-t", "run", command)

    def _call(self, *args: str) -> str:
        return subprocess.run(
            [*self._tmux, *args], capture_output=True, text=True, check=True, timeout=30
        ).stdout

    def screen(self) -> str:
        return self._call("capture-pane", "-p", "-t", "run")

    def everything(self) -> str:
        """The screen and all that scrolled off it."""
        return self._call("capture-pane", "-p", "-S", "-", "-t", "run")

    def ctrl_c(self) -> None:
        self._call("send-keys", "-t", "run", "C-c")

    def exit_status(self) -> int | None:
        """The command's exit status once it has exited (128 + N if signal N ended it)."""
        dead, status, killed_by = (
            self._call(
                "display", "-p", "-t", "run", "#{pane_dead}:#{pane_dead_status}:#{pane_dead_signal}"
            )
            .strip()
            .split(":")
        )
        if dead != "1":
            return None
        return int(status) if status else 128 + int(killed_by)

    def close(self) -> None:
        subprocess.run([*self._tmux, "kill-server"], capture_output=True, check=False)


@pytest.fixture
def terminal() -> Iterator[Callable[[str], Terminal]]:
    """Opens terminals running a command; closes them after the test."""
    if shutil.which("tmux") is None:
        pytest.fail("tmux is missing: scripts/bootstrap --test-tools installs it")
    opened: list[Terminal] = []

    def open_terminal(command: str) -> Terminal:
        opened.append(Terminal(command))
        return opened[-1]

    yield open_terminal
    for each in opened:
        each.close()


def wait_for(what: str, deadline_s: float, done: Callable[[], bool], shown: Terminal) -> None:
    deadline = time.monotonic() + deadline_s
    while not done():
        assert time.monotonic() < deadline, f"no {what} in {deadline_s:.0f} s:\n{shown.screen()}"
        time.sleep(0.5)


def test_live_view_in_a_terminal_and_ctrl_c_stops_cleanly(
    terminal: Callable[[str], Terminal],
) -> None:
    run = terminal(f"cd {REPO} && exec {QUOTASTREAM} run")
    # A row of a client quota (the entity may be cut short on a narrow terminal).
    table_row = re.compile(r"│ (produce|fetch)\s+│ user=")

    def table_drawn() -> bool:
        screen = run.screen()
        return "rate B/s" in screen and bool(table_row.search(screen))

    # Spark's start and first batch take a minute on a quiet 2-core machine, far more on a busy one.
    wait_for("live table", 600, table_drawn, run)
    screen = run.screen()
    assert re.search(r"quotastream — \d+ entities written", screen), screen
    for column in ("quota", "entity", "rate B/s", "limit B/s", "use %", "throttle ms"):
        assert column in screen
    run.ctrl_c()
    wait_for("stop after Ctrl-C", 120, lambda: run.exit_status() is not None, run)
    assert run.exit_status() == EXIT_OK
    output = run.everything()
    assert noise_in(output) == [], output
    assert "quotastream: final:" in output
    assert "unreachable" not in output  # the servers outlived the query they served
    assert servers_left(output) == []


def test_run_without_kafka_jars_says_how_to_fetch_them(tmp_path: Path) -> None:
    result = subprocess.run(
        [QUOTASTREAM, "run"],
        cwd=REPO,
        env={**os.environ, LIBS_VARIABLE: str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == EXIT_USAGE, result.stderr
    assert result.stderr.splitlines() == [
        f"quotastream: error: not started: no Apache Kafka jars in {tmp_path}: run "
        f"{FETCH_KAFKA}, or set {LIBS_VARIABLE} to a folder of Kafka's jars"
    ]
    assert result.stdout == ""


def engine_file(tmp_path: Path, bootstrap_servers: str, topic: str) -> Path:
    path = tmp_path / "engine.yaml"
    path.write_text(
        yaml.safe_dump({"kafka": {"bootstrap_servers": bootstrap_servers, "topics": [topic]}})
    )
    return path


def test_simulate_stops_by_itself_after_its_duration(kafka: LocalService, tmp_path: Path) -> None:
    topic = "simulated.duration"
    engine = engine_file(tmp_path, kafka.address, topic)
    duration_s = 3
    result = subprocess.run(
        [QUOTASTREAM, "simulate", "--engine-config", str(engine), "--duration", str(duration_s)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == EXIT_OK, result.stderr
    assert noise_in(result.stdout + result.stderr) == []
    consumer = KafkaConsumer(bootstrap_servers=kafka.address, consumer_timeout_ms=3000)
    partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    seconds = {json.loads(record.value)["ts"] // 1000 for record in consumer}
    consumer.close()
    # One second of the scenario per wall-clock second, and exactly as many as asked for, however
    # slowly the machine publishes them.
    assert len(seconds) == duration_s, sorted(seconds)
    assert max(seconds) - min(seconds) == duration_s - 1, sorted(seconds)


def test_run_stops_by_itself_after_its_duration(
    kafka: LocalService, redis_server: LocalService, tmp_path: Path
) -> None:
    engine = tmp_path / "engine.yaml"
    settings = {
        "kafka": {"bootstrap_servers": kafka.address, "topics": ["run.duration"]},
        "redis": {"host": redis_server.host, "port": redis_server.port, "key_prefix": "duration"},
        "spark": {"checkpoint": str(tmp_path / "checkpoint")},
        "metrics": {"port": 0},
    }
    engine.write_text(yaml.safe_dump(settings))
    duration_s = 3
    result = subprocess.run(
        [QUOTASTREAM, "run", "--engine-config", str(engine), "--duration", str(duration_s)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == EXIT_OK, result.stderr[-3000:]
    assert noise_in(result.stdout + result.stderr) == []
    *watched, final = result.stdout.splitlines()
    assert final.startswith("quotastream: final: "), result.stdout
    # A summary a second while it watched, from the moment the query ran.
    assert 1 <= len(watched) <= duration_s + 1, watched


def test_simulate_fails_in_one_line_when_kafka_is_unreachable(tmp_path: Path) -> None:
    nobody = f"127.0.0.1:{free_port()}"
    engine = engine_file(tmp_path, nobody, "simulated.nowhere")
    # The command gives up on a silent broker after the preflight timeout, which no option
    # sets: one second instead of its ten keeps the wait short, the process and its output real.
    shim = (
        "import sys; from streaming.commands import preflight; preflight.DEFAULT_TIMEOUT_S = 1.0; "
        "from streaming.commands.cli import main; "
        f"sys.exit(main(['simulate', '--engine-config', {str(engine)!r}, '--duration', '5']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", shim],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == EXIT_UNREACHABLE
    [line] = result.stderr.splitlines()
    assert line.startswith(f"quotastream: error: Kafka at {nobody}: "), line
    assert "simulating" not in result.stdout
