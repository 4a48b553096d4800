"""Compact encoding of rolling tables, read and rewritten one touched entity at a time.

A state shard holds one :class:`~state.rolling.RollingTable` per quota type; all of them encode
into one blob (one value in a state store). Each entity is one row: its table, its key, its clock
and, per *held* ring slot, the slot's age in samples behind the clock's sample, its bytes and its
last event time as an offset into the sample. Rows are in each table's insertion order (the order
entities were first seen) and expired slots are left out, so equal windows recorded from equal
events always encode to equal bytes.

Why this shape: a micro-batch touches a small part of a large shard. :class:`StoredTables` finds
the touched entities with one Arrow hash lookup over the key column (C++, a few ms for 100k keys)
and decodes only those rows into a working :class:`~state.rolling.RollingTable`;
:func:`encode_tables` then copies every other row as Arrow data (no Python object per entity),
each loaded row written back in its place and new entities after them. What a batch costs beyond
its touched entities is a decompress, a lookup, a copy and a compress of the blob
(``docs/streaming.md`` measures it).

Formats 2 (before Kafka 3.8's purge rule: ``samples`` slots, no last event times, read with each
sample's last event at its start) and 3 (every slot stored) are read too; a state in either is
rewritten in format 4 by the first batch that writes it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from state.quota_types import WindowRule
from state.rolling import EMPTY, RollingTable
from state.window import WindowSpec

Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
ObjectArray = npt.NDArray[np.object_]

FORMAT_VERSION = b"4"
_LEGACY_VERSIONS = (b"2", b"3")
Compression = Literal["zstd", "lz4"] | None
#: The blob is decompressed and compressed whole every batch. With 125k clients in a shard, zstd
#: packs them in ~10 ms and unpacks in ~5 ms; lz4 takes ~7 and ~1.5 ms for a third more bytes
#: (docs/streaming.md): the state is held in memory, several versions of it, so zstd.
DEFAULT_COMPRESSION: Compression = "zstd"

_SCHEMA = pa.schema(
    [
        ("table", pa.int8()),  # index into the metadata's table names
        ("key", pa.string()),
        ("clock", pa.int64()),
        # Held slots only: samples behind the clock's sample, ...
        ("age", pa.list_(pa.int16())),
        ("bytes", pa.list_(pa.int64())),
        ("last", pa.list_(pa.int32())),  # last event - sample start, ms
    ]
)
_KEY, _CLOCK, _AGE, _BYTES, _LAST = 1, 2, 3, 4, 5


class StateDecodeError(ValueError):
    """Bytes that are not encoded rolling tables of a version this code reads."""


@dataclass(frozen=True)
class KeptRows:
    """Rows of a stored encoding that :func:`encode_tables` copies unchanged (the working tables
    it encodes beside them were loaded from the same encoding)."""

    stored: StoredTables
    rows: Int64Array  # ascending row numbers of ``stored``
    #: Per working table, where known: the stored row each of its first rows was loaded from
    #: (its other rows are new entities). The others' rows are found by key.
    loaded_from: Mapping[str, Int64Array] = field(default_factory=dict)


def encode_tables(
    tables: Mapping[str, RollingTable],
    compression: Compression = DEFAULT_COMPRESSION,
    kept: KeptRows | None = None,
) -> bytes:
    """``tables``, and the ``kept`` rows of a stored encoding besides them, as one blob.

    With ``kept``, each table's rows come in the stored order: a kept row as stored, a row the
    working table loaded from the stored one in its place, and the working table's new entities
    after them. A kept row's table must be one of ``tables`` with the same window."""
    names = list(tables)
    fresh = [_Rows.of(table) for table in tables.values()]
    sizes = [len(rows.keys) for rows in fresh]
    counts = _concat([rows.count for rows in fresh], np.int64)
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    batch = pa.record_batch(
        [
            pa.array(np.repeat(np.arange(len(names), dtype=np.int8), sizes), pa.int8()),
            pa.array(_concat([rows.keys for rows in fresh], object), pa.string()),
            pa.array(_concat([rows.clock for rows in fresh], np.int64)),
            pa.ListArray.from_arrays(offsets, _concat([rows.age for rows in fresh], np.int16)),
            pa.ListArray.from_arrays(offsets, _concat([rows.nbytes for rows in fresh], np.int64)),
            pa.ListArray.from_arrays(offsets, _concat([rows.last for rows in fresh], np.int32)),
        ],
        schema=_SCHEMA,
    )
    if kept is not None:
        batch = _merged(batch, names, sizes, kept)
    metadata = {
        b"quotastream.rolling": FORMAT_VERSION,
        b"names": json.dumps(names).encode(),
        b"specs": json.dumps(
            {
                name: [table.spec.samples, table.spec.window_ms, table.spec.rule.value]
                for name, table in tables.items()
            }
        ).encode(),
    }
    return _ipc_bytes(batch.replace_schema_metadata(metadata), compression)


def decode_tables(data: bytes) -> dict[str, RollingTable]:
    """Every table, every entity."""
    stored = StoredTables.decode(data)
    return {name: stored.table(name, stored.rows(name)) for name in stored.names}


