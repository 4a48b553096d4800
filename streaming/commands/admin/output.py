"""How the admin commands print values, JSON and warnings."""

from __future__ import annotations

import json
import math
import sys


def as_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e18:
        return str(int(value))
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.3f}".rstrip("0").rstrip(".")
    return str(value)


def print_json(value: object) -> None:
    print(json.dumps(value, sort_keys=False))


def warn(message: str) -> None:
    print(f"quotastream: WARNING: {message}", file=sys.stderr)
