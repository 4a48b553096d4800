"""The engine's one parser/validator of the event contract (``docs/events.md``; its structs
are :mod:`state.event_contract`'s, which the publishers build).

Every path (``replay``, the streaming job) hands raw message payloads to :func:`parse_events`,
which returns the accepted events as one columnar frame and every rejected event with a reason.
A message holds one event object or a JSON array of them (a *batched message*): each element is
an event of its own, validated, accepted or rejected on its own, and known by its message's
position and its index in the array. Structure and types are checked per event by msgspec (in
C, with exact error paths); ranges, timestamp bounds and topic names are checked vectorised over
the accepted columns.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter, methodcaller
from typing import Any, ClassVar, NamedTuple, cast

import msgspec
import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from state.config import TOPIC_NAME
from state.event_contract import (
    EVENT_TYPES,
    STORAGE_KINDS,
    AnyEvent,
    Event,
    EventKind,
    RejectReason,
    RemoteSegment,
)

_DECODER = msgspec.json.Decoder(AnyEvent)

#: Columns of an accepted-events frame, with the value that stands for "absent in this kind".
EVENT_COLUMNS: dict[str, Any] = {
    "position": None,  # index of the message (payload) in the parsed batch
    "index": None,  # index of the event in its batched message; -1: the message is one event
    "kind": None,
    "ts": None,
    "bytes": None,
    "count": None,
    "user": None,
    "client_id": None,
    "broker": -1,
    "topic": None,
    "partition": -1,
    "role": None,
    "replica": -1,
    "in_sync": False,
    "leader_epoch": -1,
    "segment_id": None,
    "state": None,
    # remote_segment: its epochs (None: leader_epoch alone); leader_epochs: the lineage. As
    # state.leader_epochs.Epochs, sorted (epoch, first offset) pairs.
    "epochs": None,
    "end_offset": -1,  # remote_segment, -1 unknown
    "log_end_offset": -1,  # leader_epochs
}
_INT_COLUMNS = (
    "position",
    "index",
    "ts",
    "bytes",
    "count",
    "broker",
    "partition",
    "replica",
    "leader_epoch",
    "end_offset",
    "log_end_offset",
)
_NULLABLE_STRINGS = ("user", "client_id", "topic", "segment_id", "state")


@dataclass(frozen=True)
class EventBounds:
    """Accepted event times, epoch ms, both ends inclusive.

    The defaults only catch gross mistakes (seconds sent as milliseconds, garbage); the engine
    narrows them around its clock with :meth:`around`. The past bound narrows for traffic only:
    ``remote_segment`` and ``leader_epochs`` events state what the remote store and a log hold,
    which stays true however long ago it was written (a bridge that starts on a cluster publishes
    segments uploaded days before), so they keep ``min_storage_ts_ms``.
    """

    min_ts_ms: int = 946_684_800_000  # 2000-01-01
    max_ts_ms: int = 4_102_444_800_000  # 2100-01-01
    #: The earliest time of a storage event (None: ``min_ts_ms``).
    min_storage_ts_ms: int | None = None

    @property
    def storage_low_ms(self) -> int:
        return self.min_ts_ms if self.min_storage_ts_ms is None else self.min_storage_ts_ms

    def around(
        self, now_ms: int, max_past_ms: int | None, max_future_ms: int | None
    ) -> EventBounds:
        low = self.min_ts_ms if max_past_ms is None else max(self.min_ts_ms, now_ms - max_past_ms)
        high = (
            self.max_ts_ms if max_future_ms is None else min(self.max_ts_ms, now_ms + max_future_ms)
        )
        return EventBounds(min_ts_ms=low, max_ts_ms=high, min_storage_ts_ms=self.storage_low_ms)


@dataclass(frozen=True)
class ParsedEvents:
    accepted: pd.DataFrame  # EVENT_COLUMNS, in payload order
    #: position, index (as accepted's), reason, detail, payload (the event's original bytes)
    rejected: pd.DataFrame

    REJECTED_COLUMNS: ClassVar[tuple[str, ...]] = (
        "position",
        "index",
        "reason",
        "detail",
        "payload",
    )


def parse_events(
    payloads: Sequence[bytes],
    bounds: EventBounds = EventBounds(),
    max_payload_bytes: int = 65_536,
) -> ParsedEvents:
    """Validate raw JSON payloads; accepted events keep their payload order.

    ``max_payload_bytes`` bounds each event; a batched message as a whole is bounded by the
    broker's ``message.max.bytes``.
    """
    events = _split_batched(payloads, max_payload_bytes)
    results = _decoded(events)
    type_code = np.fromiter(map(_TYPE_CODE.__getitem__, map(type, results)), np.int8, len(results))
    by_type = {
        event_type: _pick(results, np.flatnonzero(type_code == code))
        for code, event_type in enumerate(EVENT_TYPES)
    }
    rejected = []
    for number in np.flatnonzero(type_code == _REJECTED_CODE).tolist():
        result = results[number]
        assert isinstance(result, _Rejected)
        rejected.append((number, -1, result.reason, result.detail, events.payload(number)))
    accepted = _columns(by_type)
    accepted, late_rejects = _check_values(accepted, events.payload, bounds)
    rejected_frame = pd.DataFrame(rejected, columns=list(ParsedEvents.REJECTED_COLUMNS))
    if len(late_rejects):
        rejected_frame = pd.concat([rejected_frame, late_rejects], ignore_index=True)
    rejected_frame = rejected_frame.sort_values("position", kind="stable", ignore_index=True)
    # Until here ``position`` numbers events; from here on it is their message's.
    for frame in (accepted, rejected_frame):
        numbers = frame["position"].to_numpy(dtype=np.int64)
        frame["index"] = events.index[numbers]
        frame["position"] = events.message[numbers]
    return ParsedEvents(accepted=accepted, rejected=rejected_frame)


def _decoded(events: _Split) -> list[Event | _Rejected]:
    """Every event decoded (or rejected): those still to decode are decoded here."""
    if events.undecided == len(events.results):
        # Every event still to decode: each is a message of its own, its bytes all there.
        return _decode_all(cast(list[bytes], events.payloads))
    if not events.undecided:  # every message was batched and decoded whole
        return cast(list[Event | _Rejected], events.results)
    undecided = [number for number, result in enumerate(events.results) if result is None]
    decoded = iter(_decode_all([events.payload(number) for number in undecided]))
    return [result if result is not None else next(decoded) for result in events.results]


@dataclass(frozen=True)
class _Split:
    """Every event of a batch of messages, batched messages split into their elements."""

    messages: Sequence[bytes]
    #: Per event: what decoding it gave (a whole batched message decodes at once), or None
    #: where it is still to be decoded from its bytes.
    results: list[Event | _Rejected | None]
    #: Per event: its bytes, where they were cut out (None: an element of a message that
    #: decoded whole; :meth:`payload` cuts it out when a dead letter needs it).
    payloads: list[bytes | None]
    message: npt.NDArray[np.int64]  # per event: its message's position
    index: npt.NDArray[np.int64]  # per event: its index in a batched message, -1 if none
    undecided: int  # how many results are None

    def payload(self, number: int) -> bytes:
        payload = self.payloads[number]
        if payload is None:
            elements = _BATCHED.decode(self.messages[int(self.message[number])])
            payload = bytes(elements[int(self.index[number])])
        return payload


_BATCHED = msgspec.json.Decoder(list[msgspec.Raw])
_EVENTS = msgspec.json.Decoder(list[AnyEvent])
_JSON_WHITESPACE = b" \t\r\n"
_STARTS_ARRAY = methodcaller("startswith", b"[")
_STARTS_SPACED = methodcaller("startswith", tuple(bytes([char]) for char in _JSON_WHITESPACE))


def _split_batched(payloads: Sequence[bytes], max_payload_bytes: int) -> _Split:
    """Splits each JSON array message into its events; other messages are one event each.

    A batched message whose every element is a valid event of at most ``max_payload_bytes``
    decodes in one call; otherwise each element is judged on its own. An array that is not
    valid JSON is one event, rejected whole; so is a payload over the limit.
    """
    split = _Splitting(payloads)
    done = 0
    for position in _not_plain(payloads, max_payload_bytes).tolist():
        split.plain(done, position)
        done = position + 1
        payload = payloads[position]
        batched = _is_batched(payload)
        if batched and len(payload) <= max_payload_bytes:
            # Every element is within the limit: one call decodes them all, if all are good.
            try:
                decoded = _EVENTS.decode(payload)
            except _DECODE_ERRORS:
                pass  # judged element by element below
            else:
                split.decoded_whole(position, decoded)
                continue
        elements = _decode_batched(payload) if batched else None
        if elements is None or isinstance(elements, _Rejected):
            split.one_event(
                position,
                elements if elements is not None else _too_large(payload, max_payload_bytes),
            )
            continue
        if max(map(len, elements), default=0) <= max_payload_bytes < len(payload):
            try:
                decoded = _EVENTS.decode(payload)
            except _DECODE_ERRORS:
                pass  # some element is bad: each is judged on its own below
            else:
                split.decoded_whole(position, decoded)
                continue
        split.elements(position, [bytes(element) for element in elements], max_payload_bytes)
    split.plain(done, len(payloads))
    return split.done()


class _Splitting:
    """A :class:`_Split` being built, a run of events at a time."""

    def __init__(self, payloads: Sequence[bytes]) -> None:
        self.payloads = payloads
        self.results: list[Event | _Rejected | None] = []
        self.events: list[bytes | None] = []
        # Per run of events: their messages' positions and their indexes in them.
        self.message: list[npt.NDArray[np.int64]] = []
        self.index: list[npt.NDArray[np.int64]] = []
        self.undecided = 0

    def plain(self, start: int, stop: int) -> None:
        """Messages ``start:stop`` are plain (one event each, to decode)."""
        self.results.extend([None] * (stop - start))
        self.events.extend(self.payloads[start:stop])
        self._one_each(start, stop)
        self.undecided += stop - start

    def one_event(self, position: int, result: _Rejected | None) -> None:
        """The message at ``position`` is one event: rejected whole, or None to decode."""
        self._result(result, self.payloads[position])
        self._one_each(position, position + 1)

    def decoded_whole(self, position: int, events: Sequence[Event]) -> None:
        self.results.extend(events)
        self.events.extend([None] * len(events))
        self._elements_of(position, len(events))

    def elements(self, position: int, elements: list[bytes], max_payload_bytes: int) -> None:
        """A batched message's elements, each to decode unless over the limit."""
        for element in elements:
            self._result(_too_large(element, max_payload_bytes), element)
        self._elements_of(position, len(elements))

    def done(self) -> _Split:
        """The split, after the last run of plain messages (possibly empty: a run is always
        there to concatenate)."""
        return _Split(
            self.payloads,
            self.results,
            self.events,
            np.concatenate(self.message),
            np.concatenate(self.index),
            self.undecided,
        )

    def _result(self, result: _Rejected | None, payload: bytes) -> None:
        self.results.append(result)
        self.events.append(payload)
        self.undecided += result is None

    def _one_each(self, start: int, stop: int) -> None:
        self.message.append(np.arange(start, stop, dtype=np.int64))
        self.index.append(np.full(stop - start, -1, dtype=np.int64))

    def _elements_of(self, position: int, count: int) -> None:
        self.message.append(np.full(count, position, dtype=np.int64))
        self.index.append(np.arange(count, dtype=np.int64))


