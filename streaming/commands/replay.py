"""``quotastream replay``: the core over a file of events, one decision line per accepted event.

The file is read in batches of lines; each batch goes through the same validator and the same
:class:`~state.shard.Shard` the streaming job steps (one shard holds every entity here), decided
event by event. Decisions do not depend on the batch size (tests check this), so it only bounds
memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO, TextIO

import msgspec
import numpy as np
import pandas as pd

from state.core import COMMON_COLUMNS, QUOTA_COLUMNS
from state.event_contract import dead_letter_record
from state.events import EventBounds, parse_events
from state.quota_types import QuotaType
from state.shard import Shard

#: Every line starts with ``line`` (1-based input line number); replication lines also say which
#: replica the decision is about.
_CONTEXT = {
    QuotaType.LEADER_REPLICATION: ("topic", "partition", "replica"),
    QuotaType.FOLLOWER_REPLICATION: ("topic", "partition", "replica"),
}
_FIELDS_BY_QUOTA = {
    quota.value: ["line", *COMMON_COLUMNS, *_CONTEXT.get(quota, ()), *QUOTA_COLUMNS[quota]]
    for quota in QuotaType
}
_NON_QUOTA_FIELDS = ["line", "ts", "kind", "quota", "topic", "partition"]
_ENCODE = msgspec.json.Encoder().encode


@dataclass
class ReplayStats:
    lines: int = 0
    accepted: int = 0
    rejected: int = 0
    rejected_by_reason: dict[str, int] = field(default_factory=dict)


def replay(
    events: BinaryIO,
    *,
    shard: Shard,
    decisions_out: TextIO,
    dead_letter_out: TextIO,
    bounds: EventBounds,
    max_payload_bytes: int,
    batch_lines: int = 65_536,
) -> ReplayStats:
    stats = ReplayStats()
    for first_line, accepted in accepted_batches(
        events,
        stats,
        dead_letter_out=dead_letter_out,
        bounds=bounds,
        max_payload_bytes=max_payload_bytes,
        batch_lines=batch_lines,
    ):
        decisions = shard.decide(accepted)
        decisions["line"] = decisions["position"] + first_line
        for column in ("topic", "partition", "replica"):
            decisions[column] = accepted[column].to_numpy()
        _write_lines(decision_lines(decisions), decisions_out)
    return stats


def accepted_batches(
    events: BinaryIO,
    stats: ReplayStats,
    *,
    dead_letter_out: TextIO,
    bounds: EventBounds,
    max_payload_bytes: int,
    batch_lines: int = 65_536,
) -> Iterator[tuple[int, pd.DataFrame]]:
    """Each batch's first line number and accepted events (``state.events``), in file order.

    A batch's rejected lines are written, and the batch counted in ``stats``, when the caller asks
    for the next one: its dead letters follow its decisions, and ``stats`` is complete once the
    iterator is exhausted.
    """
    for first_line, payloads in _batches(events, batch_lines):
        parsed = parse_events(payloads, bounds, max_payload_bytes)
        yield first_line, parsed.accepted
        rejected = parsed.rejected
        _write_lines(
            [_dead_letter_line(row, first_line) for row in rejected.itertuples()], dead_letter_out
        )
        stats.lines += len(payloads)
        stats.accepted += len(parsed.accepted)
        stats.rejected += len(rejected)
        for reason, count in rejected["reason"].value_counts().items():
            stats.rejected_by_reason[str(reason)] = stats.rejected_by_reason.get(
                str(reason), 0
            ) + int(count)


def decision_lines(decisions: pd.DataFrame) -> list[str]:
    """JSON lines in input order, each with the fields of its quota.

    Numbers are written as the Redis values are (``quotastream.redis_contract``, msgspec): a float
    as the shortest decimal that reads back as the same double, so a rate is the core's exact value
    without digits past a double's precision; null where NaN (unlimited).
    """
    lines = np.empty(len(decisions), dtype=object)
    quota = decisions["quota"].cat
    for code in np.unique(quota.codes):
        rows = np.flatnonzero(quota.codes == code)
        fields = _FIELDS_BY_QUOTA[quota.categories[code]] if code >= 0 else _NON_QUOTA_FIELDS
        subset = decisions.iloc[rows][fields]
        if "level" in subset:
            subset = subset.assign(level=subset["level"].where(subset["level"] > 0).astype("Int64"))
        columns = [_json_values(subset[field]) for field in fields]
        lines[rows] = [
            _ENCODE(dict(zip(fields, values, strict=True))).decode()
            for values in zip(*columns, strict=True)
        ]
    return list(lines)


def _json_values(column: pd.Series) -> list[Any]:
    """Python values (None where missing) for the encoder."""
    values = column.astype(object).to_numpy()
    values[column.isna().to_numpy()] = None
    python: list[Any] = values.tolist()
    return python


def _batches(events: BinaryIO, batch_lines: int) -> Iterator[tuple[int, list[bytes]]]:
    batch: list[bytes] = []
    first_line = 1
    for raw in events:
        batch.append(raw.rstrip(b"\r\n"))
        if len(batch) == batch_lines:
            yield first_line, batch
            first_line += len(batch)
            batch = []
    if batch:
        yield first_line, batch


def _dead_letter_line(row: Any, first_line: int) -> str:
    # ``index``: the event's place in a batched line; null when the line was one event.
    record = {
        "line": int(row.position) + first_line,
        "index": int(row.index) if row.index >= 0 else None,
    }
    record.update(dead_letter_record(str(row.reason), str(row.detail), row.payload))
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def _write_lines(lines: list[str], out: TextIO) -> None:
    if lines:
        out.write("\n".join(lines))
        out.write("\n")
