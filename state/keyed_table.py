"""A frame indexed by key, kept as one compressed Arrow IPC stream tagged with its format: how a
shard's small keyed tables (pending throttles, written decisions) are kept in its state."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa


def encode_keyed(frame: pd.DataFrame, metadata: dict[bytes, bytes]) -> bytes:
    """``frame`` (indexed by key) with ``metadata`` (its ``b"format"`` among it)."""
    table = pa.Table.from_pandas(frame.rename_axis("key"), preserve_index=True)
    table = table.replace_schema_metadata(metadata)
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def decode_keyed(
    data: bytes, expected_format: bytes, what: str, error: type[ValueError]
) -> tuple[pd.DataFrame, dict[bytes, bytes]]:
    """The frame and metadata :func:`encode_keyed` made; raises ``error`` naming ``what`` for
    bytes that are not one, or of another format."""
    try:
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise error(f"not encoded {what}: {exc}") from None
    metadata = dict(table.schema.metadata or {})
    if metadata.get(b"format") != expected_format:
        raise error(f"unsupported {what} format {metadata.get(b'format')!r}")
    frame = table.replace_schema_metadata(None).to_pandas()
    if "key" in frame.columns:
        frame = frame.set_index("key")
    frame.index.name = None
    return frame, metadata