def _not_plain(payloads: Sequence[bytes], max_payload_bytes: int) -> npt.NDArray[np.intp]:
    """The positions of the messages that are batched (a JSON array) or over the limit: the
    others are one event each, to decode as they are (found without a Python loop)."""
    count = len(payloads)
    too_large = np.fromiter(map(len, payloads), np.int64, count) > max_payload_bytes
    array = np.fromiter(map(_STARTS_ARRAY, payloads), np.bool_, count)
    spaced = np.fromiter(map(_STARTS_SPACED, payloads), np.bool_, count)
    for position in np.flatnonzero(spaced).tolist():
        array[position] = _is_batched(payloads[position])
    return np.flatnonzero(array | too_large)


def _is_batched(payload: bytes) -> bool:
    """A JSON array (maybe after whitespace): a batched message."""
    return payload[:1] == b"[" or (payload[:1] in _JSON_WHITESPACE and payload.lstrip()[:1] == b"[")


def _too_large(payload: bytes, max_payload_bytes: int) -> _Rejected | None:
    """The rejection of a payload over the limit (it is not decoded); None for the others."""
    if len(payload) <= max_payload_bytes:
        return None
    detail = f"payload is {len(payload)} bytes, the limit is {max_payload_bytes}"
    return _Rejected(RejectReason.TOO_LARGE, detail)


