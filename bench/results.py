"""Benchmark results: one JSON line per run, appended to bench/results/<name>.jsonl.

``QUOTASTREAM_BENCH_RESULTS`` names another directory: the test suite's smoke runs of every
script (``tests/test_bench_smoke.py``) write there, so that their figures, which mean nothing,
never join the repository's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

RESULTS = Path(
    os.environ.get("QUOTASTREAM_BENCH_RESULTS") or Path(__file__).resolve().parent / "results"
)


def record(name: str, result: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    with (RESULTS / f"{name}.jsonl").open("a") as out:
        out.write(json.dumps(result) + "\n")
    print(json.dumps(result, indent=2))
