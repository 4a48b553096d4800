"""The keyed numpy tables a shard keeps (pending throttles, written decisions): upserts behave
as a dict's updates, and the encoded form round-trips, including the form states kept before
these tables were numpy columns (a frame by ``pa.Table.from_pandas``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from state.keyed_table import KeyedColumns

FORMAT = b"test.keyed.1"
Rows = dict[str, tuple[int, float, str | None]]
KEYS = st.sampled_from([f"produce:user=u{i},broker=1" for i in range(8)])


class NotKeyedError(ValueError):
    pass


def table(rows: Rows) -> KeyedColumns:
    return KeyedColumns(
        np.array(list(rows), dtype=object),
        {
            "until": np.array([until for until, _, _ in rows.values()], dtype=np.int64),
            "limit": np.array([limit for _, limit, _ in rows.values()], dtype=np.float64),
            "mode": np.array([mode for _, _, mode in rows.values()], dtype=object),
        },
    )


def as_dict(keyed: KeyedColumns) -> Rows:
    values = zip(
        keyed["until"].tolist(), keyed["limit"].tolist(), keyed["mode"].tolist(), strict=True
    )
    return dict(zip(keyed.keys.tolist(), values, strict=True))


ROWS = st.dictionaries(
    KEYS,
    st.tuples(
        st.integers(0, 2**62),
        st.sampled_from([1000.0, 0.0, float("nan")]),
        st.sampled_from(["enforced", "shadow", None]),
    ),
)


def same(a: Rows, b: Rows) -> None:
    """Equal, NaN equal to NaN."""
    assert a.keys() == b.keys()
    for key, (until, limit, mode) in a.items():
        other = b[key]
        assert (until, mode) == (other[0], other[2])
        assert limit == other[1] or (np.isnan(limit) and np.isnan(other[1]))


@given(ROWS, ROWS)
def test_upserting_is_a_dict_update_with_newer_rows_last(older: Rows, newer: Rows) -> None:
    merged = table(older).upserted(table(newer))
    same(as_dict(merged), older | newer)
    assert merged.keys.tolist()[len(merged) - len(newer) :] == list(newer)
    at = merged.positions_of(pd.Index([*older, "absent"]))
    assert at[-1] == -1
    assert all(merged.keys[p] == key for p, key in zip(at[:-1], older, strict=True))


@given(ROWS)
def test_the_encoded_form_round_trips(rows: Rows) -> None:
    keyed = table(rows)
    decoded, metadata = KeyedColumns.decode(
        keyed.encode({b"format": FORMAT, b"x": b"1"}), FORMAT, "test rows", NotKeyedError
    )
    assert metadata == {b"format": FORMAT, b"x": b"1"}
    same(as_dict(decoded), rows)
    assert decoded.keys.dtype == object
    assert {name: values.dtype for name, values in decoded.columns.items()} == {
        name: values.dtype for name, values in keyed.columns.items()
    }


@pytest.mark.parametrize("rows", [{}, {"produce:a": (7, float("nan"), "shadow")}])
def test_the_form_kept_before_numpy_columns_decodes_alike(
    rows: Rows,
) -> None:
    frame = table(rows).frame().rename_axis("key")
    earlier = pa.Table.from_pandas(frame, preserve_index=True).replace_schema_metadata(
        {b"format": FORMAT}
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, earlier.schema) as writer:
        writer.write_table(earlier)
    decoded, _ = KeyedColumns.decode(
        sink.getvalue().to_pybytes(), FORMAT, "test rows", NotKeyedError
    )
    same(as_dict(decoded), rows)
    if not rows:  # an empty object column was written as Arrow's null type
        assert decoded.keys.dtype == object
        assert decoded["mode"].dtype == object


def test_other_bytes_and_formats_are_refused_by_name() -> None:
    with pytest.raises(NotKeyedError, match="not encoded test rows"):
        KeyedColumns.decode(b"garbage", FORMAT, "test rows", NotKeyedError)
    other = table({}).encode({b"format": b"other.1"})
    with pytest.raises(NotKeyedError, match=r"unsupported test rows format b'other\.1'"):
        KeyedColumns.decode(other, FORMAT, "test rows", NotKeyedError)


def test_rows_of_other_columns_do_not_join() -> None:
    rows = table({"produce:a": (1, 1.0, None)})
    with pytest.raises(ValueError, match=r"columns \['limit', 'mode'\]"):
        rows.upserted(rows.without_column("until").with_column("mode", np.array(["x"], object)))
