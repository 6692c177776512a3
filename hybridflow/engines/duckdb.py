"""How hybridflow knows DuckDB, an in-process SQL engine, before starting it: its settings
(backends.duckdb in the pipeline file), the stage `hybridflow init` writes for it, and its Engine
declaration. Light to import: the backend, hybridflow.backends.duckdb, is imported when a run creates one."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field

from ..data.contract import case_collisions
from ..settings import ByteSize, EngineSection
from . import Engine

if TYPE_CHECKING:  # imported where used: validate and a skipped run never load it
    import pyarrow as pa


class DuckDBSettings(EngineSection):
    memory_limit: ByteSize | None = Field(
        None, gt=0, description="DuckDB's memory limit (e.g. 8GB); default: 75% of this machine's memory")
    threads: int | None = Field(None, ge=1, description="DuckDB's threads; default: the CPUs this process may use")
    temp_directory: Path | None = Field(
        None, description="where DuckDB spills what does not fit in memory; default: a private directory under "
                          "the run's logs, removed when the engine stops")


# the stage `hybridflow init` writes for this engine ({input}: the dataset it reads)
EXAMPLE_STAGE = '''"""Totals on DuckDB: a duckdb relation in, a relation out (run when hybridflow writes it)."""

import duckdb


def totals({input}: duckdb.DuckDBPyRelation) -> duckdb.DuckDBPyRelation:
    """Each event with its customer's total spend: its columns kept, so any stage can come after it."""
    return {input}.project("*, sum(amount) OVER (PARTITION BY customer_id) AS customer_spend")
'''


def unrepresentable(schema: pa.Schema) -> list[str]:
    """What of a schema DuckDB cannot hold and write back as the same Arrow type, a phrase per problem."""
    problems = [f"column '{field.name}': {problem}" for field in schema
                if (problem := _type_problem(field.type)) is not None]
    clashes = case_collisions(schema.names)
    if clashes:
        problems.append(f"columns {', '.join(clashes)} differ only by case, which DuckDB cannot tell apart")
    return problems


def _type_problem(arrow_type: pa.DataType) -> str | None:
    import pyarrow as pa

    if pa.types.is_float16(arrow_type) or pa.types.is_duration(arrow_type):
        return f"DuckDB has no {arrow_type} type"
    if pa.types.is_interval(arrow_type):
        return f"DuckDB writes no Parquet type that holds a {arrow_type}"
    if pa.types.is_decimal(arrow_type) and arrow_type.precision > 38:
        return f"DuckDB decimals hold at most 38 digits, not {arrow_type.precision}"
    children = [arrow_type.field(i).type for i in range(arrow_type.num_fields)] if pa.types.is_nested(arrow_type) \
        else []
    return next((problem for child in children if (problem := _type_problem(child)) is not None), None)


ENGINE = Engine(
    name="duckdb", module="hybridflow.backends.duckdb", example=(EXAMPLE_STAGE, "totals"),
    settings=DuckDBSettings, description="DuckDB: an in-process SQL engine",
    frame_types="duckdb relations, pyarrow Tables or pandas DataFrames", requires=("duckdb",), extra="duckdb",
    distributions=("duckdb",),
    sql_dialect="duckdb", unrepresentable=unrepresentable,
    undecodable=(r"Parquet file is likely corrupted", r"don't know what type"),  # a page, a thrift header
)
