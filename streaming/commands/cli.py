"""The ``quotastream`` command."""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import logging
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from streaming.commands.exit_codes import EXIT_FAILURE, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE

INSTALL_ENGINE = "pip install 'quotastream[engine]'"

# The base install is the agent package alone (docs/agents.md): without the engine extra every
# command says what to install in one line (main) instead of ending in a traceback.
try:
    from state.config import load_quota_config
    from state.configfile import ConfigError
    from state.shard import Shard
    from streaming.commands.admin import ADMIN_COMMANDS, add_admin_commands, run_admin
    from streaming.commands.help_text import examples
    from streaming.commands.replay import replay
    from streaming.commands.whatif import (
        BASE_NAME,
        DEFAULT_TOP,
        OUTPUTS,
        WhatIfError,
        parse_options,
        report,
    )
    from streaming.engine.settings import load_engine_settings
except ModuleNotFoundError as exc:
    _missing_engine: ModuleNotFoundError | None = exc
else:
    _missing_engine = None


def _version() -> str:
    try:
        return importlib.metadata.version("quotastream")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "(not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quotastream",
        description="Kafka-exact quota decisions from traffic events.",
        **examples(
            "quotastream run                      # embedded: broker, Redis, simulated traffic",
            "quotastream run --engine-config conf/engine.yaml --no-embedded --no-simulate",
            "quotastream COMMAND --help",
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run_replay = commands.add_parser(
        "replay",
        help="decide over a file of events (JSON lines) and print one decision per event",
        description=(
            "Runs the quota core over EVENTS in file order. Writes one JSON decision per accepted "
            "event to stdout, in input order, and every rejected line with its reason to stderr "
            "(or --dead-letter). With --what-if, prints instead how long each counter is "
            "throttled under each configuration (docs/replay.md). Exits 0 once the input was "
            "read, whatever it contained."
        ),
        **examples(
            "quotastream replay examples/events.jsonl --config conf/quotas.yaml",
            "quotastream replay examples/events.jsonl --config conf/quotas.yaml "
            "--what-if roomy=roomy.yaml --top 5 --plot whatif.png",
            "quotastream replay examples/events.jsonl --config conf/quotas.yaml "
            "--what-if roomy=roomy.yaml --output json",
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
    run_replay.add_argument(
        "--what-if",
        action="append",
        metavar="NAME=PATH",
        help="also replay under this alternative quota configuration (repeatable); prints a "
        "table comparing it with --config (named base) instead of the decisions",
    )
    run_replay.add_argument(
        "--top",
        type=int,
        metavar="N",
        help=f"with --what-if: rows of the table (default {DEFAULT_TOP}), most throttled first",
    )
    run_replay.add_argument(
        "--plot",
        type=Path,
        metavar="PATH.png",
        help="with --what-if: also draw rate, limit and throttled periods over event time of the "
        "top counters (reads EVENTS twice, so not stdin; the path is checked before the replay)",
    )
    run_replay.add_argument(
        "--output",
        choices=OUTPUTS,
        help="with --what-if: the comparison as an aligned table (default) or one JSON document; "
        "without it, replay always writes JSON lines",
    )

    run_engine = commands.add_parser(
        "run",
        help="run the streaming engine (embedded broker, Redis and traffic by default)",
        description=(
            "Runs the streaming query: Kafka events to quota decisions in Redis, with a live view "
            "of the entities nearest their limits. Without --engine-config it starts everything "
            "itself on free loopback ports (an Apache Kafka broker, Redis, simulated traffic); "
            "with it, it uses the Kafka and Redis the file names. Ctrl-C stops all it started."
        ),
        **examples(
            "quotastream run --duration 60",
            "quotastream run --engine-config conf/engine.yaml --no-embedded --no-simulate",
        ),
    )
    run_engine.add_argument("--engine-config", type=Path, help="engine settings YAML")
    run_engine.add_argument(
        "--embedded",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="start a local broker and Redis (default: only without --engine-config)",
    )
    run_engine.add_argument(
        "--simulate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="publish simulated traffic (default: when embedded)",
    )
    run_engine.add_argument(
        "--duration", type=float, metavar="SECONDS", help="stop after this long (default: never)"
    )
    run_engine.add_argument(
        "--available-now",
        action="store_true",
        help="decide what the topics hold now, then stop (catch up after downtime, tests)",
    )
    simulate = commands.add_parser(
        "simulate",
        help="publish the simulated cluster traffic to Kafka (what `run` publishes when embedded)",
        description=(
            "Publishes the simulated traffic scenario (skewed clients, a bursting client, an "
            "upload backlog, a reassignment) to the first events topic of the engine settings, in "
            "real time, until Ctrl-C or --duration."
        ),
        **examples(
            "quotastream simulate --engine-config conf/engine.yaml --duration 300",
            "quotastream simulate --engine-config conf/engine.yaml --events-per-message 100",
        ),
    )
    simulate.add_argument("--engine-config", type=Path, help="engine settings YAML (Kafka)")
    simulate.add_argument(
        "--duration",
        type=float,
        metavar="SECONDS",
        help="publish this many seconds of traffic (rounded up), then stop (default: never)",
    )
    simulate.add_argument(
        "--events-per-message",
        type=int,
        default=1,
        metavar="N",
        help="publish batched messages: JSON arrays of up to N events (default 1: one event each)",
    )
    proxy = commands.add_parser(
        "proxy",
        help="run the Kafka proxy: publish clients' traffic, hold them by the engine's decisions",
        description=(
            "Listens for Kafka clients on proxy.bootstrap_port (and node_port_base + each broker "
            "id), forwards their requests to proxy.upstream, publishes their Produce and Fetch "
            "bytes to the first events topic and holds each client by its decision in Redis, as "
            "a broker holds a client over its quota (docs/proxy.md). SIGTERM drains in-flight "
            "requests, then stops."
        ),
        **examples("quotastream proxy --engine-config conf/engine.yaml"),
    )
    proxy.add_argument("--engine-config", type=Path, required=True, help="engine settings YAML")
    brokers = commands.add_parser(
        "brokers",
        help="next to a cluster: its brokers' own traffic as events, the engine's throttles set",
        description=(
            "Runs, each when enabled in the brokers: section (docs/brokers.md): the remote log "
            "bridge (brokers.cluster's __remote_log_metadata, decoded with the schemas of its "
            "Kafka release, published as remote_segment and remote_copy events; records it "
            "cannot follow go to the dead-letter topic) with the lineage source (each tiered "
            "partition's leader epochs, walked from its leader, as leader_epochs events), the "
            "metrics source (the brokers' JMX "
            "exporters' counters as remote_fetch and replication counts) and the actuator "
            "(the engine's replication and remote-copy throttles set on the brokers' own "
            "configs). SIGTERM stops them within a poll."
        ),
        **examples("quotastream brokers --engine-config conf/engine.yaml"),
    )
    brokers.add_argument("--engine-config", type=Path, required=True, help="engine settings YAML")
    add_admin_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if _missing_engine is not None:
        return _engine_not_installed(_missing_engine)
    args = _parser().parse_args(argv)
    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "replay": _replay,
        "run": _run,
        "simulate": _simulate,
        "proxy": _proxy,
        "brokers": _brokers,
    }
    if args.command in commands:
        return commands[args.command](args)
    if args.command in ADMIN_COMMANDS:
        return run_admin(args)
    raise AssertionError(f"unhandled command {args.command}")  # argparse rejects others


def _proxy(args: argparse.Namespace) -> int:
    from streaming.commands.proxy import run_proxy  # noqa: PLC0415 (kafka-python, for this only)

    try:
        settings = load_engine_settings(args.engine_config)
        load_quota_config(Path(settings.quotas))
    except ConfigError as exc:
        return _fail(EXIT_USAGE, str(exc))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return run_proxy(settings)


def _brokers(args: argparse.Namespace) -> int:
    from streaming.commands.brokers import run_brokers  # noqa: PLC0415 (kafka-python, for this only)

    try:
        settings = load_engine_settings(args.engine_config)
    except ConfigError as exc:
        return _fail(EXIT_USAGE, str(exc))
    brokers = settings.brokers
    if not (
        brokers.remote_log_metadata.enabled
        or brokers.actuator.enabled
        or brokers.broker_metrics.enabled
    ):
        return _fail(
            EXIT_USAGE,
            "nothing to run: none of brokers.remote_log_metadata, brokers.actuator and "
            "brokers.broker_metrics is enabled (docs/brokers.md)",
        )
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return run_brokers(settings)


def _replay(args: argparse.Namespace) -> int:
    if args.batch_size < 1:
        return _fail(EXIT_USAGE, f"--batch-size must be >= 1, got {args.batch_size}")
    try:
        what_if = parse_options(
            args.what_if, args.top, args.plot, args.output, from_stdin=str(args.events) == "-"
        )
        config = load_quota_config(args.config)
        alternatives = {
            name: load_quota_config(path) for name, path in what_if.alternatives.items()
        }
        settings = load_engine_settings(args.engine_config)
    except (ConfigError, WhatIfError) as exc:
        return _fail(EXIT_USAGE, str(exc))
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
            stats = (
                report(
                    events,
                    configs={BASE_NAME: config, **alternatives},
                    report_out=sys.stdout,
                    dead_letter_out=dead_letter,
                    bounds=settings.events.bounds(args.now),
                    max_payload_bytes=settings.events.max_payload_bytes,
                    top=what_if.top,
                    plot=what_if.plot,
                    output=what_if.output,
                    batch_lines=args.batch_size,
                )
                if alternatives
                else replay(
                    events,
                    shard=Shard.new(config),
                    decisions_out=sys.stdout,
                    dead_letter_out=dead_letter,
                    bounds=settings.events.bounds(args.now),
                    max_payload_bytes=settings.events.max_payload_bytes,
                    batch_lines=args.batch_size,
                )
            )
        except OSError as exc:
            return _fail(EXIT_FAILURE, f"cannot read or write: {exc}")
    reasons = ", ".join(f"{r}={n}" for r, n in sorted(stats.rejected_by_reason.items()))
    print(
        f"quotastream: {stats.lines} lines, {stats.accepted} decided, "
        f"{stats.rejected} rejected" + (f" ({reasons})" if reasons else ""),
        file=sys.stderr,
    )
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    try:
        from streaming.commands.preflight import UnreachableError  # noqa: PLC0415
        from streaming.commands.run import RunOptions, run  # noqa: PLC0415 - replay need not load Spark
        from streaming.engine.config_log import MisshapenTopicError  # noqa: PLC0415
        from streaming.services import MissingPackageError  # noqa: PLC0415
    except ModuleNotFoundError as exc:
        return _engine_not_installed(exc)

    embedded = args.embedded if args.embedded is not None else args.engine_config is None
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for chatty in ("kafka", "py4j"):  # connection chatter at INFO
        logging.getLogger(chatty).setLevel(logging.WARNING)
    try:
        settings = load_engine_settings(args.engine_config)
        return run(
            RunOptions(
                settings=settings,
                embedded=embedded,
                simulate=args.simulate if args.simulate is not None else embedded,
                duration_s=args.duration,
                available_now=args.available_now,
            )
        )
    except (ConfigError, MisshapenTopicError) as exc:
        return _fail(EXIT_USAGE, str(exc))
    except UnreachableError as exc:
        return _fail(EXIT_UNREACHABLE, f"not started: {exc}")
    except MissingPackageError as exc:
        return _fail(EXIT_USAGE, f"not started: {exc}")


def _simulate(args: argparse.Namespace) -> int:
    # Only this command needs a Kafka client.
    from kafka.errors import KafkaError  # noqa: PLC0415

    from streaming.commands.preflight import DEFAULT_TIMEOUT_S, UnreachableError, check_kafka  # noqa: PLC0415
    from streaming.commands.traffic import LiveTraffic  # noqa: PLC0415

    try:
        settings = load_engine_settings(args.engine_config)
    except ConfigError as exc:
        return _fail(EXIT_USAGE, str(exc))
    if args.events_per_message < 1 or (args.duration is not None and args.duration <= 0):
        return _fail(
            EXIT_USAGE,
            f"--events-per-message must be >= 1, got {args.events_per_message}"
            if args.events_per_message < 1
            else f"--duration must be > 0 seconds, got {args.duration:g}",
        )
    kafka = settings.kafka
    where = f"Kafka at {kafka.bootstrap_servers}"
    try:
        check_kafka(kafka, DEFAULT_TIMEOUT_S)
        traffic = LiveTraffic(
            kafka.bootstrap_servers,
            kafka.topics[0],
            client=kafka.client_settings(),
            events_per_message=args.events_per_message,
            seconds=None if args.duration is None else math.ceil(args.duration),
        )
    except UnreachableError as exc:
        return _fail(EXIT_UNREACHABLE, str(exc))
    except KafkaError as exc:
        return _fail(EXIT_UNREACHABLE, f"{where}: {exc}")
    print(f"quotastream: simulating traffic to {kafka.topics[0]} at {kafka.bootstrap_servers}")
    traffic.start()
    try:
        traffic.join()
    except KeyboardInterrupt:
        pass
    finally:
        traffic.stop()
    if traffic.failure is not None:
        return _fail(EXIT_UNREACHABLE, f"{where}: publishing stopped: {traffic.failure}")
    return EXIT_OK


def _engine_not_installed(exc: ModuleNotFoundError) -> int:
    if (exc.name or "").partition(".")[0] in {"quotastream", "state", "streaming"}:
        raise exc  # a module of our own is missing: a broken install or a bug, not the extra
    return _fail(
        EXIT_USAGE, f"the engine is not installed (no module {exc.name!r}): {INSTALL_ENGINE}"
    )


def _fail(code: int, message: str) -> int:
    print(f"quotastream: error: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
