"""The ``quotastream`` command."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path

from state.config import load_quota_config
from state.configfile import ConfigError
from state.core import QuotaCore
from streaming.replay import replay
from streaming.settings import load_engine_settings

EXIT_OK = 0
EXIT_UNREADABLE_INPUT = 1
EXIT_BAD_CONFIG = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quotastream", description="Kafka-exact quota decisions from traffic events."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run_replay = commands.add_parser(
        "replay",
        help="decide over a file of events (JSON lines) and print one decision per event",
        description=(
            "Runs the quota core over EVENTS in file order. Writes one JSON decision per accepted "
            "event to stdout, in input order, and every rejected line with its reason to stderr "
            "(or --dead-letter). Exits 0 once the input was read, whatever it contained."
        ),
    )
    run_replay.add_argument("events", type=Path, help="JSON-lines file of events, '-' for stdin")
    run_replay.add_argument("--config", type=Path, required=True, help="quota configuration YAML")
    run_replay.add_argument(
        "--engine-config", type=Path, help="engine settings YAML (event bounds); optional"
    )
    run_replay.add_argument(
        "--dead-letter", type=Path, help="write rejected lines here instead of stderr"
    )
    run_replay.add_argument(
        "--now",
        type=int,
        metavar="MS",
        help="clock (epoch ms) for the relative event-time bounds; without it only the absolute "
        "bounds apply",
    )
    run_replay.add_argument(
        "--batch-size", type=int, default=65_536, metavar="LINES", help=argparse.SUPPRESS
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "replay":
        return _replay(args)
    raise AssertionError(f"unhandled command {args.command}")  # argparse rejects others


def _replay(args: argparse.Namespace) -> int:
    if args.batch_size < 1:
        return _fail(EXIT_BAD_CONFIG, f"--batch-size must be >= 1, got {args.batch_size}")
    try:
        config = load_quota_config(args.config)
        settings = load_engine_settings(args.engine_config)
    except ConfigError as exc:
        return _fail(EXIT_BAD_CONFIG, str(exc))
    with contextlib.ExitStack() as stack:
        try:
            events = (
                sys.stdin.buffer
                if str(args.events) == "-"
                else stack.enter_context(args.events.open("rb"))
            )
            dead_letter = (
                stack.enter_context(args.dead_letter.open("w", encoding="utf-8"))
                if args.dead_letter
                else sys.stderr
            )
            stats = replay(
                events,
                core=QuotaCore(config),
                decisions_out=sys.stdout,
                dead_letter_out=dead_letter,
                bounds=settings.events.bounds(args.now),
                max_payload_bytes=settings.events.max_payload_bytes,
                batch_lines=args.batch_size,
            )
        except OSError as exc:
            return _fail(EXIT_UNREADABLE_INPUT, f"cannot read or write: {exc}")
    reasons = ", ".join(f"{r}={n}" for r, n in sorted(stats.rejected_by_reason.items()))
    print(
        f"quotastream: {stats.lines} lines, {stats.accepted} decided, "
        f"{stats.rejected} rejected" + (f" ({reasons})" if reasons else ""),
        file=sys.stderr,
    )
    return EXIT_OK


def _fail(code: int, message: str) -> int:
    print(f"quotastream: error: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
