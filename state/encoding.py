"""Compact encoding of rolling tables, read and rewritten one touched entity at a time.

A state shard holds one :class:`~state.rolling.RollingTable` per quota type; all of them encode
into one blob (one value in a state store). Each entity is one row: its table, a 64-bit hash of
its key, its key, its clock and, per *held* ring slot, the slot's age in samples behind the
clock's sample, its bytes and its last event time as an offset into the sample. Rows are sorted
by (table, key hash, key) and expired slots are left out, so equal windows always encode to
equal bytes.

Why this shape: a micro-batch touches a small part of a large shard. :class:`StoredTables` finds
the touched entities by a binary search over the hash column (their keys are compared to rule out
hash collisions) and decodes only those rows into a working :class:`~state.rolling.RollingTable`;
:func:`encode_tables` then copies every other row as Arrow data (no Python object per entity) and
merges the working rows back in key-hash order. What a batch costs beyond its touched entities is
a decompress, a copy and a compress of the blob (``docs/streaming.md`` measures it).

The key hash is pandas' SipHash-2-4 of the UTF-8 key with pandas' fixed key. Its value for a fixed
probe is kept with the data: if a later pandas hashed differently, the stored hashes are
recomputed on decode rather than trusted.

Formats 2 (before Kafka 3.8's purge rule: ``samples`` slots, no last event times, read with each
sample's last event at its start) and 3 (every slot stored, in insertion order) are read too; a
state in either is rewritten in format 4 by the first batch that writes it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

from state.quota_types import WindowRule
from state.rolling import EMPTY, RollingTable, WindowSpec

Int64Array = npt.NDArray[np.int64]
UInt64Array = npt.NDArray[np.uint64]
BoolArray = npt.NDArray[np.bool_]
ObjectArray = npt.NDArray[np.object_]

FORMAT_VERSION = b"4"
_LEGACY_VERSIONS = (b"2", b"3")
Compression = Literal["zstd", "lz4"] | None
#: The blob is decompressed and compressed whole every batch. With 125k clients in a shard, zstd
#: packs 22 bytes per client in ~10 ms and unpacks in ~5 ms; lz4 30 bytes in ~7 and ~1.5 ms
#: (docs/streaming.md): the state is held in memory, several versions of it, so zstd.
DEFAULT_COMPRESSION: Compression = "zstd"

_SCHEMA = pa.schema(
    [
        ("table", pa.int8()),  # index into the metadata's table names
        ("key_hash", pa.uint64()),
        ("key", pa.string()),
        ("clock", pa.int64()),
        # Held slots only, oldest sample last: samples behind the clock's sample, ...
        ("age", pa.list_(pa.int16())),
        ("bytes", pa.list_(pa.int64())),
        ("last", pa.list_(pa.int32())),  # last event - sample start, ms
    ]
)
_HASH_PROBE = "quotastream"


class StateDecodeError(ValueError):
    """Bytes that are not encoded rolling tables of a version this code reads."""


def key_hashes(keys: ObjectArray) -> UInt64Array:
    """The 64-bit hash rows are sorted and found by."""
    hashes: UInt64Array = pd.util.hash_array(np.asarray(keys, dtype=object), categorize=False)
    return hashes


_PROBE_HASH = str(int(key_hashes(np.array([_HASH_PROBE], dtype=object))[0])).encode()


@dataclass(frozen=True)
class KeptRows:
    """Rows of stored tables copied unchanged into a new encoding (:func:`encode_tables`)."""

    stored: StoredTables
    rows: Int64Array  # ascending row numbers of ``stored``


def encode_tables(
    tables: Mapping[str, RollingTable],
    compression: Compression = DEFAULT_COMPRESSION,
    kept: KeptRows | None = None,
) -> bytes:
    """``tables``, and the ``kept`` rows of a stored encoding besides them, as one blob.

    A kept row's table must be one of ``tables`` with the same window, and its key must not be
    in that table (the working table replaces the rows it loaded)."""
    names = list(tables)
    fresh = [_Rows.of(table) for table in tables.values()]
    fresh_table = np.repeat(np.arange(len(names), dtype=np.int8), [len(r.keys) for r in fresh])
    fresh_keys = np.concatenate([np.zeros(0, dtype=object), *(r.keys for r in fresh)])
    fresh_hash = key_hashes(fresh_keys)
    counts = _concat([r.count for r in fresh], np.int64)
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    batch = pa.record_batch(
        [
            pa.array(fresh_table, pa.int8()),
            pa.array(fresh_hash, pa.uint64()),
            pa.array(fresh_keys, pa.string()),
            pa.array(_concat([r.clock for r in fresh], np.int64)),
            pa.ListArray.from_arrays(offsets, _concat([r.age for r in fresh], np.int16)),
            pa.ListArray.from_arrays(offsets, _concat([r.nbytes for r in fresh], np.int64)),
            pa.ListArray.from_arrays(offsets, _concat([r.last for r in fresh], np.int32)),
        ],
        schema=_SCHEMA,
    )
    table_code, hashes = fresh_table.astype(np.int64), fresh_hash
    source = np.arange(len(fresh_keys), dtype=np.int64)  # row of ``batch`` each row comes from
    if kept is not None and len(kept.rows):
        stored = kept.stored
        code_of_stored = np.array([names.index(name) for name in stored.names], np.int8)
        stored_code = code_of_stored[stored.table_code]
        copied = stored.batch.replace_schema_metadata(None)
        if not np.array_equal(stored_code, stored.table_code):
            copied = copied.set_column(0, "table", pa.array(stored_code, pa.int8()))
        batch = pa.concat_batches([batch, copied])
        table_code = np.concatenate([table_code, stored_code[kept.rows].astype(np.int64)])
        hashes = np.concatenate([hashes, stored.key_hash[kept.rows]])
        source = np.concatenate([source, len(fresh_keys) + kept.rows])
    order = source[_canonical_order(table_code, hashes, batch.column(2), source)]
    if not np.array_equal(order, np.arange(batch.num_rows)):
        batch = batch.take(pa.array(order))
    metadata = {
        b"quotastream.rolling": FORMAT_VERSION,
        b"key_hash_probe": _PROBE_HASH,
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
        self.key_hash: UInt64Array = batch.column(1).to_numpy()
        self.clock: Int64Array = batch.column(3).to_numpy()
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
        specs = {
            name: WindowSpec(samples=samples, window_ms=window_ms, rule=WindowRule(rule))
            for name, (samples, window_ms, rule) in json.loads(
                metadata.get(b"specs", b"{}")
            ).items()
        }
        if version in _LEGACY_VERSIONS:
            return cls.decode(encode_tables(_legacy_tables(whole, version, specs)))
        if version != FORMAT_VERSION:
            raise StateDecodeError(f"unsupported rolling table format {version!r}")
        batch = whole.to_batches()[0] if whole.num_rows else _empty_batch()
        names = json.loads(metadata[b"names"])
        stored = cls(batch, names, specs)
        if metadata.get(b"key_hash_probe") != _PROBE_HASH:
            # Hashed by another hash function: rehash and re-sort.
            return cls.decode(
                encode_tables({name: stored.table(name, stored.rows(name)) for name in names})
            )
        return stored

    def rows(self, name: str) -> Int64Array:
        """Every row of table ``name``."""
        start, end = self._range.get(name, (0, 0))
        return np.arange(start, end, dtype=np.int64)

    def rows_of(self, name: str, keys: ObjectArray) -> Int64Array:
        """Each key's row in table ``name``, -1 where it has none."""
        keys = np.asarray(keys, dtype=object)
        start, end = self._range.get(name, (0, 0))
        found = np.full(len(keys), -1, dtype=np.int64)
        if start == end or not len(keys):
            return found
        stored_hash = self.key_hash[start:end]
        wanted = key_hashes(keys)
        position = np.searchsorted(stored_hash, wanted, "left")
        hit = position < len(stored_hash)
        hit[hit] = stored_hash[position[hit]] == wanted[hit]
        candidates = np.flatnonzero(hit)
        stored_keys = self._keys(start + position[candidates])
        same = stored_keys == keys[candidates]
        found[candidates[same]] = start + position[candidates[same]]
        for index in candidates[~same]:
            # Another key with the same hash comes first: look through the hash's run.
            run_end = np.searchsorted(stored_hash, wanted[index], "right")
            run = np.arange(position[index], run_end) + start
            match = np.flatnonzero(self._keys(run) == keys[index])
            found[index] = run[match[0]] if len(match) else -1
        return found

    def table(self, name: str, rows: Int64Array) -> RollingTable:
        """A working table of the given rows of table ``name``."""
        rows = np.asarray(rows, dtype=np.int64)
        taken = self.batch.take(pa.array(rows, pa.int64()))
        ages = taken.column(4)
        return _Rows(
            keys=np.asarray(taken.column(2).to_numpy(zero_copy_only=False), dtype=object),
            clock=self.clock[rows],
            count=np.diff(ages.offsets.to_numpy()).astype(np.int64),
            age=ages.flatten().to_numpy().astype(np.int64),
            nbytes=taken.column(5).flatten().to_numpy().astype(np.int64),
            last=taken.column(6).flatten().to_numpy().astype(np.int64),
        ).table(self.specs[name])

    def _keys(self, rows: Int64Array) -> ObjectArray:
        keys = self.batch.column(2).take(pa.array(rows))
        return np.asarray(keys.to_numpy(zero_copy_only=False), dtype=object)


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


def _canonical_order(
    table_code: Int64Array, hashes: UInt64Array, keys: pa.Array, source: Int64Array
) -> Int64Array:
    """Rows by (table, key hash, key); keys (``keys[source[row]]``) are compared only within a
    run of equal hashes."""
    order = np.lexsort((hashes, table_code)).astype(np.int64)
    sorted_code, sorted_hash = table_code[order], hashes[order]
    tied = (np.diff(sorted_hash) == 0) & (np.diff(sorted_code) == 0)
    if tied.any():
        key_of = np.asarray(keys.take(pa.array(source)).to_numpy(zero_copy_only=False), object)
        order = np.array(
            sorted(
                range(len(source)),
                key=lambda row: (int(table_code[row]), int(hashes[row]), str(key_of[row])),
            ),
            dtype=np.int64,
        )
    return order


def _ipc_bytes(batch: pa.RecordBatch, compression: Compression) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def _empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=_SCHEMA)


def _concat(arrays: list[npt.NDArray[Any]], dtype: Any) -> npt.NDArray[Any]:
    return np.concatenate([np.zeros(0, dtype=dtype), *(a.astype(dtype) for a in arrays)])
