"""A small table of rows under distinct keys, held as numpy columns and kept as one compressed
Arrow IPC stream tagged with its format: how a shard's keyed tables (pending throttles, written
decisions) live in its state.

Numpy columns, not a frame indexed by key: these tables are touched once per shard per
micro-batch, mostly with a handful of rows, where each pandas call's fixed cost (hundreds of
microseconds for a filter, a concat or a conversion to Arrow) was most of a tiny batch's shard
step (``docs/streaming.md``). Keys are looked up through one hash index per call (``pd.Index``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

#: The name of the key column in the encoded form (the last column).
_KEY = "key"


@dataclass(frozen=True)
class KeyedColumns:
    """Rows of named numpy columns of one length, each under a distinct key."""

    keys: npt.NDArray[np.object_]
    columns: dict[str, npt.NDArray[Any]]

    @classmethod
    def empty(cls, dtypes: Mapping[str, Any]) -> KeyedColumns:
        return cls(
            np.zeros(0, dtype=object), {name: np.zeros(0, dtype) for name, dtype in dtypes.items()}
        )

    @classmethod
    def of_frame(cls, frame: pd.DataFrame) -> KeyedColumns:
        """The rows of ``frame``, indexed by key."""
        return cls(
            frame.index.to_numpy(dtype=object),
            {str(name): frame[name].to_numpy() for name in frame.columns},
        )

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, name: str) -> npt.NDArray[Any]:
        return self.columns[name]

    def rows(self, which: npt.NDArray[Any]) -> KeyedColumns:
        """The rows ``which`` picks (a boolean mask or positions), in its order."""
        return KeyedColumns(
            self.keys[which], {name: values[which] for name, values in self.columns.items()}
        )

    def without(self, positions: npt.NDArray[np.intp]) -> KeyedColumns:
        """All rows but those at ``positions``, in their order."""
        left = np.ones(len(self), dtype=np.bool_)
        left[positions] = False
        return self.rows(left)

    def with_column(self, name: str, values: npt.NDArray[Any]) -> KeyedColumns:
        return KeyedColumns(self.keys, {**self.columns, name: values})

    def without_column(self, name: str) -> KeyedColumns:
        return KeyedColumns(
            self.keys, {column: v for column, v in self.columns.items() if column != name}
        )

    def positions_of(self, keys: npt.NDArray[np.object_] | pd.Index) -> npt.NDArray[np.intp]:
        """Per key of ``keys``: its row here, -1 where it has none."""
        if not len(self):
            return np.full(len(keys), -1, dtype=np.intp)
        positions: npt.NDArray[np.intp] = pd.Index(self.keys).get_indexer(pd.Index(keys))
        return positions

    def upserted(self, newer: KeyedColumns) -> KeyedColumns:
        """These rows with ``newer``'s: a key in both takes ``newer``'s row, which comes after
        the rows kept; both must hold the same columns (unless one of them has no rows)."""
        if not len(newer):
            return self
        if not len(self):
            return newer
        if self.columns.keys() != newer.columns.keys():
            raise ValueError(
                f"rows with columns {sorted(newer.columns)} cannot join rows with columns "
                f"{sorted(self.columns)}"
            )
        at = self.positions_of(newer.keys)
        kept = self.without(at[at >= 0])
        return KeyedColumns(
            np.concatenate([kept.keys, newer.keys]),
            {
                name: np.concatenate([values, newer.columns[name]])
                for name, values in kept.columns.items()
            },
        )

    def astype(self, dtypes: Mapping[str, Any]) -> KeyedColumns:
        """The columns ``dtypes`` names cast to their types (the others as they are)."""
        return KeyedColumns(
            self.keys,
            {
                name: values.astype(dtypes[name], copy=False) if name in dtypes else values
                for name, values in self.columns.items()
            },
        )

    def frame(self) -> pd.DataFrame:
        """The rows as a frame indexed by key."""
        return pd.DataFrame(self.columns, index=pd.Index(self.keys, dtype=object))

    # ------------------------------------------------------------------ encoding
    def encode(self, metadata: dict[bytes, bytes]) -> bytes:
        """The rows with ``metadata`` (its ``b"format"`` among it), keys last."""
        arrays = [*map(pa.array, self.columns.values()), pa.array(self.keys, pa.string())]
        table = pa.Table.from_arrays(arrays, names=[*self.columns, _KEY], metadata=metadata)
        sink = pa.BufferOutputStream()
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
            writer.write_table(table)
        return bytes(sink.getvalue().to_pybytes())

    @classmethod
    def decode(
        cls, data: bytes, expected_format: bytes, what: str, error: type[ValueError]
    ) -> tuple[KeyedColumns, dict[bytes, bytes]]:
        """The rows and metadata :meth:`encode` made (or ``pa.Table.from_pandas`` of a frame
        indexed by key, as states before this layout hold); raises ``error`` naming ``what``
        for bytes that are not one, or of another format."""
        try:
            table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
        except (pa.ArrowInvalid, OSError) as exc:
            raise error(f"not encoded {what}: {exc}") from None
        metadata = dict(table.schema.metadata or {})
        if metadata.get(b"format") != expected_format:
            raise error(f"unsupported {what} format {metadata.get(b'format')!r}")
        if _KEY not in table.column_names:
            raise error(f"not encoded {what}: no {_KEY!r} column")
        columns = {name: _numpy(table.column(name)) for name in table.column_names if name != _KEY}
        return cls(_numpy(table.column(_KEY)), columns), metadata


def _numpy(column: pa.ChunkedArray) -> npt.NDArray[Any]:
    """A column as numpy: strings as objects; an all-null column (what ``from_pandas`` makes
    of an empty object column) as objects too."""
    if pa.types.is_null(column.type):
        return np.full(len(column), None, dtype=object)
    values: npt.NDArray[Any] = column.to_numpy()
    return values