class StoredTables:
    """Encoded tables as Arrow columns: a batch decodes the rows of the entities it touches."""

    def __init__(self, batch: pa.RecordBatch, names: list[str], specs: dict[str, WindowSpec]):
        self.batch = batch
        self.names = names
        self.specs = specs
        self.table_code: npt.NDArray[np.int8] = batch.column(0).to_numpy()
        self.clock: Int64Array = batch.column(_CLOCK).to_numpy()
        bounds = np.searchsorted(self.table_code, np.arange(len(names) + 1), "left")
        self._range = {name: (int(bounds[i]), int(bounds[i + 1])) for i, name in enumerate(names)}

    @classmethod
    def decode(cls, data: bytes) -> StoredTables:
        try:
            reader = pa.ipc.open_stream(pa.py_buffer(data))
            whole = pa.Table.from_batches(list(reader), schema=reader.schema).combine_chunks()
        except (pa.ArrowInvalid, OSError) as exc:
            raise StateDecodeError(f"not encoded rolling tables: {exc}") from None
        metadata = reader.schema.metadata or {}
        version = metadata.get(b"quotastream.rolling")
        if version not in (*_LEGACY_VERSIONS, FORMAT_VERSION):
            raise StateDecodeError(f"unsupported rolling table format {version!r}")
        specs = {
            name: WindowSpec(samples=samples, window_ms=window_ms, rule=WindowRule(rule))
            for name, (samples, window_ms, rule) in json.loads(metadata[b"specs"]).items()
        }
        if version in _LEGACY_VERSIONS:
            return cls.decode(encode_tables(_legacy_tables(whole, version, specs)))
        batches = whole.to_batches()
        batch = batches[0] if batches else pa.RecordBatch.from_pylist([], schema=_SCHEMA)
        return cls(batch, json.loads(metadata[b"names"]), specs)

    def rows(self, name: str) -> Int64Array:
        """Every row of table ``name``."""
        start, end = self._range.get(name, (0, 0))
        return np.arange(start, end, dtype=np.int64)

    def rows_of(self, name: str, keys: npt.ArrayLike) -> Int64Array:
        """Each key's row in table ``name``, -1 where it has none."""
        return self._rows_of(name, pa.array(np.asarray(keys, dtype=object), pa.string()))

    def table(self, name: str, rows: Int64Array) -> RollingTable:
        """A working table of the given rows of table ``name``."""
        rows = np.asarray(rows, dtype=np.int64)
        taken = self.batch.take(pa.array(rows, pa.int64()))
        ages = taken.column(_AGE)
        return _Rows(
            keys=np.asarray(taken.column(_KEY).to_numpy(zero_copy_only=False), dtype=object),
            clock=self.clock[rows],
            count=np.diff(ages.offsets.to_numpy()).astype(np.int64),
            age=ages.flatten().to_numpy().astype(np.int64),
            nbytes=taken.column(_BYTES).flatten().to_numpy().astype(np.int64),
            last=taken.column(_LAST).flatten().to_numpy().astype(np.int64),
        ).table(self.specs[name])

    def _rows_of(self, name: str, keys: pa.Array) -> Int64Array:
        start, end = self._range.get(name, (0, 0))
        found = np.full(len(keys), -1, dtype=np.int64)
        if start < end and len(keys):
            stored = self.batch.column(_KEY).slice(start, end - start)
            index = pc.index_in(stored, value_set=keys).fill_null(-1).to_numpy()
            hit = np.flatnonzero(index >= 0)
            found[index[hit]] = start + hit
        return found


def _merged(
    batch: pa.RecordBatch, names: list[str], sizes: list[int], kept: KeptRows
) -> pa.RecordBatch:
    """``batch`` (the working tables' rows) merged into the stored rows (:func:`encode_tables`)."""
    stored = kept.stored
    code_of_stored = np.array([names.index(name) for name in stored.names], np.int8)
    keep = np.zeros(len(stored.clock), dtype=np.bool_)
    keep[kept.rows] = True
    placed = np.full(len(stored.clock), -1, dtype=np.int64)  # working row written in its place
    fresh_start = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    appended: list[Int64Array] = []
    for code, name in enumerate(names):
        first, end = fresh_start[code], fresh_start[code + 1]
        loaded_from = _loaded_from(stored, name, batch.column(_KEY).slice(first, end - first), kept)
        loaded = loaded_from >= 0
        if keep[loaded_from[loaded]].any():
            raise ValueError(f"{name}: a kept row is also a working row")
        placed[loaded_from[loaded]] = first + np.flatnonzero(loaded)
        appended.append(first + np.flatnonzero(~loaded))
    # Rows of the concatenation [batch, stored rows], table by table in ``names`` order.
    source = np.where(keep, len(batch) + np.arange(len(stored.clock)), placed)
    stored_code = code_of_stored[stored.table_code]
    tables = [
        np.concatenate([source[(stored_code == code) & (source >= 0)], appended[code]])
        for code in range(len(names))
    ]
    order = np.concatenate([np.zeros(0, dtype=np.int64), *tables])
    codes = np.repeat(np.arange(len(names), dtype=np.int8), [len(rows) for rows in tables])
    copied = stored.batch.replace_schema_metadata(None)
    merged = pa.concat_batches([batch, copied]).take(pa.array(order))
    return merged.set_column(0, "table", pa.array(codes, pa.int8()))