def _decode_batched(payload: bytes) -> list[msgspec.Raw] | _Rejected:
    try:
        return _BATCHED.decode(payload)
    except _DECODE_ERRORS as exc:
        return _rejection(exc)


class _Rejected(NamedTuple):
    reason: RejectReason
    detail: str


_DECODE_ERRORS = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)
#: How msgspec (0.23 and later) begins its error for a string that is not UTF-8.
_NOT_UTF8 = "Invalid UTF-8"


def _rejection(error: Exception) -> _Rejected:
    """Why msgspec could not decode a payload (one of ``_DECODE_ERRORS``)."""
    if isinstance(error, msgspec.ValidationError):
        return _Rejected(_validation_reason(str(error)), str(error))
    # msgspec 0.23 reports a string that is not UTF-8 as a DecodeError; earlier versions
    # raised UnicodeDecodeError.
    if isinstance(error, UnicodeDecodeError) or str(error).startswith(_NOT_UTF8):
        return _Rejected(RejectReason.INVALID_UTF8, str(error))
    if isinstance(error, msgspec.DecodeError):
        return _Rejected(RejectReason.INVALID_JSON, str(error))
    return _Rejected(RejectReason.TOO_DEEP, "JSON is nested too deeply")


_TYPE_CODE: dict[type, int] = {event_type: code for code, event_type in enumerate(EVENT_TYPES)}
_REJECTED_CODE = len(EVENT_TYPES)
_TYPE_CODE[_Rejected] = _REJECTED_CODE


