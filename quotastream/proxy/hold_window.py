"""A client's window as the proxy measures it: pure arithmetic of a decision, the quota's
window and the bytes the proxy forwarded (no Redis, no clock of its own).

The engine's decision counts the bytes up to its last event (``decided_at``). The proxy
measures the window again whenever it is asked (:func:`window_over_ms`): the bytes it forwarded
itself are counted from its own record (:class:`Forwarded`), so that they leave the window as
it slides, and the bytes it forwarded since the decision are added; the rest of what the
decision counted (forwarded by other proxies, at times this one does not know) are placed evenly
over the decision's window (``spread_over``), as a steady stream would have put them. Measured
at ``decided_at`` it is the decision's own window; later, each byte adds ``1 / limit`` seconds,
and a sample leaving the window takes its bytes with it, as a broker measures each request when
it arrives. The hold it gives is Kafka's throttle of that window (``state.throttle``), the
engine's formula.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from quotastream.redis_contract import Decision
from state.throttle import over_bound_ms, rate_of, throttle_of
from state.window import WindowSpec, spread_over, window_at

#: (quota, user, client-id, broker): what a client's decision is looked up by.
ClientKey = tuple[str, str, str, int]


class Forwarded:
    """The counted bytes forwarded per client, for as long as they may count in its window.

    Bytes a decision has counted are folded into the window's aligned samples (a sum and the
    last millisecond per sample, at most ``samples + 1`` of them per client); the ones since are
    kept by the millisecond, to tell them apart from what the next decision counts.

    :meth:`record` runs on the connections' event loop, :meth:`fold` and :meth:`forget_until` on
    the refresh thread, :meth:`samples` on both. A deque's append and popleft are atomic, copies
    are taken in one C call under the GIL, and a millisecond bucket is added to in place; a bucket
    is added to its sample before it leaves the deque, so a reader may count it twice for an
    instant, never miss it (bytes added to a bucket as it is folded belong to the decision's own
    millisecond, which the engine may have counted already).

    Memory: per client, a bucket per millisecond with traffic since its decision (the engine's
    latency: a second or two; for an undecided client, the window's span) and a dozen samples."""

    def __init__(self) -> None:
        self._sent: dict[ClientKey, deque[list[int]]] = {}
        #: Per client: the sample width and ``{sample: [bytes, last ms]}`` folded so far.
        self._folded: dict[ClientKey, tuple[int, dict[int, list[int]]]] = {}
        #: Per client: the sample width and ``{sample: [bytes, last ms]}`` of every byte recorded
        #: (folded or not) while a window may count it. Only :meth:`record` adds to it, so that
        #: measuring the window now costs a dozen samples, not a walk of the buckets.
        self._totals: dict[ClientKey, tuple[int, dict[int, list[int]]]] = {}

    def record(self, key: ClientKey, nbytes: int, now_ms: int, window_ms: int) -> None:
        sent = self._sent.get(key)
        if sent is None:
            sent = self._sent[key] = deque()
        if sent and sent[-1][0] == now_ms:
            sent[-1][1] += nbytes
        else:
            sent.append([now_ms, nbytes])
        width, totals = self._totals.get(key, (0, {}))
        if width != window_ms:  # new, or the live configuration changed the quota's samples
            totals = {}
            self._totals[key] = (window_ms, totals)
        total = totals.get(now_ms // window_ms)
        if total is None:
            totals[now_ms // window_ms] = [nbytes, now_ms]
        else:
            total[0] += nbytes
            total[1] = max(total[1], now_ms)

    def samples(
        self, keys: Iterable[ClientKey], window_ms: int, split_ms: int
    ) -> tuple[dict[int, tuple[int, int]], dict[int, tuple[int, int]]]:
        """The bytes forwarded for ``keys`` as a window's aligned samples, ``{sample: (bytes,
        last forwarded ms)}``: those up to ``split_ms`` (it must not be before what was folded),
        and all of them. The first walks the buckets up to ``split_ms`` only: once a refresh has
        folded a decision's, none."""
        until: dict[int, tuple[int, int]] = {}
        everything: dict[int, tuple[int, int]] = {}

        def add(samples: dict[int, tuple[int, int]], sample: int, nbytes: int, last: int) -> None:
            total, latest = samples.get(sample, (0, last))
            samples[sample] = (total + nbytes, max(latest, last))

        for key in keys:
            width, folded = self._folded.get(key, (window_ms, {}))
            if width == window_ms:
                for sample, (nbytes, last) in dict(folded).items():
                    add(until, sample, nbytes, last)
            for at, nbytes in tuple(self._sent.get(key, ())):
                if at > split_ms:
                    break  # recorded in time order
                add(until, at // window_ms, nbytes, at)
            width, totals = self._totals.get(key, (window_ms, {}))
            if width == window_ms:
                for sample, (nbytes, last) in dict(totals).items():
                    add(everything, sample, nbytes, last)
        return until, everything

    def fold(self, key: ClientKey, until_ms: int, window_ms: int, oldest_sample: int) -> None:
        """Folds the buckets at or before ``until_ms`` into their samples, and drops what is
        before ``oldest_sample`` (no window counts it any more)."""
        width, folded = self._folded.get(key, (window_ms, {}))
        if width != window_ms:  # the live configuration changed the quota's samples
            folded = {}
        self._folded[key] = (window_ms, folded)
        sent = self._sent.get(key)
        while sent and sent[0][0] <= until_ms:
            at, nbytes = sent[0]
            bucket = folded.setdefault(at // window_ms, [0, at])
            bucket[0] += nbytes
            bucket[1] = max(bucket[1], at)
            sent.popleft()
        for sample in [sample for sample in folded if sample < oldest_sample]:
            del folded[sample]
        while sent and sent[0][0] // window_ms < oldest_sample:
            sent.popleft()
        self._forget_samples_before(key, oldest_sample)

    def _forget_samples_before(self, key: ClientKey, oldest_sample: int) -> None:
        """Drops the totals' samples before ``oldest_sample``: old ones, which :meth:`record`
        (the current sample's only writer) no longer touches."""
        _, totals = self._totals.get(key, (0, {}))
        for sample in [sample for sample in list(totals) if sample < oldest_sample]:
            totals.pop(sample, None)

    def forget_until(self, key: ClientKey, until_ms: int) -> None:
        """Drops the buckets at or before ``until_ms`` (of a client no decision counts)."""
        self._folded.pop(key, None)
        sent = self._sent.get(key)
        while sent and sent[0][0] <= until_ms:
            sent.popleft()
        width, _ = self._totals.get(key, (1, {}))
        self._forget_samples_before(key, until_ms // width + 1)

    def forget(self, key: ClientKey) -> None:
        self._sent.pop(key, None)
        self._folded.pop(key, None)
        self._totals.pop(key, None)


def window_over_ms(  # noqa: PLR0917 (the window's five inputs, and the bytes asked about)
    decision: Decision,
    spec: WindowSpec,
    forwarded: Forwarded,
    keys: Iterable[ClientKey],
    now_ms: int,
    extra_bytes: int = 0,
) -> float | None:
    """How far (ms) the entity's window measured at ``now_ms``, with ``extra_bytes`` more, is
    over ``decision``'s limit: ``(rate - limit) / limit x window size``, Kafka's throttle before
    it is rounded (negative: how far under it). None where bytes do not decide a hold (the
    decision does not bind, or has no limit to divide by: unlimited, or 0, which no byte
    fits)."""
    if not decision.enforced or decision.limit is None or decision.limit <= 0:
        return None
    keys = tuple(keys)
    decided_at = decision.decided_at
    until_decided, since = forwarded.samples(keys, spec.window_ms, decided_at)
    counted = window_at(until_decided, decided_at, spec)
    by_others = max(decision.rate * decision.window_ms / 1000 - counted.nbytes, 0.0)
    samples = spread_over(
        since,
        by_others,
        decided_at + 1 - decision.window_ms,  # the window_ms ms up to decided_at
        decided_at + 1,
        spec.window_ms,
    )
    window = window_at(samples, max(now_ms, decided_at), spec)
    # Whole bytes again (bytes spread over samples sum to a hair more than they were), then the
    # rate as the engine measures it (``state.rolling``): the same double to round as its own.
    nbytes = round(window.nbytes + extra_bytes, 6)
    return over_bound_ms(rate_of(nbytes, window.size_ms), decision.limit, window.size_ms)


def hold_end(decision: Decision, over_ms: float | None, now_ms: int) -> int:
    """When (wall ms) a hold by ``decision`` ends, its window ``over_ms`` over its limit at
    ``now_ms``: Kafka's throttle of it, from then. Without bytes to decide (None), the decision's
    own ``until`` if it binds."""
    if over_ms is None:
        return now_ms if not decision.enforced else decision.until
    return max(now_ms, decision.decided_at) + throttle_of(over_ms)


def headroom_of(decision: Decision, over_ms: float | None) -> float:
    """The bytes a window ``over_ms`` over ``decision``'s limit has room for (none while over;
    unbounded where bytes decide no hold)."""
    if over_ms is None or decision.limit is None:
        return math.inf
    return max(-over_ms, 0.0) * decision.limit / 1000
