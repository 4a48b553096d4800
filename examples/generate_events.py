"""Writes examples/events.jsonl: one minute of traffic that exercises every quota.

Run from the repository root: ``python examples/generate_events.py``. Deterministic (seeded), so
the committed file can be regenerated exactly.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

START = 1_767_225_600_000  # 2026-01-01T00:00:00Z
SECONDS = 60


def main() -> None:
    rng = random.Random(2026)
    events: list[dict[str, object]] = []
    for second in range(SECONDS):
        now = START + second * 1000
        # Steady producers well inside the <default> user quota (1 MiB/s).
        for user in ("web", "billing", "search"):
            events.append(
                {
                    "kind": "produce",
                    "user": user,
                    "client_id": f"{user}-app",
                    "broker": rng.randrange(1, 4),
                    "bytes": rng.randrange(100_000, 300_000),
                    "ts": now + rng.randrange(1000),
                }
            )
        # A bulk loader that bursts past its 5 MiB/s quota from second 20 to 30.
        burst = 20 <= second < 30
        events.append(
            {
                "kind": "produce",
                "user": "ingest",
                "client_id": "bulk-loader",
                "broker": 1,
                "bytes": 12_000_000 if burst else 2_000_000,
                "ts": now + 500,
            }
        )
        # Two analytics consumers share their user's 10 MiB/s counter.
        for client in ("spark-1", "spark-2"):
            events.append(
                {
                    "kind": "fetch",
                    "user": "analytics",
                    "client_id": client,
                    "broker": 2,
                    "bytes": rng.randrange(3_000_000, 7_000_000),
                    "ts": now + rng.randrange(1000),
                }
            )
        # A tiered-storage upload backlog on broker 3 (20 MiB/s copy quota): 8 MiB segments.
        for _ in range(3 if second < 40 else 1):
            events.append(
                {
                    "kind": "remote_copy",
                    "broker": 3,
                    "topic": "clicks",
                    "partition": rng.randrange(6),
                    "bytes": 8_388_608,
                    "ts": now + rng.randrange(1000),
                }
            )
        events.append(
            {
                "kind": "remote_fetch",
                "broker": 1,
                "topic": "clicks",
                "partition": 2,
                "bytes": rng.randrange(1_000_000, 4_000_000),
                "ts": now + 250,
                "client_id": "backfill",
            }
        )
        # A partition reassignment of orders-0/1 onto broker 3 under a 3 MiB/s leader throttle:
        # the new replica (out of sync) is left out while the rate is over, the in-sync one never.
        for partition, leader in ((0, 1), (1, 2)):
            for replica, in_sync in ((3, False), (leader % 2 + 1, True)):
                events.append(
                    {
                        "kind": "replication",
                        "broker": leader,
                        "role": "leader",
                        "topic": "orders",
                        "partition": partition,
                        "replica": replica,
                        "in_sync": in_sync,
                        "bytes": rng.randrange(1_000_000, 3_000_000),
                        "ts": now + rng.randrange(1000),
                    }
                )
        if second % 15 == 0:
            events.append(
                {
                    "kind": "remote_segment",
                    "broker": 3,
                    "topic": "clicks",
                    "partition": 0,
                    "leader_epoch": 4,
                    "segment_id": f"seg-{second}",
                    "state": "copy_finished",
                    "bytes": 8_388_608,
                    "ts": now,
                }
            )
    events.sort(key=lambda event: int(str(event["ts"])))
    lines = [json.dumps(event) for event in events]
    # A few malformed messages, as a misbehaving agent would send them.
    lines.insert(40, '{"kind": "produce", "user": "web", "bytes": "lots"}')
    lines.insert(
        90,
        '{"kind": "produce", "user": "web", "client_id": "x", "broker": 1, '
        '"bytes": -5, "ts": 1767225601000}',
    )
    lines.insert(150, "not json at all")
    out = Path(__file__).with_name("events.jsonl")
    out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
