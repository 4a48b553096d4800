"""``quotastream run`` as a user runs it: embedded servers, simulated traffic, live summary."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def servers_running() -> set[str]:
    found = subprocess.run(
        ["pgrep", "-a", "-f", "tansu broker|redis-server|valkey-server"],
        capture_output=True,
        text=True,
        check=False,
    )
    return set(found.stdout.splitlines())


def test_embedded_default_decides_throttles_and_cleans_up() -> None:
    before = servers_running()
    result = subprocess.run(
        [str(Path(sys.executable).with_name("quotastream")), "run", "--duration", "45"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summaries = [line for line in result.stdout.splitlines() if line.startswith("quotastream:")]
    assert summaries, result.stdout
    decided = re.search(r"(\d+) entities decided", summaries[-1])
    assert decided is not None
    assert int(decided.group(1)) > 10
    # The simulated tiered-storage backlog (3 x 8 MiB/s against 20 MiB/s for 40 s of each
    # minute) goes over its limit while the run watches.
    assert any("remote_copy=1" in line.split("over limit:")[1] for line in summaries)
    assert "StackOverflowError" not in result.stderr
    assert servers_running() == before
