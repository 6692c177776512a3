"""Arrow tables as the pandas frames stages get, and back, without changing a value.

Stages get the dtypes a pandas user expects wherever they hold the values exactly, because every
pandas operation works on them (`ArrowDtype` integers, for one, have no `%`):

- integers and booleans: numpy `int64`, `bool`, ... without nulls; pandas' `Int64`, `boolean`, ...
  with nulls;
- floats: numpy `float64`/`float32`, null read as NaN (what `pd.read_parquet` gives, and what
  `np.where` and friends work on); a column that holds NaN values keeps `ArrowDtype`, the only
  dtype that keeps NaN apart from a missing value (Dask decides from the footers, which do not
  count NaN: there a NaN value is read as missing);
- timestamps and durations: numpy `datetime64[unit, zone]` and `timedelta64[unit]` (null is NaT);
- strings: pandas' `str` dtype (null is NaN);
- everything else (decimals, dates, times, binary, lists, structs, maps, half floats): `ArrowDtype`.

Going back, pandas' own rule applies: NaN in a numpy float column is a missing value and is written
as null, as `DataFrame.to_parquet` does.
"""

from __future__ import annotations

from typing import Callable, Collection

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ..data.tables import standard_types
from ..errors import DataError

_NULLABLE = {pa.int8(): "Int8", pa.int16(): "Int16", pa.int32(): "Int32", pa.int64(): "Int64",
             pa.uint8(): "UInt8", pa.uint16(): "UInt16", pa.uint32(): "UInt32", pa.uint64(): "UInt64",
             pa.bool_(): "boolean"}
NUMPY, NULLABLE, ARROW = "numpy", "nullable", "arrow"
STRING = pd.StringDtype("pyarrow", na_value=np.nan)  # pandas' default `str` dtype


def dtype_kind(arrow_type: pa.DataType, has_nulls: bool, has_nan: bool = False) -> str:
    """Which family of pandas dtype holds a column of this type exactly."""
    if pa.types.is_integer(arrow_type) or pa.types.is_boolean(arrow_type):
        return NULLABLE if has_nulls else NUMPY
    if arrow_type in (pa.float32(), pa.float64()):
        return ARROW if has_nan else NUMPY
    if (pa.types.is_timestamp(arrow_type) or pa.types.is_duration(arrow_type) or pa.types.is_string(arrow_type)
            or pa.types.is_large_string(arrow_type) or pa.types.is_string_view(arrow_type)):
        return NUMPY  # pandas' own dtypes: null is NaT or NaN, never a value these hold
    if pa.types.is_dictionary(arrow_type):
        return NUMPY  # a pandas Categorical
    return ARROW


def _numpy_mapper(arrow_type: pa.DataType):
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_string_view(arrow_type):
        return STRING
    return None  # pyarrow's default: numpy dtypes, Categorical for dictionaries


def _nullable_mapper(arrow_type: pa.DataType):
    return pd.api.types.pandas_dtype(_NULLABLE[arrow_type])


def to_pandas(table: pa.Table, kinds: list[str] | None = None) -> pd.DataFrame:
    """A table as a pandas frame of the dtypes above; `kinds` (one per column) as decided from the
    data itself by default."""
    kinds = kinds or table_kinds(table)
    table = table.replace_schema_metadata(None)  # pandas metadata from other writers would override the rules
    groups: dict[str, list[int]] = {NUMPY: [], NULLABLE: [], ARROW: []}
    for position, kind in enumerate(kinds):
        groups[kind].append(position)
    mappers: dict[str, Callable] = {NUMPY: _numpy_mapper, NULLABLE: _nullable_mapper, ARROW: pd.ArrowDtype}
    parts = []
    for kind, positions in groups.items():
        if positions:
            part = table.select(positions).to_pandas(types_mapper=mappers[kind], coerce_temporal_nanoseconds=False)
            part.columns = positions
            parts.append(part)
    if not parts:
        return pd.DataFrame(index=pd.RangeIndex(table.num_rows))
    frame = parts[0] if len(parts) == 1 else pd.concat(parts, axis=1)
    frame = frame[sorted(frame.columns)] if len(parts) > 1 else frame
    frame.columns = table.column_names
    return frame


def table_kinds(table: pa.Table) -> list[str]:
    """Each column's dtype family, from the data: its null count, and NaN values for floats."""
    kinds = []
    for field, column in zip(table.schema, table.columns):
        has_nan = pa.types.is_floating(field.type) and _has_nan(column)
        kinds.append(dtype_kind(field.type, column.null_count > 0, has_nan))
    return kinds


def _has_nan(column: pa.ChunkedArray) -> bool:
    return bool(pc.any(pc.is_nan(column)).as_py())


def schema_kinds(schema: pa.Schema, nullable: Collection[str]) -> list[str]:
    """Each column's dtype family from what the footers say: whether a column may hold nulls."""
    return [dtype_kind(f.type, f.name in nullable) for f in schema]


def empty_frame(schema: pa.Schema, nullable: Collection[str]) -> pd.DataFrame:
    """The zero-row frame that describes what to_pandas makes of such columns (Dask's meta)."""
    return to_pandas(schema.empty_table(), schema_kinds(schema, nullable))


def to_arrow(frame: pd.DataFrame) -> pa.Table:
    """A pandas frame as an Arrow table of standard types (pandas' `str` becomes string, not
    large_string); an index is dropped or kept by the rule every engine shares."""
    from .framerules import index_as_columns

    frame = index_as_columns(frame)
    duplicated = frame.columns[frame.columns.duplicated()].tolist()
    if duplicated:
        raise DataError(f"the frame has duplicate column names: {', '.join(map(str, duplicated))}")
    try:
        table = pa.Table.from_pandas(frame, preserve_index=False)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise DataError(f"cannot convert the frame to Arrow: {exc}",
                        hint="give every column one consistent type") from exc
    return standard_types(table.replace_schema_metadata(None))
