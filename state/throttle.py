"""Kafka's throttle time: ``round((rate - bound) / bound * window_size_ms)``, uncapped."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
Int64Array = npt.NDArray[np.int64]

#: Largest throttle reported (2**53 - 1 ms, exact in JSON); only absurd rate/limit ratios reach it.
MAX_THROTTLE_MS = 2**53 - 1


def java_round(values: FloatArray) -> FloatArray:
    """``Math.round`` as Java does it (half up), not Python's round-half-to-even."""
    return np.floor(values + 0.5)


def throttle_ms(rate: FloatArray, limit: FloatArray, window_size_ms: Int64Array) -> Int64Array:
    """Throttle time per event; ``limit`` is ``inf`` where no quota applies.

    Kafka rounds, so an overshoot worth under half a millisecond would throttle for 0 ms while
    still counting as a violation. quotastream reports at least 1 ms instead, so that a throttle
    time of 0 means exactly "within quota" (``docs/semantics.md``).
    """
    exceeded = rate > limit
    delay = np.zeros(len(rate), dtype=np.int64)
    over = np.flatnonzero(exceeded)
    # An infinite quotient (a huge ratio, or a limit of 0 that no byte fits) is capped below.
    with np.errstate(over="ignore", divide="ignore"):
        raw = (rate[over] - limit[over]) / limit[over] * window_size_ms[over]
    delay[over] = np.clip(java_round(raw), 1, MAX_THROTTLE_MS).astype(np.int64)
    return delay
