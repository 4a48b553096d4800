"""The rate a held client achieved, from the times and sizes of its acknowledgements (or of the
records it received): ``(seconds, bytes)`` pairs, as ``tests/client_libraries.py`` returns them.

A client offered more than its quota is held in cycles. Kafka pads a fresh client's rate to the
window's other samples, so it may send that many windows' worth at once; it is then held until
that burst leaves the quota's whole span (samples x window, 11 s by default) and sends again. A
rate from one moment to another depends on where in a cycle the two fall: over a 30-s run the
bytes of one burst (a third of the run's) move it by a third either way. :func:`achieved_rate`
takes instead the mean, over every start, of the bytes in a span as long as the quota's (Kafka's
own measure): a span as long as a cycle holds one whole cycle wherever it starts, so the figure
no longer depends on where the run was cut.
"""

from __future__ import annotations

import itertools

#: (seconds, bytes) for each acknowledgement or received record.
Acks = list[tuple[float, int]]


def achieved_rate(acks: Acks, span_s: float, after_s: float = 0.0) -> float:
    """Bytes per second: the mean, over every span of ``span_s`` that starts ``after_s`` or more
    past the first byte and ends by the last, of the bytes in it over ``span_s``. A run shorter
    than ``after_s`` plus one span is one span: its bytes over its length.

    The run ends at its last byte, not at the end of the client's offer: a consumer's offer
    starts before it has joined its group, so its first record comes seconds in, and those
    seconds would be counted at the end as a stall (the measure needs no cut at a given time)."""
    if not acks:
        return 0.0
    times = [at for at, _ in acks]
    first = min(times)
    start = first + after_s
    end = max(times)
    counted = [(at, n) for at, n in acks if at >= start]
    starts = end - span_s - start  # the length of the interval the spans' starts range over
    if starts <= 0:
        return sum(n for _, n in counted) / (end - start) if end > start else 0.0
    # A byte at `at` lies in the span [t, t + span_s) for every start t in (at - span_s, at]:
    # its share of the mean is that interval's part of [start, end - span_s].
    weighted = sum(
        n * max(min(end - span_s, at) - max(start, at - span_s), 0.0) for at, n in counted
    )
    return weighted / (starts * span_s)


def mean_rate(acks: Acks) -> float:
    """Bytes per second over the whole run: every byte over the time from the first to the
    last."""
    times = [at for at, _ in acks]
    length = max(times) - min(times) if times else 0.0
    return sum(n for _, n in acks) / length if length > 0 else 0.0


def longest_gap_s(acks: Acks) -> float:
    """The longest time between two acknowledgements (or received records): how long a client
    was held at once, or stalled."""
    times = sorted(at for at, _ in acks)
    return max((later - earlier for earlier, later in itertools.pairwise(times)), default=0.0)
