"""Events per second of the pure core: recording and deciding, on one core.

Builds 1M synthetic, already-validated events (a columnar frame like the validator's output)
across every quota type, then times ``QuotaCore.decide`` over them in batches. Parsing JSON is
timed separately: it is per message by nature and not part of "record and decide".

    python bench/core_throughput.py [--events 1000000] [--batch 100000] [--clients 10000]

Results are appended as one JSON line to bench/results/core_throughput.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pandas as pd
from results import record  # bench/ is on sys.path when a script in it runs

from state.config import parse_quota_config
from state.core import QuotaCore
from state.encoding import decode_tables, encode_tables
from state.events import EVENT_COLUMNS, KIND_DTYPE, ROLE_DTYPE, parse_events

START = 1_767_225_600_000


def synthetic_events(count: int, clients: int, seed: int = 1) -> pd.DataFrame:
    """Client produce/fetch (80%), remote copy/fetch (10%), replication (10%) over 60 s."""
    rng = np.random.default_rng(seed)
    kind = rng.choice(
        np.array(["produce", "fetch", "remote_copy", "remote_fetch", "replication"], dtype=object),
        size=count,
        p=[0.5, 0.3, 0.05, 0.05, 0.1],
    )
    # Zipf-skewed clients: a few heavy hitters, a long tail.
    client = np.minimum(rng.zipf(1.3, count), clients) - 1
    users = np.array([f"user-{i % max(clients // 4, 1)}" for i in range(clients)], dtype=object)
    client_ids = np.array([f"client-{i}" for i in range(clients)], dtype=object)
    client_side = (kind == "produce") | (kind == "fetch")
    topic_side = ~client_side
    frame = pd.DataFrame(
        {
            "position": np.arange(count, dtype=np.int64),
            "index": np.full(count, -1),  # one event per message
            "kind": kind,
            "ts": START + np.sort(rng.integers(0, 60_000, count)),
            "bytes": rng.integers(0, 64_000, count),
            "count": np.ones(count, dtype=np.int64),
            "user": np.where(client_side, users[client], None),
            "client_id": np.where(client_side, client_ids[client], None),
            "broker": rng.integers(0, 12, count),
            "topic": np.where(topic_side, np.array("orders", dtype=object), np.array(None)),
            "partition": np.where(topic_side, rng.integers(0, 64, count), -1),
            "role": np.where(
                kind == "replication",
                rng.choice(np.array(["leader", "follower"], dtype=object), count),
                np.array(None),
            ),
            "replica": np.where(kind == "replication", rng.integers(0, 12, count), -1),
            "in_sync": rng.random(count) < 0.7,
            "leader_epoch": np.full(count, -1),
            "segment_id": np.full(count, None),
            "state": np.full(count, None),
            "epochs": np.full(count, None),
            "end_offset": np.full(count, -1),
            "log_end_offset": np.full(count, -1),
        }
    )
    # The same dtypes the validator emits.
    frame["kind"] = frame["kind"].astype(KIND_DTYPE)
    frame["role"] = frame["role"].astype(ROLE_DTYPE)
    return frame[list(EVENT_COLUMNS)]


CONFIG = {
    "clients": [
        {"user": "<default>", "producer_byte_rate": 1_000_000, "consumer_byte_rate": 2_000_000},
        {"user": "user-0", "client_id": "client-0", "producer_byte_rate": 50_000_000},
        {"client_id": "<default>", "consumer_byte_rate": 500_000},
    ],
    "brokers": {
        "<default>": {
            "remote.log.manager.copy.max.bytes.per.second": 50_000_000,
            "remote.log.manager.fetch.max.bytes.per.second": 80_000_000,
            "leader.replication.throttled.rate": 10_000_000,
            "follower.replication.throttled.rate": 10_000_000,
        }
    },
    "topics": {"orders": {"leader.replication.throttled.replicas": "*"}},
}


@dataclass(frozen=True)
class Timing:
    wall_s: float
    cpu_s: float  # this process's CPU time: excludes time the VM's CPU was stolen
    throttled: int


def time_decide(events: pd.DataFrame, batch: int) -> Timing:
    core = QuotaCore(parse_quota_config(CONFIG, "bench config"))
    wall, cpu = time.perf_counter(), time.process_time()
    throttled = 0
    for first in range(0, len(events), batch):
        decisions = core.decide(events.iloc[first : first + batch])
        throttled += int((decisions["throttle_ms"] > 0).sum())
    return Timing(time.perf_counter() - wall, time.process_time() - cpu, throttled)


def time_parse(events: pd.DataFrame, sample: int) -> float:
    rows = events.head(sample).drop(columns="position").to_dict(orient="records")
    payloads = [
        json.dumps({k: v for k, v in row.items() if not pd.isna(v) and v != -1}).encode()
        for row in rows
    ]
    started = time.perf_counter()
    parsed = parse_events(payloads)
    elapsed = time.perf_counter() - started
    assert parsed.rejected.empty, parsed.rejected.head()
    return sample / elapsed


def time_encoding(events: pd.DataFrame) -> dict[str, float]:
    """Encode/decode cost and size of a shard's state (all quota tables) after all events."""
    core = QuotaCore(parse_quota_config(CONFIG, "bench config"))
    core.decide(events)
    tables = {quota.value: table for quota, table in core.tables.items()}
    entities = sum(len(table) for table in tables.values())
    started = time.perf_counter()
    blob = encode_tables(tables)
    encoded = time.perf_counter()
    decode_tables(blob)
    decoded = time.perf_counter()
    return {
        "state_entities": entities,
        "state_bytes": len(blob),
        "state_bytes_per_entity": round(len(blob) / max(entities, 1), 1),
        "state_encode_ms": round((encoded - started) * 1e3, 2),
        "state_decode_ms": round((decoded - encoded) * 1e3, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    events = synthetic_events(args.events, args.clients)
    # This VM's wall-clock timings vary run to run (CPU steal, up to half a core seen), so
    # report medians of wall and of process CPU time.
    batched = [time_decide(events, args.batch) for _ in range(args.repeat)]
    whole = [time_decide(events, len(events)) for _ in range(args.repeat)]

    def rate(runs: list[Timing], field: str) -> int:
        seconds = float(statistics.median(getattr(run, field) for run in runs))
        return round(int(args.events) / seconds)

    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, python {platform.python_version()}",
        "events": args.events,
        "clients": args.clients,
        "batch": args.batch,
        "repeats": args.repeat,
        "decide_events_per_wall_s": rate(batched, "wall_s"),
        "decide_events_per_cpu_s": rate(batched, "cpu_s"),
        "one_batch_events_per_wall_s": rate(whole, "wall_s"),
        "one_batch_events_per_cpu_s": rate(whole, "cpu_s"),
        "throttled_decisions": batched[0].throttled,
        "parse_events_per_s": round(time_parse(events, min(args.events, 200_000))),
        **time_encoding(events),
    }
    record("core_throughput", result)


if __name__ == "__main__":
    main()
