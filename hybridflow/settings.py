"""The pieces every part of the pipeline file's model is made of: sections that refuse unknown keys,
GPU modes, free mappings. Engines declare their `backends.<engine>` settings with these, in their
own backend module (see backends.Engine); spec.py builds the whole file's model from them."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


class Section(BaseModel):
    # Unknown keys are errors: a misspelt key silently ignored is the worst kind of bug.
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def gpu_mode(value: Any) -> bool | str:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() == "auto":
        return "auto"
    raise ValueError(f"must be true, false or auto, not {value!r}")


def none_as_empty(empty):
    """An empty YAML section (`params:` with nothing under it) means 'none', not an error."""
    return BeforeValidator(lambda v: empty() if v is None else v)


GpuMode = Annotated[bool | Literal["auto"], BeforeValidator(gpu_mode)]
Params = Annotated[dict[str, Any], none_as_empty(dict)]
Names = Annotated[list[str], none_as_empty(list)]


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def byte_count(value: int | str) -> int:
    """'128MB', '512MiB', 1000000 -> bytes (the spellings dask and RMM accept)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"'{value}' is not a size in bytes (write e.g. 128MB, 512MiB or a number of bytes)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


ByteSize = Annotated[int, BeforeValidator(byte_count)]
TARGET_FILE_SIZE = 128 * 10**6  # bytes of Parquet per file, when neither a dataset nor its engine says


class EngineSection(Section):
    """What every engine's `backends.<engine>` section has, besides its own settings."""

    target_file_size: ByteSize | None = Field(
        None, gt=0, description="bytes of Parquet per output file for this engine's stages (default 128MB)")
