"""Compact, cheap encoding of a :class:`~state.rolling.RollingTable` (an Arrow IPC stream).

Each entity is one row: its key, its clock and, per ring slot, the slot's age in samples behind
the clock's sample (-1 for an empty or expired slot) and its bytes. Ages fit in 16 bits and
expired slots are normalised away, so equal windows always encode to equal bytes, and the
buffers compress well.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

from state.quota_types import WindowRule
from state.rolling import EMPTY, RollingTable, WindowSpec

FORMAT_VERSION = b"1"
Compression = Literal["zstd", "lz4"] | None


class StateDecodeError(ValueError):
    """Bytes that are not an encoded rolling table of a version this code reads."""


def encode_table(table: RollingTable, compression: Compression = "zstd") -> bytes:
    keys, clock, slot_sample, slot_bytes = table.columns()
    spec = table.spec
    clock_sample = np.where(clock == EMPTY, 0, clock // spec.window_ms)
    age = clock_sample[:, None] - slot_sample
    held = (slot_sample != EMPTY) & (age >= 0) & (age < spec.samples)
    age = np.where(held, age, -1).astype(np.int16)
    nbytes = np.where(held, slot_bytes, 0)
    samples = spec.samples
    batch = pa.record_batch(
        [
            pa.array(keys.to_numpy(dtype=object), type=pa.string()),
            pa.array(clock, type=pa.int64()),
            pa.FixedSizeListArray.from_arrays(pa.array(age.ravel(), type=pa.int16()), samples),
            pa.FixedSizeListArray.from_arrays(pa.array(nbytes.ravel(), type=pa.int64()), samples),
        ],
        schema=pa.schema(
            [
                ("key", pa.string()),
                ("clock", pa.int64()),
                ("age", pa.list_(pa.int16(), samples)),
                ("bytes", pa.list_(pa.int64(), samples)),
            ],
            metadata={
                b"quotastream.rolling": FORMAT_VERSION,
                b"samples": str(spec.samples).encode(),
                b"window_ms": str(spec.window_ms).encode(),
                b"rule": spec.rule.value.encode(),
            },
        ),
    )
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def decode_table(data: bytes) -> RollingTable:
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(data))
        batches = list(reader)
    except (pa.ArrowInvalid, OSError) as exc:
        raise StateDecodeError(f"not an encoded rolling table: {exc}") from None
    metadata = reader.schema.metadata or {}
    if metadata.get(b"quotastream.rolling") != FORMAT_VERSION:
        raise StateDecodeError(
            f"unsupported rolling table format {metadata.get(b'quotastream.rolling')!r}"
        )
    spec = WindowSpec(
        samples=int(metadata[b"samples"]),
        window_ms=int(metadata[b"window_ms"]),
        rule=WindowRule(metadata[b"rule"].decode()),
    )
    table = pa.Table.from_batches(batches, schema=reader.schema).combine_chunks()
    size = table.num_rows
    keys = pd.Index(table.column("key").to_numpy(zero_copy_only=False), dtype=object)
    clock = table.column("clock").to_numpy().astype(np.int64, copy=True)
    age = _flat(table, "age", size, spec.samples).astype(np.int64)
    nbytes = _flat(table, "bytes", size, spec.samples).astype(np.int64, copy=True)
    clock_sample = np.where(clock == EMPTY, 0, clock // spec.window_ms)
    slot_sample = np.where(age >= 0, clock_sample[:, None] - age, EMPTY)
    return RollingTable(spec, keys, clock, slot_sample, nbytes)


def _flat(table: pa.Table, column: str, size: int, samples: int) -> npt.NDArray[np.generic]:
    values = table.column(column).combine_chunks().flatten()
    return np.asarray(values.to_numpy(zero_copy_only=False)).reshape(size, samples)