def _decode_all(payloads: Sequence[bytes]) -> list[Event | _Rejected]:
    """Decode every payload; a payload that fails becomes a :class:`_Rejected` in its place.

    ``list.extend(map(...))`` runs the decoder in a C loop; when one payload raises, the results
    before it are kept and decoding resumes after it.
    """
    results: list[Event | _Rejected] = []
    remaining = iter(payloads)
    while True:
        try:
            results.extend(map(_DECODER.decode, remaining))
            break
        except _DECODE_ERRORS as exc:
            results.append(_rejection(exc))
    if len(results) != len(payloads):
        raise RuntimeError("decoded results do not line up with payloads")
    return results


@dataclass(frozen=True)
class _OfKind:
    positions: npt.NDArray[np.int64]
    events: list[Event]


def _pick(results: list[Event | _Rejected], positions: npt.NDArray[np.intp]) -> _OfKind:
    events: list[Event] = list(map(results.__getitem__, positions.tolist()))  # type: ignore[arg-type]
    return _OfKind(positions.astype(np.int64), events)


def empty_events() -> pd.DataFrame:
    return _typed(pd.DataFrame({column: [] for column in EVENT_COLUMNS}))


# msgspec says "Expected `int`, got `str` - at `$.bytes`" for a wrong type, and adds a
# constraint ("Expected `int` >= 0 ...") for a value out of range.
_TYPE_ERROR = re.compile(r"^Expected `[^`]+`(, got `[^`]+`)?( - at |$)")


def _validation_reason(message: str) -> RejectReason:
    if message.startswith("Expected `object`") and " - at " not in message:
        return RejectReason.NOT_AN_OBJECT
    if message.startswith("Object missing required field"):
        return RejectReason.MISSING_FIELD
    if message.startswith("Invalid value") and message.endswith("- at `$.kind`"):
        return RejectReason.UNKNOWN_KIND
    if _TYPE_ERROR.match(message):
        return RejectReason.WRONG_TYPE
    return RejectReason.INVALID_VALUE


