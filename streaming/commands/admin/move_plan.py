"""KIP-73's MoveTime estimate and its IN < T < N - IN/R check for ``replication throttle``.

Read from the command's options and printed here; the math is ``state.replication_plan``'s.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from state.config import DEFAULT, BrokerKey
from state.replication_plan import MoveEstimate, ThrottleBound, estimate_move, throttle_bound
from streaming.commands.admin.errors import bad
from streaming.commands.admin.output import as_text, warn
from streaming.commands.admin.values import optional_count, optional_number


@dataclass(frozen=True)
class MovePlan:
    estimate: MoveEstimate | None
    bound: ThrottleBound | None


def read_move_plan(args: argparse.Namespace, rate: float, brokers: list[BrokerKey]) -> MovePlan:
    moved = optional_count(args.partitions_moved, "--partitions-moved")
    total = optional_count(args.total_partitions, "--total-partitions")
    size = optional_number(args.log_size_per_broker, "--log-size-per-broker")
    bytes_in = optional_number(args.max_bytes_in, "--max-bytes-in")
    network = optional_number(args.network, "--network")
    factor = optional_count(args.replication_factor, "--replication-factor")
    count = optional_count(args.broker_count, "--broker-count")
    estimate_args = {
        "--partitions-moved": moved,
        "--total-partitions": total,
        "--log-size-per-broker": size,
    }
    estimate = bound = None
    try:
        if any(v is not None for v in estimate_args.values()):
            missing = [option for option, v in estimate_args.items() if v is None]
            if bytes_in is None:
                missing.append("--max-bytes-in")
            if count is None and brokers != [DEFAULT]:
                count = len(brokers)
            if count is None:
                missing.append("--broker-count (the rate is set on <default>)")
            if missing:
                raise bad(f"the MoveTime estimate also needs {', '.join(missing)}")
            assert moved is not None
            assert total is not None
            assert size is not None
            assert bytes_in is not None
            assert count is not None
            estimate = estimate_move(
                partitions_moved=moved,
                total_partitions=total,
                log_size_per_broker=size,
                brokers=count,
                rate=rate,
                max_bytes_in=bytes_in,
            )
        if network is not None or factor is not None:
            missing = [
                option
                for option, v in (
                    ("--network", network),
                    ("--replication-factor", factor),
                    ("--max-bytes-in", bytes_in),
                )
                if v is None
            ]
            if missing:
                raise bad(f"the IN < T < N - IN/R check also needs {', '.join(missing)}")
            assert network is not None
            assert factor is not None
            assert bytes_in is not None
            bound = throttle_bound(rate, bytes_in, network, factor)
    except ValueError as exc:
        raise bad(str(exc)) from None
    return MovePlan(estimate, bound)


def print_move_plan(plan: MovePlan, rate: float) -> None:
    if plan.estimate is not None:
        estimate = plan.estimate
        print(f"MoveRatio: {estimate.move_ratio:.4g}")
        print(f"bytes to move: {as_text(estimate.bytes_to_move)}")
        if estimate.completes:
            print(
                f"MoveTime: {estimate.seconds:.0f} s ({_duration(estimate.seconds)}) at "
                f"{as_text(estimate.spare_rate)} B/s spare (rate - max BytesIn)"
            )
        else:
            message = (
                f"the move never completes: the rate ({as_text(rate)} B/s) is not above "
                f"max(BytesIn) ({as_text(rate - estimate.spare_rate)} B/s), so keep-up traffic "
                "takes the whole throttle"
            )
            print(f"MoveTime: never ({message})")
            warn(message)
    if plan.bound is not None:
        bound = plan.bound
        verdict = "holds" if bound.holds else "BROKEN"
        print(
            f"bound IN < T < N - IN/R: {as_text(bound.lower)} < {as_text(rate)} < "
            f"{as_text(bound.upper)}: {verdict}"
        )
        if bound.too_low:
            warn(
                f"throttle {as_text(rate)} B/s is not above the inbound rate IN = "
                f"{as_text(bound.lower)} B/s (lower side of IN < T < N - IN/R): replicas "
                "cannot catch up"
            )
        if bound.too_high:
            warn(
                f"throttle {as_text(rate)} B/s is not below N - IN/R = {as_text(bound.upper)} B/s "
                "(upper side of IN < T < N - IN/R): throttled replication can crowd out client "
                "traffic"
            )
        if not bound.satisfiable:
            warn("no throttle satisfies IN < T < N - IN/R on this network: IN >= N - IN/R")


def _duration(seconds: float) -> str:
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"
