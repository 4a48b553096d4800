"""The Kafka source's view of the broker, passed from the source to the metrics exporter.

Spark runs a Python data source's driver side (``latestOffset`` and the rest) in a Python process
of its own, started by the driver's JVM; the exporter lives in the driver's Python process. Both
are always on the driver's machine, so the source reports its outage clock
(:class:`quotastream.outage.OutageStatus`) in a small JSON file there, replaced atomically on
each change, and the exporter reads it when it is scraped. Executors do not write it: their
outages are their own reads' (logged where they happen).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

from quotastream.outage import OutageStatus


def write_status(path: str, status: OutageStatus) -> None:
    """Replaces the status file in one step: a reader sees the old status or the new one."""
    folder = os.path.dirname(path) or "."
    with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, suffix=".tmp") as out:
        json.dump(asdict(status), out)
    os.replace(out.name, path)


def read_status(path: Path) -> OutageStatus | None:
    """The last status written; None before the source wrote one (it writes on its first
    outage), or when the file is unreadable."""
    try:
        data = json.loads(path.read_text())
        return OutageStatus(
            since_ms=None if data["since_ms"] is None else int(data["since_ms"]),
            outages=int(data["outages"]),
            failures=int(data["failures"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
