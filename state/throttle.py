"""Kafka's throttle time: ``round((rate - bound) / bound * window_size_ms)``, uncapped.

One formula for the engine (:func:`throttle_ms`, over a batch's columns) and the proxy
(:func:`throttle_of`, one window at a time, in a process that loads no numpy): both measure the
rate with :func:`rate_of` and round the same quotient the same way.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, overload

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float64]
    Int64Array = npt.NDArray[np.int64]

#: Largest throttle reported (2**53 - 1 ms, exact in JSON); only absurd rate/limit ratios reach it.
MAX_THROTTLE_MS = 2**53 - 1


@overload
def rate_of(window_bytes: float, window_size_ms: float) -> float: ...
@overload
def rate_of(window_bytes: Int64Array, window_size_ms: Int64Array) -> FloatArray: ...
def rate_of(window_bytes: Any, window_size_ms: Any) -> Any:
    """Bytes per second of a window of ``window_bytes`` over ``window_size_ms``: the rate that
    :func:`over_bound_ms` compares, the same double in the engine and the proxy."""
    return window_bytes * 1000.0 / window_size_ms


@overload
def over_bound_ms(rate: float, bound: float, window_size_ms: float) -> float: ...
@overload
def over_bound_ms(
    rate: FloatArray, bound: FloatArray, window_size_ms: Int64Array
) -> FloatArray: ...
def over_bound_ms(rate: Any, bound: Any, window_size_ms: Any) -> Any:
    """How far (ms) a window of ``rate`` bytes/s is past ``bound``: Kafka's quotient before it
    is rounded, computed as Kafka (and :func:`throttle_ms`) computes it, rate first, so that the
    proxy and the engine round the very same double."""
    return (rate - bound) / bound * window_size_ms


def throttle_of(over_ms: float) -> int:
    """Kafka's throttle of a window ``over_ms = (rate - bound) / bound * window_size_ms`` past
    its bound (0 or less: within it).

    Kafka rounds (``Math.round``: half up), so an overshoot worth under half a millisecond would
    throttle for 0 ms while still counting as a violation. quotastream reports at least 1 ms
    instead, so that a throttle time of 0 means exactly "within quota" (``docs/semantics.md``).
    """
    if not over_ms > 0:
        return 0
    if over_ms >= MAX_THROTTLE_MS:  # also an infinite quotient: a limit of 0 no byte fits
        return MAX_THROTTLE_MS
    return max(math.floor(over_ms + 0.5), 1)


def java_round(values: FloatArray) -> FloatArray:
    """``Math.round`` as Java does it (half up), not Python's round-half-to-even."""
    import numpy as np  # noqa: PLC0415 (the proxy imports this module and loads no numpy)

    return np.floor(values + 0.5)


def throttle_ms(rate: FloatArray, limit: FloatArray, window_size_ms: Int64Array) -> Int64Array:
    """:func:`throttle_of` per event; ``limit`` is ``inf`` where no quota applies."""
    import numpy as np  # noqa: PLC0415 (as above)

    exceeded = rate > limit
    delay = np.zeros(len(rate), dtype=np.int64)
    over = np.flatnonzero(exceeded)
    # An infinite quotient (a huge ratio, or a limit of 0 that no byte fits) is capped below.
    with np.errstate(over="ignore", divide="ignore"):
        raw = over_bound_ms(rate[over], limit[over], window_size_ms[over])
    delay[over] = np.clip(java_round(raw), 1, MAX_THROTTLE_MS).astype(np.int64)
    return delay
