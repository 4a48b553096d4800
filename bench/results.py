"""Benchmark results: one JSON line per run, appended to bench/results/<name>.jsonl."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def record(name: str, result: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    with (RESULTS / f"{name}.jsonl").open("a") as out:
        out.write(json.dumps(result) + "\n")
    print(json.dumps(result, indent=2))
