"""Compact, cheap encoding of rolling tables: one Arrow IPC stream for several tables.

A state shard holds one :class:`~state.rolling.RollingTable` per quota type; all of them encode
into one blob (one value in a state store). Each entity is one row: its table's name, its key,
its clock and, per ring slot, the slot's age in samples behind the clock's sample (-1 for an
empty or expired slot), its bytes and its last event time as an offset into the sample. Ages fit
in 16 bits and expired slots are normalised away, so equal windows always encode to equal bytes,
and the buffers compress well.

Format 2 (before Kafka 3.8's purge rule) kept ``samples`` slots and no last event times; it is
read with each sample's last event at its start, which purges the sample before the window
exactly as that format's rule did.
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

FORMAT_VERSION = b"3"
_READABLE_VERSIONS = (b"2", FORMAT_VERSION)
Compression = Literal["zstd", "lz4"] | None

_SCHEMA = pa.schema(
    [
        ("table", pa.dictionary(pa.int8(), pa.string())),
        ("key", pa.string()),
        ("clock", pa.int64()),
        ("age", pa.list_(pa.int16())),
        ("bytes", pa.list_(pa.int64())),
        ("last", pa.list_(pa.int32())),  # format 3: last event - sample start, ms
    ]
)


class StateDecodeError(ValueError):
    """Bytes that are not encoded rolling tables of a version this code reads."""


def encode_tables(tables: Mapping[str, RollingTable], compression: Compression = "zstd") -> bytes:
    names = list(tables)
    rows = [_Rows.of(table) for table in tables.values()]
    counts = [len(part.keys) for part in rows]
    lengths = np.repeat([table.spec.slots for table in tables.values()], counts)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    batch = pa.record_batch(
        [
            pa.DictionaryArray.from_arrays(
                pa.array(np.repeat(np.arange(len(names)), counts).astype(np.int8)),
                pa.array(names, pa.string()),
            ),
            pa.array(_concat([part.keys for part in rows], object), pa.string()),
            pa.array(_concat([part.clock for part in rows], np.int64)),
            pa.ListArray.from_arrays(
                offsets, _concat([part.age.ravel() for part in rows], np.int16)
            ),
            pa.ListArray.from_arrays(
                offsets, _concat([part.nbytes.ravel() for part in rows], np.int64)
            ),
            pa.ListArray.from_arrays(
                offsets, _concat([part.last.ravel() for part in rows], np.int32)
            ),
        ],
        schema=_SCHEMA.with_metadata(
            {
                b"quotastream.rolling": FORMAT_VERSION,
                b"specs": json.dumps(
                    {
                        name: [table.spec.samples, table.spec.window_ms, table.spec.rule.value]
                        for name, table in tables.items()
                    }
                ).encode(),
            }
        ),
    )
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def decode_tables(data: bytes) -> dict[str, RollingTable]:
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(data))
        whole = pa.Table.from_batches(list(reader), schema=reader.schema).combine_chunks()
    except (pa.ArrowInvalid, OSError) as exc:
        raise StateDecodeError(f"not encoded rolling tables: {exc}") from None
    metadata = reader.schema.metadata or {}
    version = metadata.get(b"quotastream.rolling")
    if version not in _READABLE_VERSIONS:
        raise StateDecodeError(f"unsupported rolling table format {version!r}")
    specs = {
        name: WindowSpec(samples=samples, window_ms=window_ms, rule=WindowRule(rule))
        for name, (samples, window_ms, rule) in json.loads(metadata[b"specs"]).items()
    }
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
        if version == FORMAT_VERSION
        else np.zeros_like(nbytes)
    )
    result: dict[str, RollingTable] = {}
    for name, spec in specs.items():
        code = names.index(name) if name in names else -1
        rows = np.flatnonzero(table_of_row == code)
        kept = spec.slots if version == FORMAT_VERSION else spec.samples
        slots = np.asarray(starts[rows], dtype=np.int64)[:, None] + np.arange(kept)
        result[name] = _Rows(keys[rows], clock[rows], age[slots], nbytes[slots], last[slots]).table(
            spec
        )
    return result


@dataclass(frozen=True)
class _Rows:
    """One table's entities as encoded: slot ages behind the clock's sample (-1 for none), bytes
    and last event times as offsets into their samples."""

    keys: npt.NDArray[np.object_]
    clock: npt.NDArray[np.int64]
    age: npt.NDArray[np.int64]
    nbytes: npt.NDArray[np.int64]
    last: npt.NDArray[np.int64]

    @staticmethod
    def of(table: RollingTable) -> _Rows:
        keys, clock, slot_sample, slot_bytes, slot_last = table.columns()
        window = table.spec.window_ms
        age = np.where(clock == EMPTY, 0, clock // window)[:, None] - slot_sample
        held = (slot_sample != EMPTY) & (age >= 0) & (age < table.spec.slots)
        return _Rows(
            keys.to_numpy(dtype=object),
            clock,
            np.where(held, age, -1),
            np.where(held, slot_bytes, 0),
            np.where(held, slot_last - slot_sample * window, 0),
        )

    def table(self, spec: WindowSpec) -> RollingTable:
        """The table, each sample in its ring slot (a format 2 ring is one slot shorter)."""
        clock_sample = np.where(self.clock == EMPTY, 0, self.clock // spec.window_ms)
        entity, column = np.nonzero(self.age >= 0)
        sample = clock_sample[entity] - self.age[entity, column]
        slot = (entity, sample % spec.slots)
        shape = (len(self.keys), spec.slots)
        slot_sample = np.full(shape, EMPTY, dtype=np.int64)
        slot_sample[slot] = sample
        slot_bytes = np.zeros(shape, dtype=np.int64)
        slot_bytes[slot] = self.nbytes[entity, column]
        slot_last = np.full(shape, EMPTY, dtype=np.int64)
        slot_last[slot] = sample * spec.window_ms + self.last[entity, column]
        return RollingTable(
            spec,
            pd.Index(self.keys, dtype=object),
            clock=self.clock,
            slot_sample=slot_sample,
            slot_bytes=slot_bytes,
            slot_last=slot_last,
        )


def _concat(arrays: list[npt.NDArray[Any]], dtype: Any) -> npt.NDArray[Any]:
    return np.concatenate([np.zeros(0, dtype=dtype), *(a.astype(dtype) for a in arrays)])
