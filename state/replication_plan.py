"""Planning a replication throttle (KIP-73 Q&A 1 and 4): how long a move takes, and a sanity bound.

* ``MoveRatio = #partitions-to-be-moved / #total-partition-count``
* ``MoveTime = MoveRatio x TotalLogSizePerBroker x #Brokers / (replication-quota - max(BytesIn))``
  -- the move never completes when the throttle is no higher than the inbound rate, because the
  keep-up traffic alone uses the whole throttle.
* For every broker, with inbound rate ``IN``, throttle ``T``, network throughput ``N`` and
  replication factor ``R``: ``IN < T < N - IN/R``. Below: no bandwidth left to catch up. Above:
  the throttled traffic can crowd out the (unthrottled) inbound client traffic once leaders have
  moved.

Rates are bytes per second, sizes bytes. Invalid inputs raise :class:`ValueError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def move_ratio(partitions_moved: int, total_partitions: int) -> float:
    """The share of partitions a reassignment moves, 0..1."""
    if total_partitions <= 0:
        raise ValueError(f"the total partition count must be > 0, got {total_partitions}")
    if not 0 <= partitions_moved <= total_partitions:
        raise ValueError(
            f"partitions moved must be between 0 and the total ({total_partitions}), "
            f"got {partitions_moved}"
        )
    return partitions_moved / total_partitions


def bytes_to_move(ratio: float, log_size_per_broker: float, brokers: int) -> float:
    """``MoveRatio x TotalLogSizePerBroker x #Brokers``: the data the move copies."""
    if not 0 <= ratio <= 1:
        raise ValueError(f"the move ratio must be between 0 and 1, got {ratio}")
    _check_finite(log_size_per_broker, "the log size per broker", minimum=0.0)
    if brokers < 1:
        raise ValueError(f"the broker count must be >= 1, got {brokers}")
    return ratio * log_size_per_broker * brokers


def move_time_s(
    ratio: float, log_size_per_broker: float, brokers: int, rate: float, max_bytes_in: float
) -> float:
    """KIP-73's MoveTime in seconds; ``math.inf`` when ``rate <= max_bytes_in`` (never done)."""
    data = bytes_to_move(ratio, log_size_per_broker, brokers)
    _check_rate(rate)
    _check_finite(max_bytes_in, "the inbound rate (max BytesIn)", minimum=0.0)
    spare = rate - max_bytes_in
    if spare <= 0:
        return math.inf
    return data / spare


@dataclass(frozen=True)
class MoveEstimate:
    """How long a move takes under a throttle, and why."""

    move_ratio: float
    bytes_to_move: float
    #: The throttle left for catching up once keep-up traffic (the inbound rate) is served.
    spare_rate: float
    #: ``math.inf`` when the spare rate is not positive: the move never completes.
    seconds: float

    @property
    def completes(self) -> bool:
        return math.isfinite(self.seconds)


def estimate_move(
    *,
    partitions_moved: int,
    total_partitions: int,
    log_size_per_broker: float,
    brokers: int,
    rate: float,
    max_bytes_in: float,
) -> MoveEstimate:
    ratio = move_ratio(partitions_moved, total_partitions)
    return MoveEstimate(
        move_ratio=ratio,
        bytes_to_move=bytes_to_move(ratio, log_size_per_broker, brokers),
        spare_rate=rate - max_bytes_in,
        seconds=move_time_s(ratio, log_size_per_broker, brokers, rate, max_bytes_in),
    )


@dataclass(frozen=True)
class ThrottleBound:
    """KIP-73's ``IN < T < N - IN/R`` for one throttle ``T``: which side, if any, is broken."""

    rate: float
    #: ``IN``: the throttle must be above it.
    lower: float
    #: ``N - IN/R``: the throttle must be below it.
    upper: float

    @property
    def too_low(self) -> bool:
        """``T <= IN``: keep-up traffic takes the whole throttle; nothing catches up."""
        return not self.rate > self.lower

    @property
    def too_high(self) -> bool:
        """``T >= N - IN/R``: throttled traffic can starve the inbound client traffic."""
        return not self.rate < self.upper

    @property
    def holds(self) -> bool:
        return not (self.too_low or self.too_high)

    @property
    def satisfiable(self) -> bool:
        """Whether any throttle satisfies the bound (``IN < N - IN/R``)."""
        return self.lower < self.upper


def throttle_bound(
    rate: float, bytes_in: float, network: float, replication_factor: int
) -> ThrottleBound:
    """Checks ``bytes_in < rate < network - bytes_in / replication_factor``."""
    _check_rate(rate)
    _check_finite(bytes_in, "the inbound rate (BytesIn)", minimum=0.0)
    _check_finite(network, "the network throughput", minimum=0.0)
    if network <= 0:
        raise ValueError(f"the network throughput must be > 0, got {network:g}")
    if replication_factor < 1:
        raise ValueError(f"the replication factor must be >= 1, got {replication_factor}")
    return ThrottleBound(rate=rate, lower=bytes_in, upper=network - bytes_in / replication_factor)


def _check_rate(rate: float) -> None:
    _check_finite(rate, "the throttle rate", minimum=0.0)
    if rate <= 0:
        raise ValueError(f"the throttle rate must be > 0, got {rate:g}")


def _check_finite(value: float, what: str, minimum: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum:g}, got {value:g}")
