"""``quotastream replay --what-if``: the same traffic under several quota configurations.

Every configuration gets its own :class:`~state.shard.Shard`, and each validated batch of
events goes through all of them. A batch's decisions are reduced at once to per-counter aggregates
(events, throttled events, max throttle, limit, max rate/limit) and to throttled periods, merged
into running totals and dropped, so memory grows with the number of usage counters and the
periods they were throttled in, not with the events.

A counter is a (quota, entity) pair. The configuration decides the entities (a client quota's
precedence level decides who shares a counter), so one configuration may count ``user=alice``
where another counts ``user=alice,client-id=app``: the report keys rows by (quota, entity) and
leaves a configuration's cells blank for a counter it never had.

The headline is throttled wall time (``state.throttled_time``): the union of each decision's
throttle interval, cut short where the counter's next decision replaces it as the engine's release
timers do, within the replayed span (first to last accepted event). Summing ``throttle_ms``
instead would count every overlapping throttle again.

The traffic is replayed as recorded: a client throttled under one configuration does not slow
down in the replay of it, so a counter's rate is the same under every configuration that has it,
and only its limit, utilisation and throttle times differ.

The plot needs per-event rates of the top counters, which are known only once the whole input has
been read; rather than keep a series for every counter, :func:`report` reads the (seekable) input a
second time and keeps, for the plotted counters only, the max rate and limit per event-time bucket
(at most :data:`PLOT_POINTS` buckets over the input's time span).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TextIO

import numpy as np
import numpy.typing as npt
import pandas as pd

from state.config import QuotaConfig
from state.events import EventBounds
from state.shard import Shard
from state.throttled_time import Int64Array, Intervals, covered_ms, merge, release_ends
from streaming.commands.replay import ReplayStats, accepted_batches

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: The name of the ``--config`` file in the report.
BASE_NAME = "base"
DEFAULT_TOP = 20
#: ``--output``: aligned text, or one JSON document.
OUTPUTS = ("table", "json")
#: Panels in the plot at most: more make each too small to read.
MAX_PANELS = 6
#: Event-time buckets per plotted line at most.
PLOT_POINTS = 400

ObjectArray = npt.NDArray[np.object_]

#: Names appear as table cells and legend labels: keep them short and free of separators.
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,32}$")
_COUNTER = ["quota", "entity"]
#: How per-decision aggregates combine: a decision is an aggregate of one event, so one
#: reduction merges a batch's decisions into the running totals.
_SUMMED = ["events", "throttled"]
_MAXED = ["max_ms", "limit", "max_util"]
#: Columns of the report, in the table's order; throttled_ms and share come from the periods.
METRICS = ("throttled_ms", "share", *_SUMMED, *_MAXED)
_INTEGERS = ("throttled_ms", "events", "throttled", "max_ms")
_LEFT_ALIGNED = 3
#: Throttled periods drawn over each other stay apart by their hatching.
_HATCHES = ("////", "\\\\\\\\", "....", "xxxx", "----", "||||")
_LIMIT_DASHES = ((5, 2), (1, 1.5), (6, 1.5, 1, 1.5), (2, 2), (8, 3), (3, 1, 1, 1, 1, 1))


class WhatIfError(ValueError):
    """The what-if options are malformed or inconsistent; the message names the option."""


@dataclass(frozen=True)
class WhatIfOptions:
    alternatives: dict[str, Path]  # empty: a plain replay
    top: int
    plot: Path | None
    output: str


@dataclass(frozen=True)
class Comparison:
    #: Index (quota, entity); columns (config, metric) for each of :data:`METRICS`, NaN where the
    #: configuration has no such counter. Rows most throttled first (see :func:`compare`).
    table: pd.DataFrame
    #: Event-time span of the accepted events, None when there were none.
    span: tuple[int, int] | None
    #: Columns ``config, quota, entity, start, end``: each counter's throttled periods (epoch ms,
    #: merged; they may run past the span, which clips only what is counted).
    periods: pd.DataFrame


def parse_options(
    specs: Sequence[str] | None,
    top: int | None,
    plot: Path | None,
    output: str | None = None,
    *,
    from_stdin: bool,
) -> WhatIfOptions:
    """The options ``--what-if NAME=PATH`` (repeatable), ``--top``, ``--plot`` and ``--output``,
    checked, the plot's path included, before any event is read."""
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
    if not alternatives and output == "table":
        raise WhatIfError("without --what-if, replay writes JSON lines: --output table needs it")
    if top is not None and top < 1:
        raise WhatIfError(f"--top must be >= 1, got {top}")
    if plot is not None:
        if from_stdin:
            raise WhatIfError("--plot reads the events twice: give a file, not stdin")
        _check_plot_path(plot)
    return WhatIfOptions(
        alternatives, DEFAULT_TOP if top is None else top, plot, output or OUTPUTS[0]
    )


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
    output: str = "table",
    batch_lines: int = 65_536,
) -> ReplayStats:
    """Writes the comparison of ``configs`` over ``events`` (``output``: table or JSON), and the
    plot if asked.

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
    report_out.write(
        render_json(comparison, top) if output == "json" else render_table(comparison, top)
    )
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
        draw(series, comparison, counters, list(configs), plot)
    return stats


def compare(batches: Iterable[pd.DataFrame], configs: Mapping[str, QuotaConfig]) -> Comparison:
    """Per counter and configuration: throttled wall time and its share of the span, events,
    throttled events (``throttle_ms > 0``), max throttle, limit and max rate/limit (NaN when
    unlimited).

    ``batches`` are accepted-event frames (``state.events``) in input order. Rows are sorted by
    throttled time under the configuration that throttles the counter longest, then by max
    utilisation under any configuration, then by name: most throttled first.
    """
    shards = {name: Shard.new(config) for name, config in configs.items()}
    totals = dict.fromkeys(shards, _no_counters())
    throttles = {name: _ThrottledPeriods() for name in shards}
    first: int | None = None
    last: int | None = None
    for events in batches:
        if events.empty:
            continue
        ts = events["ts"].to_numpy()
        first = int(ts.min()) if first is None else min(first, int(ts.min()))
        last = int(ts.max()) if last is None else max(last, int(ts.max()))
        for name, shard in shards.items():
            decisions = shard.decide(events)
            # Decisions without a quota (remote_segment events) have no counter to report.
            measured = decisions[decisions["quota"].notna()]
            totals[name] = _reduce(pd.concat([totals[name], _one_each(measured)]))
            throttles[name].add(measured)
    span = None if first is None or last is None else (first, last)
    periods = {name: throttles[name].finish() for name in shards}
    for name in shards:
        totals[name] = _with_throttled_time(totals[name], periods[name], span)
    table = pd.concat(totals, axis=1, names=["config", "metric"])
    table = table.astype({(name, metric): "Int64" for name in shards for metric in _INTEGERS})
    return Comparison(
        _ranked(table), span, pd.concat(periods, names=["config"]).reset_index(level="config")
    )


def render_table(comparison: Comparison, top: int) -> str:
    """Plain aligned text: one line per counter and configuration, the counter named once.

    Blank cells: the configuration has no such counter. ``-``: unlimited (``limit``,
    ``max_util``), or no span to take a share of (``share``).
    """
    table = comparison.table
    names = _configs(table)
    header = ("quota", "entity", "config", *METRICS)
    rows: list[tuple[str, ...]] = [header]
    shown = table.head(top)
    for row in range(len(shown)):
        quota, entity = shown.index[row]
        for position, name in enumerate(names):
            label = (str(quota), str(entity)) if position == 0 else ("", "")
            rows.append((*label, name, *_cells(shown.iloc[row][name])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(width) if i < _LEFT_ALIGNED else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
    lines.append(
        f"({min(top, len(table))} of {len(table)} counters over {_span_ms(comparison) / 1000:.1f} s"
        " of events, most throttled first)"
    )
    return "\n".join(lines) + "\n"


def render_json(comparison: Comparison, top: int) -> str:
    """One JSON document: the span, the number of counters, and the first ``top`` counters'
    rows (one per configuration that has the counter; ``null``: unlimited, or no span)."""
    table = comparison.table.head(top)
    rows: list[dict[str, Any]] = []
    for position in range(len(table)):
        quota, entity = table.index[position]
        metrics = table.iloc[position]
        for name in _configs(table):
            if pd.isna(metrics[name, "events"]):
                continue
            cells: dict[str, Any] = {"quota": quota, "entity": entity, "config": name}
            for metric in METRICS:
                value = metrics[name, metric]
                cells[metric] = (
                    None if pd.isna(value) else int(value) if metric in _INTEGERS else float(value)
                )
            rows.append(cells)
    first, last = comparison.span or (None, None)
    document = {
        "first_ts": first,
        "last_ts": last,
        "span_ms": _span_ms(comparison),
        "counters": len(comparison.table),
        "rows": rows,
    }
    return json.dumps(document, separators=(",", ":")) + "\n"


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
        shards = {name: Shard.new(config) for name, config in configs.items()}
        for events in batches:
            for name, shard in shards.items():
                decisions = shard.decide(events)
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
    series: pd.DataFrame,
    comparison: Comparison,
    counters: Sequence[tuple[str, str]],
    configs: Sequence[str],
    path: Path,
) -> None:
    """Writes :func:`figure` as a PNG."""
    figure(series, comparison, counters, configs).savefig(path, format="png", dpi=100)


def figure(
    series: pd.DataFrame,
    comparison: Comparison,
    counters: Sequence[tuple[str, str]],
    configs: Sequence[str],
) -> Figure:
    """One panel per counter: per configuration, its throttled periods shaded (a hatching of its
    own, labelled ``NAME throttled``), its rate (solid) and its limit (steps, a dash pattern of its
    own)."""
    # Only --plot pays for matplotlib, and Figure with the Agg canvas leaves pyplot's global
    # backend alone.
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415
    from matplotlib.lines import Line2D  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415
    from matplotlib.ticker import EngFormatter  # noqa: PLC0415

    panels = max(1, len(counters))
    drawing = Figure(figsize=(10, 1.2 + 2.4 * panels), layout="constrained")
    FigureCanvasAgg(drawing)
    axes = drawing.subplots(panels, 1, sharex=True, squeeze=False)[:, 0]
    # Where configurations agree the lines and shading coincide: earlier ones are drawn wider,
    # and each shades with its own hatching, so that every configuration stays visible.
    colour = {name: f"C{i % 10}" for i, name in enumerate(configs)}
    width = {name: 1.0 + 1.2 * (len(configs) - 1 - i) for i, name in enumerate(configs)}
    hatch = {name: _HATCHES[i % len(_HATCHES)] for i, name in enumerate(configs)}
    dashes = {name: _LIMIT_DASHES[i % len(_LIMIT_DASHES)] for i, name in enumerate(configs)}
    first = comparison.span[0] if comparison.span else 0
    periods = comparison.periods
    if not counters:
        axes[0].text(0.5, 0.5, "no decisions", ha="center", va="center")
    for ax, (quota, entity) in zip(axes, counters, strict=False):
        rows = series[(series["quota"] == quota) & (series["entity"] == entity)]
        throttled = periods[(periods["quota"] == quota) & (periods["entity"] == entity)]
        for name in configs:
            mine = throttled[throttled["config"] == name]
            starts = (mine["start"].to_numpy() - first) / 1000
            ax.broken_barh(
                list(zip(starts, (mine["end"] - mine["start"]).to_numpy() / 1000, strict=True)),
                (0, 1),
                transform=ax.get_xaxis_transform(),  # full height, whatever the rates
                facecolor=(colour[name], 0.12),
                edgecolor=(colour[name], 0.6),
                hatch=hatch[name],
                linewidth=0,
                label=f"{name} throttled",
            )
            line = rows[rows["config"] == name]
            ax.plot(line["seconds"], line["rate"], color=colour[name], linewidth=width[name])
            ax.step(
                line["seconds"],
                line["limit"],
                where="post",
                dashes=dashes[name],
                color=colour[name],
                linewidth=width[name],
            )
        ax.set_title(f"{quota}  {entity}", fontsize="medium", loc="left")
        ax.yaxis.set_major_formatter(EngFormatter(unit="B/s"))
        ax.set_ylim(bottom=0)
    if _span_ms(comparison):  # throttles may run past the last event: show the span only
        axes[-1].set_xlim(0, _span_ms(comparison) / 1000)
    axes[-1].set_xlabel(
        "event time, s after the first event (rate: max per bucket; shaded: throttled)"
    )
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
                dashes=dashes[name],
                label=f"{name} limit",
            ),
            Patch(
                facecolor=(colour[name], 0.12),
                edgecolor=(colour[name], 0.6),
                hatch=hatch[name],
                linewidth=0,
                label=f"{name} throttled",
            ),
        )
    ]
    drawing.legend(
        handles=handles,
        loc="outside upper center",
        ncols=min(3, len(handles)),
        fontsize="small",
    )
    return drawing


class _ThrottledPeriods:
    """One configuration's throttled periods per counter, merged as the batches arrive.

    Each counter's latest decision stays open: the counter's next decision, maybe in a later
    batch, replaces it and so may end its throttle early (``state.throttled_time.release_ends``).
    Plain arrays rather than frames: this runs for every batch and configuration.
    """

    def __init__(self) -> None:
        self.latest = _CounterTimes.empty()  # (ts, throttle_ms) of each counter's last decision
        self.periods = _CounterTimes.empty()  # (start, end), merged per counter

    def add(self, decisions: pd.DataFrame) -> None:
        """Decisions of one batch, in input order, with a counter each."""
        rows = self.latest.append(
            _CounterTimes(
                np.asarray(decisions["quota"], dtype=object),
                np.asarray(decisions["entity"], dtype=object),
                decisions["ts"].to_numpy(dtype=np.int64),
                decisions["throttle_ms"].to_numpy(dtype=np.int64),
            )
        )
        codes = rows.codes()
        ends = release_ends(codes, rows.first, rows.second)
        latest = np.zeros(len(codes), dtype=np.bool_)
        latest[len(codes) - 1 - np.unique(codes[::-1], return_index=True)[1]] = True
        self.latest = rows.take(latest)
        over = ~latest & (ends > rows.first)
        self._merge(
            _CounterTimes(rows.quota[over], rows.entity[over], rows.first[over], ends[over])
        )

    def finish(self) -> pd.DataFrame:
        """Every period, the latest decisions' throttles run to their end: ``quota, entity,
        start, end``, sorted by counter and start."""
        last = self.latest
        self._merge(_CounterTimes(last.quota, last.entity, last.first, last.first + last.second))
        self.latest = _CounterTimes.empty()
        return pd.DataFrame(
            {
                "quota": self.periods.quota,
                "entity": self.periods.entity,
                "start": self.periods.first,
                "end": self.periods.second,
            }
        )

    def _merge(self, new: _CounterTimes) -> None:
        if not len(new.quota):
            return
        rows = self.periods.append(new)
        codes = rows.codes()
        merged = merge(Intervals(codes, rows.first, rows.second))
        # The codes are dense and numbered in order of appearance: code c first appears at
        # row first_row[c].
        first_row = np.unique(codes, return_index=True)[1][merged.groups]
        self.periods = _CounterTimes(
            rows.quota[first_row], rows.entity[first_row], merged.starts, merged.ends
        )


@dataclass(frozen=True)
class _CounterTimes:
    """Rows of a counter (quota, entity) and two times: a decision's ``ts`` and ``throttle_ms``,
    or a period's ``start`` and ``end``."""

    quota: ObjectArray
    entity: ObjectArray
    first: Int64Array
    second: Int64Array

    @classmethod
    def empty(cls) -> _CounterTimes:
        names = np.empty(0, dtype=object)
        times = np.empty(0, dtype=np.int64)
        return cls(names, names, times, times)

    def append(self, other: _CounterTimes) -> _CounterTimes:
        return _CounterTimes(
            np.concatenate([self.quota, other.quota]),
            np.concatenate([self.entity, other.entity]),
            np.concatenate([self.first, other.first]),
            np.concatenate([self.second, other.second]),
        )

    def take(self, rows: npt.NDArray[np.bool_]) -> _CounterTimes:
        return _CounterTimes(
            self.quota[rows], self.entity[rows], self.first[rows], self.second[rows]
        )

    def codes(self) -> Int64Array:
        """A dense code per counter, numbered in order of appearance: each column factorized
        on its own and the pairs of codes numbered, much cheaper than hashing string tuples."""
        quota, _ = pd.factorize(self.quota)
        entity, entities = pd.factorize(self.entity)
        codes, _ = pd.factorize(quota.astype(np.int64) * (len(entities) + 1) + entity)
        return codes.astype(np.int64)


