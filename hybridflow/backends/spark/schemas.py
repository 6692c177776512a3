"""Arrow schemas as Spark sees them: what Spark cannot hold (refused, naming the column, before it
misreads it), and column names quoted so Spark takes them literally."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ...errors import DataError
from ..framerules import case_collisions

if TYPE_CHECKING:  # imported where used: validate and a skipped run never load it
    import pyarrow as pa


def quoted(name: str) -> str:
    """`name` as a Spark column reference to exactly that column: Spark parses a string column as an
    expression (col.with.dot is field with.dot of col; a space, a bracket or a backtick is a syntax
    error), so it is backtick-quoted, backticks inside doubled."""
    return "`" + name.replace("`", "``") + "`"


def columns(names: Sequence[str]) -> list[str]:
    return [quoted(name) for name in names]


def check_representable(dataset: str, schema: pa.Schema) -> None:
    """Refuse, naming the column, what Spark would misread instead of letting it corrupt data."""
    problems = unrepresentable(schema)
    if problems:
        raise DataError(f"dataset '{dataset}', {problems[0]}",
                        hint="cast or rename it in the stage (or the tool) that produces it")


def unrepresentable(schema: pa.Schema) -> list[str]:
    """What of a schema Spark cannot hold, a phrase per problem (validate warns with these too)."""
    import pyarrow as pa

    problems = [f"column '{f.name}': Spark has no {f.type} type" for f in schema
                if pa.types.is_unsigned_integer(f.type) or pa.types.is_float16(f.type)]
    clashes = case_collisions(schema.names)
    if clashes:
        problems.append(f"columns {', '.join(clashes)} differ only by case, which Spark cannot read")
    return problems
