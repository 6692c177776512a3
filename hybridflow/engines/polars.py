"""How hybridflow knows Polars, in-process and streaming, before starting it: its settings
(backends.polars in the pipeline file), the stage `hybridflow init` writes for it, and its Engine
declaration. Light to import: the backend, hybridflow.backends.polars, is imported when a run creates one."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field

from ..settings import ByteSize, EngineSection, GpuMode
from . import Engine

if TYPE_CHECKING:  # imported where used: validate and a skipped run never load it
    import pyarrow as pa


class PolarsSettings(EngineSection):
    memory_limit: ByteSize | None = Field(
        None, gt=0, description="what Polars' streaming engine holds in memory before it spills to disk "
                                "(e.g. 8GB); default: half of this machine's memory")
    spill_directory: Path | None = Field(
        None, description="where it spills; default: a private directory under the run's logs, removed "
                          "when the engine stops")
    gpu: GpuMode = Field(False, description="the default GPU mode of polars stages (cudf-polars)")


# the stage `hybridflow init` writes for this engine ({input}: the dataset it reads)
EXAMPLE_STAGE = '''"""Shares on Polars: a LazyFrame in and out (run, streaming, when hybridflow writes it)."""

import polars as pl


def shares({input}: pl.LazyFrame) -> pl.LazyFrame:
    """Each event's share of its customer's total amount."""
    return {input}.with_columns(share=pl.col("amount") / pl.col("amount").sum().over("customer_id"))
'''


def unrepresentable(schema: pa.Schema) -> list[str]:
    """What of an Arrow schema Polars cannot read and write back as the same type, a phrase per column."""
    return [f"column '{field.name}': {problem}" for field in schema
            if (problem := _type_problem(field.type, nested=False)) is not None]


def _type_problem(arrow_type: pa.DataType, nested: bool) -> str | None:
    import pyarrow as pa

    if pa.types.is_decimal(arrow_type) and arrow_type.precision > 38:
        return f"Polars decimals hold at most 38 digits, not {arrow_type.precision}"
    if pa.types.is_date64(arrow_type) or pa.types.is_time32(arrow_type):
        return f"Polars has no {arrow_type} type (it would be written back as another)"
    if nested and pa.types.is_fixed_size_binary(arrow_type):
        return "Polars reads a fixed-size binary inside a list or struct as binary"
    children = [arrow_type.field(i).type for i in range(arrow_type.num_fields)] if pa.types.is_nested(arrow_type) \
        else []
    return next((problem for child in children if (problem := _type_problem(child, nested=True)) is not None), None)



def storage_options(store) -> dict[str, str]:
    """Polars' storage_options for a store's settings (its object_store client reads most of each
    cloud's variables itself); {} for a store it needs nothing more for."""
    return {"s3": _s3_options, "gs": _gcs_options, "az": _azure_options}.get(store.scheme, lambda store: {})(store)


def _s3_options(store) -> dict[str, str]:
    options = {}
    if store.endpoint:
        options["aws_endpoint_url"] = store.endpoint
        options["aws_allow_http"] = str(store.plain_http).lower()
    if store.region:
        options["aws_region"] = store.region
    if store.path_style is not None:
        options["aws_virtual_hosted_style_request"] = str(not store.path_style).lower()
    return options


def _gcs_options(store) -> dict[str, str]:
    """None for GCS itself (object_store reads Google's variables); for an emulator, a service account
    naming its URL with OAuth off (object_store's own way to reach one: the document holds no secret)."""
    if not store.endpoint:
        return {}
    import json

    account = {"gcs_base_url": store.endpoint, "disable_oauth": True, "client_email": "", "private_key": "",
               "private_key_id": ""}
    return {"google_service_account_key": json.dumps(account)}


def _azure_options(store) -> dict[str, str]:
    """object_store reads neither AZURE_STORAGE_KEY nor a connection string, so the account and key are
    handed over here, in this process only (never recorded)."""
    credential = store.credential()
    secret = "azure_storage_account_key" if credential.kind == "key" else "azure_storage_sas_key"
    options = {"azure_storage_account_name": store.account or "", secret: credential.secret}
    if store.endpoint:
        options.update(azure_storage_endpoint=store.endpoint,
                       azure_allow_http=str(store.endpoint.startswith("http://")).lower())
    return options


ENGINE = Engine(
    name="polars", module="hybridflow.backends.polars", example=(EXAMPLE_STAGE, "shares"),
    settings=PolarsSettings, description="Polars: in-process, streaming",
    frame_types="polars LazyFrames or DataFrames", requires=("polars",), extra="polars",
    distributions=("polars",),
    gpu=True, gpu_packages=("cudf_polars",), unrepresentable=unrepresentable,
    undecodable=(r"parquet: File out of specification",),  # a thrift header, a dictionary index
)
