"""CI draws the same hypothesis examples every run (a red build reproduces); ``scripts/test
--explore`` draws new ones, in CI too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Each environment and the default profile it must load: derandomize, max_examples, deadline
#: (none: a wall-clock limit per example fails correct tests on a busy machine).
PROFILES: list[tuple[dict[str, str], str]] = [
    ({}, "False 100 None"),
    ({"CI": "true"}, "True 100 None"),
    ({"CI": "true", "QUOTASTREAM_HYPOTHESIS": "explore"}, "False 1000 None"),
]
# One process for every environment: importing tests.conftest (the engine's CLI with it) is seconds,
# reloading it is not. The default profile goes back in before each reload, as in a new process.
_SHOW = """
import importlib, json, os, sys
from hypothesis import settings
for environment in json.loads(sys.argv[1]):
    for name in ("CI", "QUOTASTREAM_HYPOTHESIS"):
        os.environ.pop(name, None)
    os.environ.update(environment)
    settings.load_profile("default")
    if "tests.conftest" in sys.modules:
        importlib.reload(sys.modules["tests.conftest"])
    else:
        importlib.import_module("tests.conftest")
    print(settings.default.derandomize, settings.default.max_examples, settings.default.deadline)
"""


def test_the_profile_follows_the_environment() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "QUOTASTREAM_HYPOTHESIS")}
    shown = subprocess.run(
        [sys.executable, "-c", _SHOW, json.dumps([environment for environment, _ in PROFILES])],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.splitlines() == [expected for _, expected in PROFILES]