KIND_DTYPE = pd.CategoricalDtype([kind.value for kind in EventKind])
ROLE_DTYPE = pd.CategoricalDtype(["leader", "follower"])
_ROLE_CODE = {role: code for code, role in enumerate(ROLE_DTYPE.categories)}
_COLUMN_DTYPE: dict[str, Any] = {
    **dict.fromkeys(_INT_COLUMNS, np.int64),
    **dict.fromkeys(_NULLABLE_STRINGS, object),
    "epochs": object,
    "in_sync": np.bool_,
    "kind": np.int8,  # category codes
    "role": np.int8,  # category codes, -1 where absent
}


#: Columns filled from a field of another name.
_FIELD_OF_COLUMN: dict[tuple[type[Event], str], str] = {
    (RemoteSegment, "epochs"): "segment_leader_epochs"
}


def _sorted_pairs(epochs: dict[int, int]) -> tuple[tuple[int, int], ...]:
    return tuple(sorted(epochs.items()))


def _columns(decoded: dict[type[Event], _OfKind]) -> pd.DataFrame:
    """Typed columns straight from the decoded structs, in payload order: each column starts
    as what stands for "absent" and each kind's values go straight to its events' rows (no
    per-kind arrays concatenated and reordered after)."""
    kinds = [(event_type, of_kind) for event_type, of_kind in decoded.items() if of_kind.events]
    if not kinds:
        return empty_events()
    total = sum(len(of_kind.events) for _, of_kind in kinds)
    rows_of = _rows_of_kinds([of_kind.positions for _, of_kind in kinds])
    data: dict[str, Any] = {}
    for column, absent in EVENT_COLUMNS.items():
        dtype = _COLUMN_DTYPE[column]
        fill = -1 if column in ("role", "index") else absent
        data[column] = (
            np.empty(total, dtype)
            if fill is None and dtype is not object
            else np.full(total, fill, dtype)
        )
    for (event_type, of_kind), rows in zip(kinds, rows_of, strict=True):
        events = of_kind.events
        count = len(events)
        fields = set(event_type.__struct_fields__)
        data["position"][rows] = of_kind.positions
        data["kind"][rows] = KIND_DTYPE.categories.get_loc(event_type.__struct_config__.tag)
        for column in EVENT_COLUMNS:
            field = _FIELD_OF_COLUMN.get((event_type, column), column)
            if column in {"position", "kind", "index"} or field not in fields:
                continue  # "index" is set by parse_events
            values: Iterable[Any] = map(attrgetter(field), events)
            if column == "role":
                values = map(_ROLE_CODE.__getitem__, values)
            elif column in ("end_offset", "partition", "replica"):
                values = (-1 if value is None else value for value in values)
            elif column == "in_sync":
                values = (value is True for value in values)
            elif column == "epochs":
                values = (None if value is None else _sorted_pairs(value) for value in values)
            data[column][rows] = np.fromiter(values, _COLUMN_DTYPE[column], count)
    data["kind"] = pd.Categorical.from_codes(data["kind"], dtype=KIND_DTYPE)
    data["role"] = pd.Categorical.from_codes(data["role"], dtype=ROLE_DTYPE)
    # copy=False: the columns are fresh; consolidating them would copy every one (60 ms for
    # 500k events).
    return pd.DataFrame(data, copy=False)


def _rows_of_kinds(
    positions: list[npt.NDArray[np.int64]],
) -> list[slice | npt.NDArray[np.int64]]:
    """Where each kind's events (at increasing ``positions`` among all events) are among the
    accepted ones, in payload order: all of them, in order, when there is one kind."""
    if len(positions) == 1:
        return [slice(None)]
    accepted = np.zeros(max(int(p[-1]) for p in positions) + 1, dtype=np.bool_)
    for of_kind in positions:
        accepted[of_kind] = True
    row = np.cumsum(accepted) - 1
    return [row[of_kind] for of_kind in positions]


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    for column in _INT_COLUMNS:
        frame[column] = frame[column].astype(np.int64)
    frame["in_sync"] = frame["in_sync"].astype(np.bool_)
    for column in _NULLABLE_STRINGS:
        frame[column] = frame[column].astype(object)
    # Categorical, so consumers get integer codes without hashing strings again.
    frame["kind"] = frame["kind"].astype(KIND_DTYPE)
    frame["role"] = frame["role"].astype(ROLE_DTYPE)
    return frame


