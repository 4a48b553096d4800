"""One entity's quota window, measured from its samples: the rule the engine's columnar counters
vectorise (:mod:`state.rolling`), for one entity at one instant.

An enforcement point that counts what it forwarded (``quotastream proxy``) measures its own
samples by it between the engine's decisions: Kafka checks a quota against the window as it is
when a request arrives, and a window forgets its oldest sample as it slides, which a decision
made a second earlier cannot know. Pure Python (no numpy): it runs in the agents' process.

The rule (``docs/semantics.md``): samples are aligned, ``ts // window_ms``. At clock ``c`` the
samples ``c // window_ms - samples + 1 ..`` count whole; the one before them (Kafka's
overlapping sample) counts while its last event is newer than ``c - samples x window_ms``.
``Rate`` (client quotas) measures over ``samples - 1`` windows plus the elapsed part of the
current one, and one window more while the overlapping sample counts; ``SimpleRate`` from the
oldest counted sample's start, at least one window.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from state.config import QuotaConfig
from state.quota_types import WINDOW_RULE, QuotaType, WindowRule


@dataclass(frozen=True)
class WindowSpec:
    samples: int
    window_ms: int
    rule: WindowRule

    @property
    def slots(self) -> int:
        """Samples an entity keeps: the window's and Kafka's extra overlapping one."""
        return self.samples + 1

    @property
    def span_ms(self) -> int:
        """How far back a sample can still count: the window and the overlapping sample."""
        return self.slots * self.window_ms

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise ValueError(f"samples must be >= 1, got {self.samples}")
        if self.window_ms < 1:
            raise ValueError(f"window_ms must be >= 1, got {self.window_ms}")


def window_spec(config: QuotaConfig, quota_type: QuotaType) -> WindowSpec:
    """How ``quota_type`` measures usage under ``config``."""
    settings = config.quota_types.of(quota_type)
    return WindowSpec(
        samples=settings.samples, window_ms=settings.window_ms, rule=WINDOW_RULE[quota_type]
    )


@dataclass(frozen=True)
class Window:
    """The bytes a window counts and the time they are measured over."""

    nbytes: float
    size_ms: int


#: ``{sample: (bytes, last event ms)}``: what an entity keeps of its window.
Samples = Mapping[int, tuple[float, int]]


def window_at(samples: Samples, clock_ms: int, spec: WindowSpec) -> Window:
    """The window at ``clock_ms`` of an entity whose samples are ``{sample: (bytes, last event
    ms)}`` (samples after the clock's own are not counted: they have not happened yet)."""
    width = spec.window_ms
    low = clock_ms // width - spec.samples + 1  # the oldest sample counted whole
    current = clock_ms // width
    whole = [sample for sample in samples if low <= sample <= current]
    overlapping = samples.get(low - 1)
    overlaps = overlapping is not None and overlapping[1] > clock_ms - spec.samples * width
    nbytes = sum(samples[sample][0] for sample in whole)
    if overlapping is not None and overlaps:
        nbytes += overlapping[0]
    if spec.rule is WindowRule.RATE:
        size = (spec.samples - 1 + overlaps) * width + clock_ms % width
    else:
        oldest = low - 1 if overlaps else min(whole, default=current)
        size = max(clock_ms - oldest * width, width)
    return Window(nbytes=nbytes, size_ms=max(size, 1))


def spread_over(
    samples: Samples, nbytes: float, from_ms: int, to_ms: int, window_ms: int
) -> dict[int, tuple[float, int]]:
    """``samples`` and ``nbytes`` recorded evenly over ``from_ms`` .. ``to_ms``: bytes a
    window is known to hold without knowing when each came (a rate over a window), placed as a
    steady stream would have put them, so that they leave the window as it slides past."""
    spread = dict(samples)
    span = to_ms - from_ms
    if nbytes <= 0 or span <= 0:
        return spread
    for sample in range(from_ms // window_ms, (to_ms - 1) // window_ms + 1):
        start, end = max(sample * window_ms, from_ms), min((sample + 1) * window_ms, to_ms)
        held, last = spread.get(sample, (0.0, end - 1))
        spread[sample] = (held + nbytes * (end - start) / span, max(last, end - 1))
    return spread
