"""Writes examples/events.jsonl: one minute of the simulated traffic
(``streaming/commands/traffic.py``).

Run from the repository root: ``python examples/generate_events.py``. Deterministic (seeded), so
the committed file can be regenerated exactly.
"""

from __future__ import annotations

from pathlib import Path

from state.event_contract import encode
from streaming.commands.traffic import traffic

START = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def main() -> None:
    lines = [encode(event).decode() for event in traffic(seconds=60, start_ms=START)]
    # A few malformed messages, as a misbehaving agent would send them.
    lines.insert(40, '{"kind": "produce", "user": "web", "bytes": "lots"}')
    lines.insert(
        90,
        '{"kind": "produce", "user": "web", "client_id": "x", "broker": 1, '
        '"bytes": -5, "ts": 1767225601000}',
    )
    lines.insert(150, "not json at all")
    Path(__file__).with_name("events.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
