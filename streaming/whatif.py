"""``quotastream replay --what-if``: the same traffic under several quota configurations.

Every configuration gets its own :class:`~state.core.QuotaCore`, and each validated batch of
events goes through all of them. A batch's decisions are reduced at once to per-counter aggregates
(events, throttled events, total and max throttle time, max rate/limit), merged into running
totals and dropped, so memory grows with the number of usage counters, not with the events.

A counter is a (quota, entity) pair. The configuration decides the entities (a client quota's
precedence level decides who shares a counter), so one configuration may count ``user=alice``
where another counts ``user=alice,client-id=app``: the report keys rows by (quota, entity) and
leaves a configuration's cells blank for a counter it never had.

The traffic is replayed as recorded: a client throttled under one configuration does not slow
down in the replay of it, so a counter's rate is the same under every configuration that has it,
and only its limit, utilisation and throttle times differ.

The plot needs per-event rates of the top counters, which are known only once the whole input has
been read; rather than keep a series for every counter, :func:`report` reads the (seekable) input a
second time and keeps, for the plotted counters only, the max rate and limit per event-time bucket
(at most :data:`PLOT_POINTS` buckets over the input's time span).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import BinaryIO, TextIO

import numpy as np
import pandas as pd

from state.config import QuotaConfig
from state.core import QuotaCore
from state.events import EventBounds
from streaming.replay import ReplayStats, accepted_batches

#: The name of the ``--config`` file in the report.
BASE_NAME = "base"
DEFAULT_TOP = 20
#: Panels in the plot at most: more make each too small to read.
MAX_PANELS = 6
#: Event-time buckets per plotted line at most.
PLOT_POINTS = 400

#: Names appear as table cells and legend labels: keep them short and free of separators.
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,32}$")
_COUNTER = ["quota", "entity"]
#: How aggregates combine. A decision is an aggregate of one event, so one reduction merges a
#: batch's decisions into the running totals.
_SUMMED = ["events", "throttled", "throttle_ms"]
_MAXED = ["max_throttle_ms", "max_utilisation"]
METRICS = (*_SUMMED, *_MAXED)
_COUNTS = ("events", "throttled", "throttle_ms", "max_throttle_ms")
_HEADER = ("quota", "entity", "config", "events", "throttled", "throttle_ms", "max_ms", "max_util")
_LEFT_ALIGNED = 3


class WhatIfError(ValueError):
    """The what-if options are malformed or inconsistent; the message names the option."""


@dataclass(frozen=True)
class WhatIfOptions:
    alternatives: dict[str, Path]  # empty: a plain replay
    top: int
    plot: Path | None


@dataclass(frozen=True)
class Comparison:
    #: Index (quota, entity); columns (config, metric) for each of :data:`METRICS`, NaN where the
    #: configuration has no such counter. Rows most throttled first (see :func:`compare`).
    table: pd.DataFrame
    #: Event-time span of the accepted events, None when there were none.
    span: tuple[int, int] | None


def parse_options(
    specs: Sequence[str] | None, top: int | None, plot: Path | None, *, from_stdin: bool
) -> WhatIfOptions:
    """The options ``--what-if NAME=PATH`` (repeatable), ``--top`` and ``--plot``, checked."""
    alternatives: dict[str, Path] = {}
    for spec in specs or ():
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise WhatIfError(f"--what-if expects NAME=PATH, got {spec!r}")
        if not _NAME.match(name):
            raise WhatIfError(
                f"--what-if name {name!r}: use up to 32 letters, digits, '.', '_' or '-'"
            )
        if name == BASE_NAME:
            raise WhatIfError(f"--what-if name {BASE_NAME!r} is taken by the --config file")
        if name in alternatives:
            raise WhatIfError(f"--what-if name {name!r} is given twice")
        alternatives[name] = Path(path)
    if not alternatives and (top is not None or plot is not None):
        raise WhatIfError("--top and --plot apply only with --what-if")
    if top is not None and top < 1:
        raise WhatIfError(f"--top must be >= 1, got {top}")
    if plot is not None and from_stdin:
        raise WhatIfError("--plot reads the events twice: give a file, not stdin")
    return WhatIfOptions(alternatives, DEFAULT_TOP if top is None else top, plot)


def report(
    events: BinaryIO,
    *,
    configs: Mapping[str, QuotaConfig],
    report_out: TextIO,
    dead_letter_out: TextIO,
    bounds: EventBounds,
    max_payload_bytes: int,
    top: int,
    plot: Path | None = None,
    batch_lines: int = 65_536,
) -> ReplayStats:
    """Writes the comparison table of ``configs`` over ``events``, and the plot if asked.

    Rejected lines go to ``dead_letter_out`` once, as in a plain replay. With ``plot``,
    ``events`` must be seekable.
    """
    read = partial(
        accepted_batches,
        bounds=bounds,
        max_payload_bytes=max_payload_bytes,
        batch_lines=batch_lines,
    )
    stats = ReplayStats()
    comparison = compare(_frames(read(events, stats, dead_letter_out=dead_letter_out)), configs)
    report_out.write(render_table(comparison, top))
    if plot is not None:
        counters = list(comparison.table.index[: min(top, MAX_PANELS)])
        events.seek(0)
        # The first pass wrote and counted the rejects already.
        with open(os.devnull, "w", encoding="utf-8") as discard:
            series = trace(
                _frames(read(events, ReplayStats(), dead_letter_out=discard)),
                configs,
                counters,
                comparison.span,
            )
        draw(series, counters, list(configs), plot)
    return stats


def compare(batches: Iterable[pd.DataFrame], configs: Mapping[str, QuotaConfig]) -> Comparison:
    """Per counter and configuration: events, throttled events (``throttle_ms > 0``), total and
    max throttle time, max rate/limit (NaN when unlimited).

    ``batches`` are accepted-event frames (``state.events``) in input order. Rows are sorted by
    total throttle time under the configuration that throttles the counter most, then by max
    utilisation under any configuration, then by name: most throttled first.
    """
    cores = {name: QuotaCore(config) for name, config in configs.items()}
    totals = dict.fromkeys(cores, _no_counters())
    first: int | None = None
    last: int | None = None
    for events in batches:
        if events.empty:
            continue
        ts = events["ts"].to_numpy()
        first = int(ts.min()) if first is None else min(first, int(ts.min()))
        last = int(ts.max()) if last is None else max(last, int(ts.max()))
        for name, core in cores.items():
            totals[name] = _reduce(pd.concat([totals[name], _one_each(core.decide(events))]))
    table = pd.concat(totals, axis=1, names=["config", "metric"])
    table = table.astype({(name, metric): "Int64" for name in cores for metric in _COUNTS})
    return Comparison(_ranked(table), None if first is None or last is None else (first, last))


def render_table(comparison: Comparison, top: int) -> str:
    """Plain aligned text: one line per counter and configuration, the counter named once.

    Blank cells: the configuration has no such counter. ``-`` under ``max_util``: unlimited.
    """
    table = comparison.table
    names = list(dict.fromkeys(table.columns.get_level_values("config")))
    rows: list[tuple[str, ...]] = [_HEADER]
    shown = table.head(top)
    for row in range(len(shown)):
        quota, entity = shown.index[row]
        for position, name in enumerate(names):
            label = (str(quota), str(entity)) if position == 0 else ("", "")
            rows.append((*label, name, *_cells(shown.iloc[row][name])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADER))]
    lines = [
        "  ".join(
            cell.ljust(width) if i < _LEFT_ALIGNED else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
    lines.append(f"({min(top, len(table))} of {len(table)} counters, most throttled first)")
    return "\n".join(lines) + "\n"


def trace(
    batches: Iterable[pd.DataFrame],
    configs: Mapping[str, QuotaConfig],
    counters: Sequence[tuple[str, str]],
    span: tuple[int, int] | None,
    points: int = PLOT_POINTS,
) -> pd.DataFrame:
    """Rate and limit of ``counters`` over event time, one series per configuration.

    Columns ``config, quota, entity, seconds`` (bucket start, after the first event), ``rate``
    (max in the bucket) and ``limit`` (NaN when unlimited). ``span`` is the events' time span, as
    :func:`compare` found it; it sets the bucket width so that there are at most ``points``.
    """
    keys = ["config", *_COUNTER, "bucket"]
    series = pd.DataFrame(
        {
            **{key: pd.Series(dtype=object) for key in keys[:-1]},
            "bucket": pd.Series(dtype=np.int64),
            "rate": pd.Series(dtype=np.float64),
            "limit": pd.Series(dtype=np.float64),
        }
    )
    width = 1
    if span is not None and counters:
        first, last = span
        width = max(1, -(-(last - first + 1) // points))
        wanted = pd.MultiIndex.from_tuples(counters, names=_COUNTER)
        cores = {name: QuotaCore(config) for name, config in configs.items()}
        for events in batches:
            for name, core in cores.items():
                decisions = core.decide(events)
                counter = pd.MultiIndex.from_arrays(
                    [decisions[c].astype(object) for c in _COUNTER], names=_COUNTER
                )
                mine = decisions[counter.isin(wanted)]
                part = pd.DataFrame(
                    {
                        "config": name,
                        **{c: mine[c].astype(object).to_numpy() for c in _COUNTER},
                        "bucket": (mine["ts"].to_numpy() - first) // width,
                        "rate": mine["rate"].to_numpy(),
                        "limit": mine["limit"].to_numpy(),
                    }
                )
                series = (
                    pd.concat([series, part])
                    .groupby(keys, sort=False, as_index=False)[["rate", "limit"]]
                    .max()
                )
    series["seconds"] = series.pop("bucket") * width / 1000
    return series.sort_values(["config", *_COUNTER, "seconds"], ignore_index=True)


def draw(
    series: pd.DataFrame, counters: Sequence[tuple[str, str]], configs: Sequence[str], path: Path
) -> None:
    """A PNG with one panel per counter: rate (solid) and limit (dashed steps) per configuration."""
    # Only --plot pays for matplotlib, and Figure with the Agg canvas leaves pyplot's global
    # backend alone.
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415
    from matplotlib.lines import Line2D  # noqa: PLC0415
    from matplotlib.ticker import EngFormatter  # noqa: PLC0415

    panels = max(1, len(counters))
    figure = Figure(figsize=(10, 1.2 + 2.4 * panels), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(panels, 1, sharex=True, squeeze=False)[:, 0]
    # Where configurations agree the lines coincide: earlier ones are drawn wider so that every
    # configuration stays visible underneath the later ones.
    colour = {name: f"C{i % 10}" for i, name in enumerate(configs)}
    width = {name: 1.0 + 1.2 * (len(configs) - 1 - i) for i, name in enumerate(configs)}
    if not counters:
        axes[0].text(0.5, 0.5, "no decisions", ha="center", va="center")
    for ax, (quota, entity) in zip(axes, counters, strict=False):
        rows = series[(series["quota"] == quota) & (series["entity"] == entity)]
        for name in configs:
            line = rows[rows["config"] == name]
            ax.plot(line["seconds"], line["rate"], color=colour[name], linewidth=width[name])
            ax.step(
                line["seconds"],
                line["limit"],
                where="post",
                linestyle="--",
                color=colour[name],
                linewidth=width[name],
            )
        ax.set_title(f"{quota}  {entity}", fontsize="medium", loc="left")
        ax.yaxis.set_major_formatter(EngFormatter(unit="B/s"))
        ax.set_ylim(bottom=0)
    axes[-1].set_xlabel("event time, s after the first event (rate: max per bucket)")
    handles = [
        handle
        for name in configs
        for handle in (
            Line2D([], [], color=colour[name], linewidth=width[name], label=f"{name} rate"),
            Line2D(
                [],
                [],
                color=colour[name],
                linewidth=width[name],
                linestyle="--",
                label=f"{name} limit",
            ),
        )
    ]
    figure.legend(
        handles=handles,
        loc="outside upper center",
        ncols=min(4, len(handles)),
        fontsize="small",
    )
    figure.savefig(path, format="png", dpi=100)


def _frames(batches: Iterator[tuple[int, pd.DataFrame]]) -> Iterator[pd.DataFrame]:
    return (events for _, events in batches)


def _one_each(decisions: pd.DataFrame) -> pd.DataFrame:
    """Each decision as an aggregate of one event, indexed by its counter."""
    # Decisions without a quota (remote_segment events) have no counter to report.
    measured = decisions[decisions["quota"].notna()]
    throttle = measured["throttle_ms"].to_numpy()
    return pd.DataFrame(
        {
            "events": 1,
            "throttled": (throttle > 0).astype(np.int64),
            "throttle_ms": throttle,
            "max_throttle_ms": throttle,
            # NaN limit (unlimited) leaves NaN, which max skips.
            "max_utilisation": (measured["rate"] / measured["limit"]).to_numpy(),
        },
        index=pd.MultiIndex.from_arrays(
            [measured[c].astype(object).to_numpy() for c in _COUNTER], names=_COUNTER
        ),
    )


def _reduce(stats: pd.DataFrame) -> pd.DataFrame:
    grouped = stats.groupby(level=_COUNTER, sort=False)
    return pd.concat([grouped[_SUMMED].sum(), grouped[_MAXED].max()], axis=1)


def _no_counters() -> pd.DataFrame:
    index = pd.MultiIndex.from_arrays([[], []], names=_COUNTER)
    return pd.DataFrame(
        {metric: pd.Series(dtype=np.float64) for metric in METRICS}, index=index
    ).astype(dict.fromkeys(_COUNTS, np.int64))


def _ranked(table: pd.DataFrame) -> pd.DataFrame:
    keys = pd.DataFrame(
        {
            "total": _metric(table, "throttle_ms").max(axis=1).to_numpy(),
            "utilisation": _metric(table, "max_utilisation").max(axis=1).to_numpy(),
            "quota": table.index.get_level_values("quota"),
            "entity": table.index.get_level_values("entity"),
        }
    )
    order = keys.sort_values(
        ["total", "utilisation", "quota", "entity"],
        ascending=[False, False, True, True],
        na_position="last",
    ).index
    return table.iloc[order]


def _metric(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One metric's column for every configuration."""
    return table.loc[:, pd.IndexSlice[:, metric]]


def _cells(metrics: pd.Series) -> tuple[str, ...]:
    if pd.isna(metrics["events"]):
        return ("",) * len(METRICS)
    utilisation = metrics["max_utilisation"]
    return (
        *(str(int(metrics[metric])) for metric in _COUNTS),
        "-" if pd.isna(utilisation) else f"{utilisation:.1%}",
    )
