"""The pure tests load no pyspark: ``tests/conftest.py`` imports it only in the fixture that
starts Spark, so the files of pure tests (the rules') are collected and run without it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import LAYERS

ROOT = Path(__file__).resolve().parent.parent
#: The layer whose files hold only pure tests (pyproject.toml's markers).
PURE_LAYERS = ("core",)

_COLLECT = """
import sys
import pytest
code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]])
print("pyspark modules:", sorted(name for name in sys.modules if name.startswith("pyspark")))
sys.exit(code)
"""


def test_the_pure_layers_files_are_collected_without_pyspark() -> None:
    files = [f"tests/{name}" for name, layer in sorted(LAYERS.items()) if layer in PURE_LAYERS]
    done = subprocess.run(
        [sys.executable, "-c", _COLLECT, *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "pyspark modules: []" in done.stdout, done.stdout[-3000:]