def _with_throttled_time(
    totals: pd.DataFrame, periods: pd.DataFrame, span: tuple[int, int] | None
) -> pd.DataFrame:
    """``totals`` with ``throttled_ms`` (the periods' length within ``span``) and ``share``."""
    counters = totals.index
    codes = counters.get_indexer(pd.MultiIndex.from_frame(periods[_COUNTER]))
    throttled = (
        covered_ms(
            Intervals(
                codes.astype(np.int64),
                periods["start"].to_numpy(dtype=np.int64),
                periods["end"].to_numpy(dtype=np.int64),
            ),
            len(counters),
            span,
        )
        if span is not None
        else np.zeros(len(counters), dtype=np.int64)
    )
    length = 0 if span is None else span[1] - span[0]
    share = throttled / length if length else np.full(len(counters), np.nan)
    return totals.assign(throttled_ms=throttled, share=share)[list(METRICS)]


def _frames(batches: Iterator[tuple[int, pd.DataFrame]]) -> Iterator[pd.DataFrame]:
    return (events for _, events in batches)


def _one_each(measured: pd.DataFrame) -> pd.DataFrame:
    """Each decision as an aggregate of one event, indexed by its counter."""
    throttle = measured["throttle_ms"].to_numpy()
    return pd.DataFrame(
        {
            "events": 1,
            "throttled": (throttle > 0).astype(np.int64),
            "max_ms": throttle,
            # NaN limit (unlimited) leaves NaN, which max skips.
            "limit": measured["limit"].to_numpy(),
            "max_util": (measured["rate"] / measured["limit"]).to_numpy(),
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
        {metric: pd.Series(dtype=np.float64) for metric in (*_SUMMED, *_MAXED)}, index=index
    ).astype({"events": np.int64, "throttled": np.int64, "max_ms": np.int64})


def _ranked(table: pd.DataFrame) -> pd.DataFrame:
    keys = pd.DataFrame(
        {
            "total": _metric(table, "throttled_ms").max(axis=1).to_numpy(),
            "utilisation": _metric(table, "max_util").max(axis=1).to_numpy(),
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


def _configs(table: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(table.columns.get_level_values("config")))


def _span_ms(comparison: Comparison) -> int:
    return 0 if comparison.span is None else comparison.span[1] - comparison.span[0]


def _cells(metrics: pd.Series) -> tuple[str, ...]:
    if pd.isna(metrics["events"]):
        return ("",) * len(METRICS)
    share, limit, utilisation = metrics["share"], metrics["limit"], metrics["max_util"]
    return (
        str(int(metrics["throttled_ms"])),
        "-" if pd.isna(share) else f"{share:.1%}",
        *(str(int(metrics[metric])) for metric in ("events", "throttled", "max_ms")),
        "-" if pd.isna(limit) else f"{limit:.15g}",
        "-" if pd.isna(utilisation) else f"{utilisation:.1%}",
    )


def _check_plot_path(plot: Path) -> None:
    """Refuses a plot path that cannot be written, before the replay spends its time."""
    if plot.suffix.lower() != ".png":
        raise WhatIfError(f"--plot {plot}: the plot is a PNG; give a path ending in .png")
    directory = plot.parent
    if not directory.exists():
        raise WhatIfError(f"--plot {plot}: directory {directory} does not exist")
    if not directory.is_dir():
        raise WhatIfError(f"--plot {plot}: {directory} is not a directory")
    if plot.is_dir():
        raise WhatIfError(f"--plot {plot}: is a directory")
    writable = os.access(directory, os.W_OK | os.X_OK) and (
        not plot.exists() or os.access(plot, os.W_OK)
    )
    if not writable:
        raise WhatIfError(f"--plot {plot}: not writable")
