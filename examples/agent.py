"""A reference enforcement agent: a produce proxy loop that holds a client while it is throttled.

Each "request" of the client (``--user``, ``--client-id``, ``--broker``; one every
``--interval-ms``) is checked against the engine's decision before it is forwarded: the agent
resolves the client's entity locally (the quota file, as the engine does), asks the cached client
for the delay (no round trip while the cached decision is younger than ``--max-staleness-ms``) and
holds the request that long. When Redis is down it keeps going: cached decisions, else fail open
(or ``--fail-closed-delay-ms``). Ctrl-C stops it. See ``docs/agents.md``.

    python examples/agent.py --redis-host 127.0.0.1 --redis-port 6379 --prefix quotastream \\
        --quotas conf/quotas.yaml --user alice --client-id app1 --broker 1
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from prometheus_client import REGISTRY, start_http_server

from quotastream import CachedQuotaClient, CacheSettings, FailurePolicy
from state.config import load_quota_config

log = logging.getLogger("agent")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-host", default="127.0.0.1")
    parser.add_argument("--redis-port", type=int, default=6379)
    parser.add_argument("--prefix", default="quotastream", help="redis.key_prefix of the engine")
    parser.add_argument("--quotas", type=Path, required=True, help="the engine's quota file")
    parser.add_argument("--redis-username", default=None, help="an agent ACL user (read only)")
    parser.add_argument(
        "--redis-password-env",
        default="QUOTASTREAM_REDIS_PASSWORD",
        help="environment variable holding the Redis password (not a flag: ps shows flags)",
    )
    parser.add_argument("--quota", default="produce")
    parser.add_argument("--user", default="alice")
    parser.add_argument("--client-id", default="app1")
    parser.add_argument("--broker", type=int, default=1)
    parser.add_argument("--interval-ms", type=int, default=100, help="time between requests")
    parser.add_argument("--requests", type=int, default=0, help="stop after this many (0: never)")
    parser.add_argument("--max-staleness-ms", type=int, default=1_000)
    parser.add_argument("--fail-open-staleness-ms", type=int, default=30_000)
    parser.add_argument("--timeout-ms", type=int, default=200)
    parser.add_argument("--backoff-ms", type=int, default=1_000)
    parser.add_argument(
        "--fail-closed-delay-ms",
        type=int,
        default=None,
        help="fail closed with this delay when Redis is down and nothing recent is cached "
        "(default: fail open)",
    )
    parser.add_argument("--max-hold-ms", type=int, default=30_000, help="Kafka's cap on a delay")
    parser.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    fail_closed = args.fail_closed_delay_ms is not None
    settings = CacheSettings(
        max_staleness_ms=args.max_staleness_ms,
        fail_open_staleness_ms=args.fail_open_staleness_ms,
        timeout_ms=args.timeout_ms,
        backoff_ms=args.backoff_ms,
        failure_policy=FailurePolicy.CLOSED if fail_closed else FailurePolicy.OPEN,
        fail_closed_delay_ms=args.fail_closed_delay_ms or 0,
    )
    if args.metrics_port:
        start_http_server(args.metrics_port)
    client = CachedQuotaClient.connect(
        args.redis_host,
        args.redis_port,
        args.prefix,
        load_quota_config(args.quotas),
        settings,
        registry=REGISTRY,
        username=args.redis_username,
        password=os.environ.get(args.redis_password_env),
    )
    served = 0
    counted_as = None
    try:
        while args.requests == 0 or served < args.requests:
            answer = client.for_client(args.quota, args.user, args.client_id, args.broker)
            # The counter follows the live configuration: a `quota set` can move the client.
            if answer.decision is not None and answer.decision.entity != counted_as:
                counted_as = answer.decision.entity
                log.info(
                    "client user=%s client-id=%s counts as %s",
                    args.user,
                    args.client_id,
                    counted_as,
                )
            hold_ms = min(answer.throttle_ms, args.max_hold_ms)
            print(
                f"request {served}: {answer.source.value} (age {answer.age_ms} ms), "
                f"hold {hold_ms} ms",
                flush=True,
            )
            # A real proxy would forward the request now and delay the response by hold_ms
            # (Kafka's throttle_time_ms), muting the connection meanwhile.
            time.sleep((hold_ms + args.interval_ms) / 1000)
            served += 1
    except KeyboardInterrupt:
        log.info("stopped after %d requests", served)
    return 0


if __name__ == "__main__":
    sys.exit(main())
