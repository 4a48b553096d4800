"""Reading Prometheus's text format in tests."""

from __future__ import annotations

import re


def samples(text: str, name: str) -> dict[str, float]:
    """``{labels: value}`` of one metric in the exposition text."""
    found = {}
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}(\{{.*\}})? (\S+)", line)
        if match:
            found[match.group(1) or ""] = float(match.group(2))
    return found