def _check_values(
    accepted: pd.DataFrame, payload: Callable[[int], bytes], bounds: EventBounds
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Range checks over whole columns; returns (still accepted, newly rejected)."""
    ts = accepted["ts"].to_numpy()
    low: int | npt.NDArray[np.int64] = bounds.min_ts_ms
    if bounds.storage_low_ms != bounds.min_ts_ms:
        storage = accepted["kind"].isin(STORAGE_KINDS).to_numpy()
        low = np.where(storage, bounds.storage_low_ms, bounds.min_ts_ms)
    topic = accepted["topic"].to_numpy()
    has_topic = ~pd.isna(topic)
    topic_ok = np.ones(len(accepted), dtype=np.bool_)
    if has_topic.any():
        # Arrow's RE2 kernel checks the whole column without a Python call per name.
        matches = pc.match_substring_regex(
            pa.array(topic[has_topic], pa.string()), TOPIC_NAME.pattern
        )
        topic_ok[has_topic] = matches.to_numpy(zero_copy_only=False)
    checks: list[tuple[RejectReason, np.ndarray[Any, np.dtype[np.bool_]], str]] = [
        (RejectReason.NEGATIVE_BYTES, accepted["bytes"].to_numpy() < 0, "bytes must be >= 0"),
        (
            RejectReason.TS_OUT_OF_BOUNDS,
            (ts < low) | (ts > bounds.max_ts_ms),
            f"ts must be epoch milliseconds in [{bounds.min_ts_ms}, {bounds.max_ts_ms}]"
            + (
                f" ({bounds.storage_low_ms} for remote_segment and leader_epochs)"
                if bounds.storage_low_ms != bounds.min_ts_ms
                else ""
            ),
        ),
        (RejectReason.INVALID_TOPIC, ~topic_ok, "topic is not a legal Kafka topic name"),
        (
            RejectReason.INVALID_VALUE,
            _bad_epochs(accepted),
            "leader epochs must start at non-decreasing offsets, and a segment's leader_epoch "
            "must be its last epoch",
        ),
    ]
    bad = np.zeros(len(accepted), dtype=np.bool_)
    rows = []
    for reason, failed, message in checks:
        fresh = failed & ~bad  # report the first failed check only
        bad |= failed
        for position, value in zip(
            accepted["position"].to_numpy()[fresh],
            _failed_values(accepted, reason, fresh),
            strict=True,
        ):
            rows.append(
                (int(position), -1, reason, f"{message} (got {value!r})", payload(int(position)))
            )
    rejected = pd.DataFrame(rows, columns=list(ParsedEvents.REJECTED_COLUMNS))
    if bad.any():
        accepted = accepted[~bad].reset_index(drop=True)
    return accepted, rejected


def _bad_epochs(accepted: pd.DataFrame) -> npt.NDArray[np.bool_]:
    """Per event: epochs (a segment's or a lineage) whose offsets decrease, or a segment whose
    ``leader_epoch`` is not the last of its epochs."""
    epochs = accepted["epochs"].to_numpy()
    bad = np.zeros(len(accepted), dtype=np.bool_)
    listed = np.flatnonzero(pd.notna(epochs))
    segment = (accepted["kind"] == EventKind.REMOTE_SEGMENT).to_numpy()
    leader_epoch = accepted["leader_epoch"].to_numpy()
    for row in listed.tolist():
        pairs = epochs[row]
        offsets = [offset for _, offset in pairs]
        bad[row] = offsets != sorted(offsets) or (
            bool(segment[row]) and pairs[-1][0] != leader_epoch[row]
        )
    return bad


def _failed_values(
    accepted: pd.DataFrame, reason: RejectReason, rows: np.ndarray[Any, np.dtype[np.bool_]]
) -> list[Any]:
    column = {
        RejectReason.NEGATIVE_BYTES: "bytes",
        RejectReason.TS_OUT_OF_BOUNDS: "ts",
        RejectReason.INVALID_TOPIC: "topic",
        RejectReason.INVALID_VALUE: "epochs",
    }[reason]
    values = accepted[column].to_numpy()[rows].tolist()
    return [dict(value) if column == "epochs" else value for value in values]