def _loaded_from(stored: StoredTables, name: str, keys: pa.Array, kept: KeptRows) -> Int64Array:
    """Per working row of table ``name`` (its ``keys``): the stored row it was loaded from, -1
    for a new entity. Known from the restore, unless eviction moved the rows: a lookup of every
    key in the stored table then costs ~10 ms at 125k entities."""
    first_rows = kept.loaded_from.get(name)
    if first_rows is None:
        return stored._rows_of(name, keys)
    if len(first_rows) > len(keys):
        raise ValueError(f"{name}: the working table lost rows it was loaded with")
    return np.concatenate([first_rows, np.full(len(keys) - len(first_rows), -1, np.int64)])


@dataclass(frozen=True)
class _Rows:
    """One table's entities as encoded: per entity its held slots (``count`` of them, flat):
    age behind the clock's sample, bytes, and last event time as an offset into the sample."""

    keys: ObjectArray
    clock: Int64Array
    count: Int64Array
    age: Int64Array
    nbytes: Int64Array
    last: Int64Array

    @staticmethod
    def of(table: RollingTable) -> _Rows:
        keys, clock, slot_sample, slot_bytes, slot_last = table.columns()
        window = table.spec.window_ms
        age = np.where(clock == EMPTY, 0, clock // window)[:, None] - slot_sample
        held = (slot_sample != EMPTY) & (age >= 0) & (age < table.spec.slots)
        return _Rows(
            keys.to_numpy(dtype=object),
            clock,
            np.count_nonzero(held, axis=1).astype(np.int64),
            age[held],
            slot_bytes[held],
            slot_last[held] - slot_sample[held] * window,
        )

    def table(self, spec: WindowSpec) -> RollingTable:
        """The table, each sample in its ring slot."""
        clock_sample = np.where(self.clock == EMPTY, 0, self.clock // spec.window_ms)
        entity = np.repeat(np.arange(len(self.keys)), self.count)
        sample = clock_sample[entity] - self.age
        slot = (entity, sample % spec.slots)
        shape = (len(self.keys), spec.slots)
        slot_sample = np.full(shape, EMPTY, dtype=np.int64)
        slot_sample[slot] = sample
        slot_bytes = np.zeros(shape, dtype=np.int64)
        slot_bytes[slot] = self.nbytes
        slot_last = np.full(shape, EMPTY, dtype=np.int64)
        slot_last[slot] = sample * spec.window_ms + self.last
        return RollingTable(
            spec,
            pd.Index(self.keys, dtype=object),
            clock=self.clock,
            slot_sample=slot_sample,
            slot_bytes=slot_bytes,
            slot_last=slot_last,
        )


def _legacy_tables(
    whole: pa.Table, version: bytes, specs: dict[str, WindowSpec]
) -> dict[str, RollingTable]:
    """Formats 2 and 3: every slot stored (age -1 where none), in insertion order."""
    table_column = whole.column("table").combine_chunks()
    names = table_column.dictionary.to_pylist()
    table_of_row = np.asarray(table_column.indices.to_numpy(zero_copy_only=False))
    keys = np.asarray(whole.column("key").to_numpy(zero_copy_only=False), dtype=object)
    clock = whole.column("clock").to_numpy().astype(np.int64, copy=True)
    ages = whole.column("age").combine_chunks()
    starts = np.asarray(ages.offsets.to_numpy()[:-1], dtype=np.int64)
    age = np.asarray(ages.values.to_numpy(zero_copy_only=False), dtype=np.int64)
    nbytes = np.asarray(
        whole.column("bytes").combine_chunks().values.to_numpy(zero_copy_only=False), np.int64
    )
    last = (
        np.asarray(
            whole.column("last").combine_chunks().values.to_numpy(zero_copy_only=False), np.int64
        )
        if version == b"3"
        else np.zeros_like(nbytes)
    )
    result: dict[str, RollingTable] = {}
    for name, spec in specs.items():
        code = names.index(name) if name in names else -1
        rows = np.flatnonzero(table_of_row == code)
        kept = spec.slots if version == b"3" else spec.samples
        slots = np.asarray(starts[rows], dtype=np.int64)[:, None] + np.arange(kept)
        held = age[slots] >= 0
        result[name] = _Rows(
            keys[rows],
            clock[rows],
            np.count_nonzero(held, axis=1).astype(np.int64),
            age[slots][held],
            nbytes[slots][held],
            last[slots][held],
        ).table(spec)
    return result


def _ipc_bytes(batch: pa.RecordBatch, compression: Compression) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def _concat(arrays: list[npt.NDArray[Any]], dtype: Any) -> npt.NDArray[Any]:
    return np.concatenate([np.zeros(0, dtype=dtype), *(a.astype(dtype) for a in arrays)])
