"""CI draws the same hypothesis examples every run (a red build reproduces); ``scripts/test
--explore`` draws new ones, in CI too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_SHOW = (
    "import tests.conftest; from hypothesis import settings; "
    "print(settings.default.derandomize, settings.default.max_examples)"
)


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({"CI": "true"}, "True 100"),
        ({"CI": "true", "QUOTASTREAM_HYPOTHESIS": "explore"}, "False 1000"),
        ({}, "False 100"),
    ],
)
def test_the_profile_follows_the_environment(environment: dict[str, str], expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "QUOTASTREAM_HYPOTHESIS")}
    shown = subprocess.run(
        [sys.executable, "-c", _SHOW],
        env={**env, **environment},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.strip() == expected
