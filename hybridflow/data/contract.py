"""Schema contracts: a dataset's declared column types checked against what was written, and the column
names that differ only by case, which some engines cannot tell apart."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import DataError
from .arrow_types import parse_arrow_type, type_name

if TYPE_CHECKING:  # imported where used: validate and a skipped run never load it
    import pyarrow as pa


def declared_schema(columns: dict[str, str] | None) -> dict[str, pa.DataType] | None:
    return {name: parse_arrow_type(text) for name, text in columns.items()} if columns else None


def normalize(arrow_type: pa.DataType) -> pa.DataType:
    """Collapse differences that do not change values: large/small strings, binaries and lists,
    dictionary encoding (what Dask and pandas read back differs from what Spark and Ray do)."""
    import pyarrow as pa

    if pa.types.is_dictionary(arrow_type):
        return normalize(arrow_type.value_type)
    if pa.types.is_large_string(arrow_type) or pa.types.is_string_view(arrow_type):
        return pa.string()
    if pa.types.is_large_binary(arrow_type) or pa.types.is_binary_view(arrow_type):
        return pa.binary()
    if pa.types.is_large_list(arrow_type) or pa.types.is_list_view(arrow_type) or pa.types.is_list(arrow_type):
        return pa.list_(normalize(arrow_type.value_type))
    if pa.types.is_struct(arrow_type):
        return pa.struct([pa.field(f.name, normalize(f.type)) for f in arrow_type])
    if pa.types.is_map(arrow_type):
        return pa.map_(normalize(arrow_type.key_type), normalize(arrow_type.item_type))
    if pa.types.is_timestamp(arrow_type) and arrow_type.tz and arrow_type.tz.upper() in ("UTC", "+00:00", "Z"):
        return pa.timestamp(arrow_type.unit, "UTC")
    return arrow_type


def standard_schema(schema: pa.Schema) -> pa.Schema:
    """The schema with each type's physical variant (string_view, large_string, large_list,
    dictionary encoding, ...) as its standard type: the same values, in the form every engine holds."""
    import pyarrow as pa

    return pa.schema([pa.field(f.name, normalize(f.type), f.nullable) for f in schema], metadata=schema.metadata)


def schema_differences(declared: dict[str, pa.DataType], actual: pa.Schema) -> list[str]:
    """Each way `actual` breaks the declared schema, in words; empty when it conforms."""
    found = {f.name: f.type for f in actual}
    problems = []
    for column, expected in declared.items():
        if column not in found:
            problems.append(f"column '{column}' is missing (expected {type_name(expected)})")
        elif normalize(found[column]) != normalize(expected):
            problems.append(f"column '{column}': expected {type_name(expected)}, got {type_name(found[column])}")
    for column in found:
        if column not in declared:
            problems.append(f"column '{column}' ({type_name(found[column])}) is not in the declared schema")
    return problems


def check_schema(dataset: str, declared: dict[str, pa.DataType] | None, actual: pa.Schema) -> None:
    if declared is None:
        return
    differences = schema_differences(declared, actual)
    if differences:
        raise DataError(f"dataset '{dataset}' does not match its declared schema: {'; '.join(differences)}",
                        hint="fix the stage's output or the schema in the pipeline file")


def schema_to_dict(schema: pa.Schema) -> dict[str, str]:
    return {f.name: type_name(f.type) for f in schema}


def case_collisions(names: list[str]) -> list[str]:
    """Column names that differ only by case: Spark refuses them, other engines do not."""
    seen: dict[str, str] = {}
    clashes = []
    for name in names:
        other = seen.setdefault(name.lower(), name)
        if other != name:
            clashes.append(f"'{other}' and '{name}'")
    return clashes
