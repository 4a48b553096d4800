"""How long an enforcement agent's lookup of one client takes, against its ceiling: a bare GET.

An agent on a broker's request path asks ``QuotaClient.for_client("produce", user, client_id,
broker)`` before each request. That call resolves the client's counter locally (Kafka's
precedence over the quota configuration, walked for a client's first lookup and remembered
after it by ``state.quota_rules.QuotaRules``) and reads the counter's decision together with
the published configuration version, in one round trip. Its floor is the round trip itself, so
the same run times a bare redis-py ``GET`` of the same decision key, interleaved lookup by lookup
with the client's call: both see the same machine load, and the ratio is what the client adds.

A real Redis (``streaming.services.start_redis``) on loopback holds one decision per user,
written by the engine's own sink; the configuration gives every user a ``<default>`` produce
quota, so each of the 100 users' clients counts under ``user=U,broker=1``. 5,000 lookups visit
the users in a seeded random order, each with one of a few client-ids. The cached client
(``CachedQuotaClient``, staleness bound 60 s) is timed over the same order after one pass has
filled it: every timed call is a cache hit, which does no I/O.

    python bench/agent_lookup.py [--lookups 5000] [--users 100] [--seed 1]

Results are appended as one JSON line to bench/results/agent_lookup.jsonl.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime

import pyarrow as pa
import redis
from results import record  # bench/ is on sys.path when a script in it runs

from quotastream import CachedQuotaClient, CacheSettings, QuotaClient
from quotastream.redis_contract import decision_key
from state.config import parse_quota_config
from streaming.engine.sinks import SinkSettings, write_batches
from streaming.engine.stages import DECISION, DECISION_SCHEMA
from streaming.services import start_redis

PREFIX = "bench"
BROKER = 1
CLIENT_IDS = ("app-0", "app-1", "app-2")
CONFIG = parse_quota_config(
    {"clients": [{"user": "<default>", "producer_byte_rate": 1_000_000}]}, "agent lookup bench"
)
WARMUP = 200
#: How long the decisions stay in Redis: longer than any run.
KEPT_MS = 600_000


def decision_row(entity: str, now_ms: int) -> dict[str, object]:
    """A throttled produce decision, as the engine's staging emits it: to be written (the sink
    writes only the rows the shard marks, ``docs/redis.md``), and kept for the whole run. Every
    other column of ``DECISION_SCHEMA`` null."""
    return dict.fromkeys(DECISION_SCHEMA.names) | {
        "row_type": DECISION,
        "quota": "produce",
        "entity": entity,
        "ts": now_ms,
        "rate": 1_500_000.0,
        "limit": 1_000_000.0,
        "throttle_ms": 500,
        "until": now_ms + 500,
        "exceeded": True,
        "window_ms": 10_000,
        "config_version": 0,
        "mode": "enforced",
        "write": True,
        "expire_at": now_ms + KEPT_MS,
    }


def micros(call: Callable[..., object], *args: object) -> float:
    started = time.perf_counter_ns()
    call(*args)
    return (time.perf_counter_ns() - started) / 1000


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return round(ordered[min(int(fraction * len(ordered)), len(ordered) - 1)], 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lookups", type=int, default=5_000)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    users = [f"user-{n}" for n in range(args.users)]
    order = [(rng.choice(users), rng.choice(CLIENT_IDS)) for _ in range(args.lookups)]
    with start_redis() as server:
        now_ms = int(time.time() * 1000)
        rows = [decision_row(f"user={user},broker={BROKER}", now_ms) for user in users]
        sink = SinkSettings.local(server.host, server.port, key_prefix=PREFIX, keep_ms=KEPT_MS)
        (written,) = write_batches(iter([pa.RecordBatch.from_pylist(rows, DECISION_SCHEMA)]), sink)
        # Each user's decision is in Redis, or every lookup below would time a miss.
        assert written.to_pylist() == [{"decisions": len(rows), "rejects": 0}], written

        bare = redis.Redis(host=server.host, port=server.port)
        client = QuotaClient.connect(server.host, server.port, PREFIX, CONFIG)
        for user, client_id in order[:WARMUP]:  # connections open, code paths warm
            assert client.for_client("produce", user, client_id, BROKER) is not None
            bare.get(decision_key(PREFIX, "produce", f"user={user},broker={BROKER}"))
        gets: list[float] = []
        uncached: list[float] = []
        for user, client_id in order:
            key = decision_key(PREFIX, "produce", f"user={user},broker={BROKER}")
            gets.append(micros(bare.get, key))
            uncached.append(micros(client.for_client, "produce", user, client_id, BROKER))

        settings = CacheSettings(max_staleness_ms=60_000, fail_open_staleness_ms=60_000)
        cache = CachedQuotaClient.connect(server.host, server.port, PREFIX, CONFIG, settings)
        for user, client_id in order:  # fills the cache: the timed pass only hits it
            assert cache.for_client("produce", user, client_id, BROKER).decision is not None
        cached = [
            micros(cache.for_client, "produce", user, client_id, BROKER)
            for user, client_id in order
        ]

    get_p50 = percentile(gets, 0.5)
    uncached_p50 = percentile(uncached, 0.5)
    record(
        "agent_lookup",
        {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()} {os.cpu_count()} cpu, "
            f"python {platform.python_version()}, redis-py {redis.__version__}",
            "lookups": args.lookups,
            "users": args.users,
            "uncached.p50_us": uncached_p50,
            "uncached.p99_us": percentile(uncached, 0.99),
            "cached.p50_us": percentile(cached, 0.5),
            "cached.p99_us": percentile(cached, 0.99),
            "ceiling.redis_get_p50_us": get_p50,
            "ceiling.redis_get_p99_us": percentile(gets, 0.99),
            "uncached_p50_over_get_p50": round(uncached_p50 / get_p50, 2),
            "uncached_mean_us": round(statistics.fmean(uncached), 1),
        },
    )


if __name__ == "__main__":
    main()
